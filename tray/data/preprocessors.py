"""Preprocessors (Ray's ``ray.data.preprocessors``): fit statistics on a
dataset in one distributed pass, then transform datasets lazily or a
single batch eagerly (what a serving replica does with a fitted one).

Statistics come from ``column_stats``: a task per block computes partial
counts, sums, Chan's mean/M2 pairs, minima, maxima and value counts, and
the driver merges those small partials; no block ever comes to the driver.
"""

from __future__ import annotations

import numpy as np

from . import _block as B
from ._column_stats import column_stats
from ._dataset import Dataset


class PreprocessorNotFittedException(RuntimeError):
    """transform() before fit() on a preprocessor that needs statistics."""


class Preprocessor:
    _is_fittable = True

    def __init__(self) -> None:
        self.stats_: dict | None = None

    def fit(self, ds: Dataset) -> Preprocessor:
        if not isinstance(ds, Dataset):
            raise TypeError(f"fit takes a Dataset, got {type(ds).__name__}")
        if self._is_fittable:
            self.stats_ = self._fit(ds)
        return self

    def fit_transform(self, ds: Dataset) -> Dataset:
        return self.fit(ds).transform(ds)

    def _check_fitted(self) -> None:
        if self._is_fittable and self.stats_ is None:
            raise PreprocessorNotFittedException(
                f"{type(self).__name__} must be fitted first: call fit(dataset)")

    def transform(self, ds: Dataset) -> Dataset:
        if not isinstance(ds, Dataset):
            raise TypeError(f"transform takes a Dataset, got {type(ds).__name__}")
        self._check_fitted()
        return ds.map_batches(self._transform_pandas, batch_format="pandas")

    def transform_batch(self, batch):
        """Transform one batch (a pandas DataFrame or a dict of arrays);
        returns the same kind."""
        self._check_fitted()
        pd = B._pandas()
        if isinstance(batch, pd.DataFrame):
            return self._transform_pandas(batch.copy())
        if isinstance(batch, dict):
            frame = B.block_to_pandas(B.batch_to_block(batch, "transform_batch"))
            return B.block_to_batch(B.pandas_to_block(self._transform_pandas(frame)), "numpy")
        raise TypeError(f"transform_batch takes a pandas DataFrame or a dict of NumPy arrays, "
                        f"got {type(batch).__name__}")

    def _fit(self, ds: Dataset) -> dict:
        raise NotImplementedError

    def _transform_pandas(self, frame):
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}({getattr(self, 'columns', '')!r})"


def _columns(columns, what: str) -> list[str]:
    columns = [columns] if isinstance(columns, str) else list(columns or [])
    if not columns or not all(isinstance(c, str) for c in columns):
        raise ValueError(f"{what}: columns must be a non-empty list of column names, "
                         f"got {columns!r}")
    return columns


def _require(frame, columns: list, what: str) -> None:
    missing = [c for c in columns if c not in frame.columns]
    if missing:
        raise ValueError(f"{what}: the batch has no column(s) {missing}; it has "
                         f"{list(frame.columns)}")


class StandardScaler(Preprocessor):
    """(x - mean) / std, with the population std (ddof=0) as Ray; a constant
    column becomes 0."""

    def __init__(self, columns) -> None:
        super().__init__()
        self.columns = _columns(columns, "StandardScaler")

    def _fit(self, ds):
        stats = column_stats(ds, self.columns)
        out = {}
        for c in self.columns:
            entry = stats[c]
            out[f"mean({c})"] = entry["mean"]
            out[f"std({c})"] = float(np.sqrt(entry["m2"] / entry["count"])) \
                if entry.get("count") else None
        return out

    def _transform_pandas(self, frame):
        _require(frame, self.columns, "StandardScaler")
        for c in self.columns:
            mean, std = self.stats_[f"mean({c})"], self.stats_[f"std({c})"]
            if mean is None:
                continue
            frame[c] = (frame[c] - mean) / std if std else frame[c] * 0.0
        return frame


