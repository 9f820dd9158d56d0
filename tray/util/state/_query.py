"""A listing's query: checking its filters and limit, and finishing its
answer (filter, cut at the limit with a warning, blank the detail-only
fields unless ``detail=True``).
"""

from __future__ import annotations

import dataclasses
import warnings

DEFAULT_LIMIT = 100
_PREDICATES = ("=", "!=")
# Keys whose values are Ray enum names: compared case-insensitively.
_ENUM_KEYS = {"state", "type", "reference_type", "task_status", "worker_type", "status",
              "error_type", "strategy"}


def check_query(cls, filters, limit) -> list:
    if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool)
                              or limit <= 0):
        raise ValueError(f"limit must be a positive integer, got {limit!r}")
    known = [f.name for f in dataclasses.fields(cls)]
    checked = []
    for item in filters or []:
        if not isinstance(item, (tuple, list)) or len(item) != 3:
            raise ValueError(f"a filter is a (key, predicate, value) tuple, got {item!r}")
        key, predicate, value = item
        if key not in known:
            raise ValueError(f"unknown filter key {key!r} for {cls.__name__}; the keys are: "
                             f"{', '.join(known)}")
        if predicate not in _PREDICATES:
            raise ValueError(f"unsupported filter predicate {predicate!r}; use one of "
                             f"{', '.join(repr(p) for p in _PREDICATES)}")
        checked.append((key, predicate, value))
    return checked


def normal(key: str, value) -> str:
    text = "" if value is None else str(value)
    if isinstance(value, bool):
        text = text.lower()
    return text.upper() if key in _ENUM_KEYS else text


def _matches(record, filters: list) -> bool:
    for key, predicate, value in filters:
        equal = normal(key, getattr(record, key)) == normal(key, value)
        if equal != (predicate == "="):
            return False
    return True


def finish(cls, records: list, filters: list, limit: int | None, detail: bool,
            what: str) -> list:
    chosen = [record for record in records if _matches(record, filters)]
    limit = DEFAULT_LIMIT if limit is None else limit
    if len(chosen) > limit:
        warnings.warn(f"{len(chosen)} {what} match, showing {limit} (pass limit= to see more)",
                      stacklevel=3)
        chosen = chosen[:limit]
    if not detail:
        hidden = [f.name for f in dataclasses.fields(cls) if f.metadata.get("detail")]
        for record in chosen:
            for name in hidden:
                setattr(record, name, None)
    return chosen
