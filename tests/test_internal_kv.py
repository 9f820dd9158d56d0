"""tray.experimental.internal_kv: Ray's internal key-value store, kept by the
GCS (Serve's controller checkpoints there, as Ray Serve does)."""

from __future__ import annotations

import pytest

import tray
from tray.core.config import Config
from tray.exceptions import NotInitializedError
from tray.experimental import internal_kv as kv


def test_put_get_exists_list_and_delete(one_node):
    assert kv._internal_kv_initialized()
    assert kv._internal_kv_get("missing") is None
    assert kv._internal_kv_put("job/1", b"one") is False  # new
    assert kv._internal_kv_put("job/1", b"uno", overwrite=False) is True  # kept
    assert kv._internal_kv_get("job/1") == b"one"
    assert kv._internal_kv_put(b"job/1", "eins") is True  # overwritten; str and bytes alike
    assert kv._internal_kv_get("job/1") == b"eins"
    kv._internal_kv_put("job/2", b"two")
    kv._internal_kv_put("other", b"x")
    assert kv._internal_kv_list("job/") == [b"job/1", b"job/2"]
    assert kv._internal_kv_exists("job/2") and not kv._internal_kv_exists("job/3")
    assert kv._internal_kv_del("job/", del_by_prefix=True) == 2
    assert kv._internal_kv_del("job/1") == 0
    assert kv._internal_kv_list("") == [b"other"]


def test_namespaces_keep_keys_apart_and_tasks_see_them(one_node):
    kv._internal_kv_put("k", b"default")
    kv._internal_kv_put("k", b"serve", namespace="serve")
    assert kv._internal_kv_get("k") == b"default"
    assert kv._internal_kv_get("k", namespace="serve") == b"serve"
    assert kv._internal_kv_list("", namespace="serve") == [b"k"]

    @tray.remote
    def read():
        return kv._internal_kv_get("k", namespace="serve")

    assert tray.get(read.remote()) == b"serve"
    with pytest.raises(TypeError):
        kv._internal_kv_put("k", 3)


def test_limits_fail_the_call_and_change_nothing():
    tray.init(backend="sim", seed=1, config=Config(user_kv_keys_max=2,
                                                   user_kv_value_bytes_max=10))
    kv._internal_kv_put("a", b"1")
    kv._internal_kv_put("b", b"2")
    with pytest.raises(ValueError, match="user_kv_keys_max"):
        kv._internal_kv_put("c", b"3")
    kv._internal_kv_put("a", b"replaced")  # an existing key may still change
    with pytest.raises(ValueError, match="user_kv_value_bytes_max"):
        kv._internal_kv_put("a", b"x" * 11)
    assert kv._internal_kv_get("a") == b"replaced" and kv._internal_kv_get("c") is None
    kv._internal_kv_del("b")
    kv._internal_kv_put("c", b"3")  # room again
    assert kv._internal_kv_list("") == [b"a", b"c"]


def test_keys_outlive_a_gcs_restart():
    tray.init(backend="sim", seed=2, num_nodes=2)
    from tray.simtest import cluster as current_cluster

    kv._internal_kv_put("checkpoint", b"state", namespace="serve")
    current_cluster().restart_gcs(down_for_s=0.5)
    assert kv._internal_kv_get("checkpoint", namespace="serve") == b"state"
    assert kv._internal_kv_put("after", b"1") is False


def test_without_a_cluster_it_says_so():
    assert not kv._internal_kv_initialized()
    with pytest.raises(NotInitializedError):
        kv._internal_kv_get("k")