class MinMaxScaler(Preprocessor):
    """(x - min) / (max - min); a constant column becomes 0."""

    def __init__(self, columns) -> None:
        super().__init__()
        self.columns = _columns(columns, "MinMaxScaler")

    def _fit(self, ds):
        stats = column_stats(ds, self.columns)
        out = {}
        for c in self.columns:
            out[f"min({c})"] = stats[c]["min"]
            out[f"max({c})"] = stats[c]["max"]
        return out

    def _transform_pandas(self, frame):
        _require(frame, self.columns, "MinMaxScaler")
        for c in self.columns:
            low, high = self.stats_[f"min({c})"], self.stats_[f"max({c})"]
            if low is None:
                continue
            span = high - low
            frame[c] = (frame[c] - low) / span if span else frame[c] * 0.0
        return frame


def _unique_index(stats: dict, column: str) -> dict:
    counts = stats[column].get("counts")
    if counts is None:
        raise ValueError(f"column {column!r} has too many distinct values to encode")
    values = sorted((v for v in counts if v is not None), key=lambda v: (str(type(v)), v))
    return {value: index for index, value in enumerate(values)}


class OneHotEncoder(Preprocessor):
    """Each column becomes a list of 0/1, one per category seen in fit
    (sorted); an unseen value is all zeros (Ray 2.x's layout)."""

    def __init__(self, columns, *, max_categories: dict | None = None) -> None:
        super().__init__()
        self.columns = _columns(columns, "OneHotEncoder")
        self.max_categories = dict(max_categories or {})

    def _fit(self, ds):
        stats = column_stats(ds, self.columns)
        out = {}
        for c in self.columns:
            index = _unique_index(stats, c)
            limit = self.max_categories.get(c)
            if limit is not None:
                counts = stats[c]["counts"]
                top = sorted(index, key=lambda v: (-counts[v], index[v]))[:limit]
                index = {v: i for i, v in enumerate(sorted(top, key=lambda v: index[v]))}
            out[f"unique_values({c})"] = index
        return out

    def _transform_pandas(self, frame):
        _require(frame, self.columns, "OneHotEncoder")
        for c in self.columns:
            index = self.stats_[f"unique_values({c})"]
            size = len(index)

            def encode(value, index=index, size=size):
                vector = np.zeros(size, dtype=np.int64)
                position = index.get(value.item() if isinstance(value, np.generic) else value)
                if position is not None:
                    vector[position] = 1
                return vector

            frame[c] = [encode(v) for v in frame[c]]
        return frame


class LabelEncoder(Preprocessor):
    """The label column's values as integers 0..n-1, in sorted order."""

    def __init__(self, label_column: str) -> None:
        super().__init__()
        if not isinstance(label_column, str):
            raise ValueError(f"LabelEncoder: label_column must be a column name, "
                             f"got {label_column!r}")
        self.label_column = label_column
        self.columns = [label_column]

    def _fit(self, ds):
        stats = column_stats(ds, [self.label_column])
        return {f"unique_values({self.label_column})": _unique_index(stats, self.label_column)}

    def _transform_pandas(self, frame):
        _require(frame, [self.label_column], "LabelEncoder")
        index = self.stats_[f"unique_values({self.label_column})"]
        frame[self.label_column] = [
            index.get(v.item() if isinstance(v, np.generic) else v) for v in
            frame[self.label_column]]
        return frame

    def inverse_transform(self, ds: Dataset) -> Dataset:
        self._check_fitted()
        values = {i: v for v, i in self.stats_[f"unique_values({self.label_column})"].items()}
        column = self.label_column

        def invert(frame):
            frame[column] = [values.get(int(i)) for i in frame[column]]
            return frame

        return ds.map_batches(invert, batch_format="pandas")


