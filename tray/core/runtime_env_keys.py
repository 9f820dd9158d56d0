"""What the core knows of runtime environments, as plain data: the hash that
names a resolved env's worker pool on a node, and the key under which the
env is stored in the GCS's key-value store (where a node reads its
``env_vars`` to start workers for it). Everything else about runtime
environments -- validation, packing, merging, setting one up in a worker --
lives above the core, in ``tray.runtime_env``."""

from __future__ import annotations

import hashlib
import json

ENV_KV_PREFIX = "runtime_env:"


def env_hash(resolved: dict | None) -> str:
    """The name of a resolved env's worker pool: '' for the empty env."""
    if not resolved:
        return ""
    text = json.dumps(resolved, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:32]