class SimpleImputer(Preprocessor):
    """Fill missing values with the column's mean, most frequent value, or
    a constant."""

    STRATEGIES = ("mean", "most_frequent", "constant")

    def __init__(self, columns, strategy: str = "mean", *, fill_value=None) -> None:
        super().__init__()
        self.columns = _columns(columns, "SimpleImputer")
        if strategy not in self.STRATEGIES:
            raise ValueError(f"SimpleImputer: strategy must be one of {self.STRATEGIES}, "
                             f"got {strategy!r}")
        if strategy == "constant" and fill_value is None:
            raise ValueError("SimpleImputer: strategy='constant' needs a fill_value")
        self.strategy = strategy
        self.fill_value = fill_value
        self._is_fittable = strategy != "constant"

    def _fit(self, ds):
        stats = column_stats(ds, self.columns)
        out = {}
        for c in self.columns:
            if self.strategy == "mean":
                out[f"mean({c})"] = stats[c]["mean"]
            else:
                counts = stats[c].get("counts") or {}
                best = sorted(counts.items(), key=lambda kv: (-kv[1], str(kv[0])))
                out[f"most_frequent({c})"] = best[0][0] if best else None
        return out

    def _transform_pandas(self, frame):
        _require(frame, self.columns, "SimpleImputer")
        for c in self.columns:
            if self.strategy == "constant":
                value = self.fill_value
            else:
                value = self.stats_[f"{self.strategy}({c})"]
            if value is not None:
                frame[c] = frame[c].fillna(value)
        return frame


class Concatenator(Preprocessor):
    """Columns into one tensor column (``output_column_name``), dropping
    them."""

    _is_fittable = False

    def __init__(self, columns, output_column_name: str = "concat_out", dtype=None,
                 raise_if_missing: bool = False) -> None:
        super().__init__()
        self.columns = _columns(columns, "Concatenator")
        self.output_column_name = output_column_name
        self.dtype = dtype
        self.raise_if_missing = raise_if_missing

    def _transform_pandas(self, frame):
        missing = [c for c in self.columns if c not in frame.columns]
        if missing and self.raise_if_missing:
            raise ValueError(f"Concatenator: the batch has no column(s) {missing}")
        present = [c for c in self.columns if c in frame.columns]
        parts = []
        for c in present:
            values = frame[c].to_numpy()
            if values.dtype == object:
                values = np.stack([np.asarray(v).reshape(-1) for v in values]) if len(values) \
                    else np.zeros((0, 1))
            else:
                values = values.reshape(-1, 1)
            parts.append(values)
        matrix = np.concatenate(parts, axis=1) if parts else np.zeros((len(frame), 0))
        if self.dtype is not None:
            matrix = matrix.astype(self.dtype)
        frame = frame.drop(columns=present)
        frame[self.output_column_name] = list(matrix)
        return frame


class Chain(Preprocessor):
    """Preprocessors in order: each fits on the output of the ones before."""

    def __init__(self, *preprocessors: Preprocessor) -> None:
        super().__init__()
        for p in preprocessors:
            if not isinstance(p, Preprocessor):
                raise TypeError(f"Chain takes preprocessors, got {type(p).__name__}")
        self.preprocessors = list(preprocessors)
        self.columns = []

    def fit(self, ds: Dataset) -> Chain:
        for p in self.preprocessors:
            p.fit(ds)
            ds = p.transform(ds)
        self.stats_ = {}
        return self

    def fit_transform(self, ds: Dataset) -> Dataset:
        for p in self.preprocessors:
            ds = p.fit_transform(ds)
        self.stats_ = {}
        return ds

    def _check_fitted(self) -> None:
        for p in self.preprocessors:
            p._check_fitted()

    def transform(self, ds: Dataset) -> Dataset:
        self._check_fitted()
        for p in self.preprocessors:
            ds = p.transform(ds)
        return ds

    def transform_batch(self, batch):
        for p in self.preprocessors:
            batch = p.transform_batch(batch)
        return batch

    def __repr__(self) -> str:
        return f"Chain({', '.join(map(repr, self.preprocessors))})"


__all__ = ["Preprocessor", "PreprocessorNotFittedException", "StandardScaler", "MinMaxScaler",
           "OneHotEncoder", "LabelEncoder", "SimpleImputer", "Concatenator", "Chain"]
