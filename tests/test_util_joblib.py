"""tray.util.joblib: joblib's batches as tray tasks, so scikit-learn's
``n_jobs`` runs on the cluster (Ray's ``register_ray`` and tray's
``register_tray``)."""

from __future__ import annotations

import sys
import time

import numpy as np
import pytest

joblib = pytest.importorskip("joblib")
sklearn = pytest.importorskip("sklearn")

from sklearn.datasets import make_classification  # noqa: E402
from sklearn.model_selection import GridSearchCV  # noqa: E402
from sklearn.svm import SVC  # noqa: E402

import tray  # noqa: E402
import tray.simtest  # noqa: E402
from tray.util.joblib import register_ray, register_tray  # noqa: E402
from tray.util.joblib.backend import RayBackend, TrayBackend  # noqa: E402
from tray.util.multiprocessing import RemoteTraceback  # noqa: E402


@pytest.fixture(autouse=True)
def _registered():
    register_ray()
    register_tray()


@pytest.fixture
def sim():
    tray.init(backend="sim", num_nodes=2, num_cpus=2, seed=0)
    yield
    tray.shutdown()


def where(i, sleep_s=0.0):
    """``i * i`` and where it ran: (node, task) ids; no task id in the driver."""
    time.sleep(sleep_s)
    context = tray.get_runtime_context()
    return i * i, context.get_node_id(), context.get_task_id()


def fail_on_three(i):
    if i == 3:
        raise ValueError(f"three is bad ({i})")
    return i


def nested_backend_name(_):
    from joblib.parallel import get_active_backend
    inner = joblib.Parallel(n_jobs=2)(joblib.delayed(abs)(-i) for i in range(3))
    assert inner == [0, 1, 2]
    return type(get_active_backend()[0]).__name__


def small_search():
    X, y = make_classification(n_samples=240, n_features=8, random_state=0)
    search = GridSearchCV(SVC(), {"C": [0.1, 1.0, 10.0], "gamma": ["scale", 0.01]}, cv=3)
    return search, X, y


# ================================================================ both backends


@pytest.mark.cluster(num_cpus=2)  # at most two workers import scikit-learn
def test_grid_search_runs_on_the_cluster_on_both_backends(one_node):
    expected, X, y = small_search()
    expected.fit(X, y)  # joblib's default: in this process
    search, _, _ = small_search()
    with joblib.parallel_backend("ray", n_jobs=2):
        search.fit(X, y)
    assert search.best_params_ == expected.best_params_
    assert search.best_score_ == pytest.approx(expected.best_score_)
    np.testing.assert_allclose(search.cv_results_["mean_test_score"],
                               expected.cv_results_["mean_test_score"])
    with joblib.parallel_backend("tray", n_jobs=2):
        out = joblib.Parallel()(joblib.delayed(where)(i) for i in range(6))
    assert [value for value, _, _ in out] == [i * i for i in range(6)]
    assert all(task_id is not None for _, _, task_id in out)  # ran as tray tasks


# ============================================================= the simulator


def test_both_names_are_the_same_backend():
    assert RayBackend is TrayBackend
    from joblib.parallel import BACKENDS
    assert BACKENDS["ray"] is TrayBackend and BACKENDS["tray"] is TrayBackend


def test_batches_spread_over_the_nodes(sim):
    with joblib.parallel_backend("tray"):
        out = joblib.Parallel(batch_size=1)(joblib.delayed(where)(i, 0.5) for i in range(12))
    assert [value for value, _, _ in out] == [i * i for i in range(12)]
    assert len({node for _, node, _ in out}) == 2


def test_n_jobs(sim):
    backend = TrayBackend()
    assert backend.effective_n_jobs(-1) == 4  # the cluster's CPUs
    assert backend.effective_n_jobs(-2) == 3
    assert backend.effective_n_jobs(-10) == 1
    assert backend.effective_n_jobs(7) == 7
    with pytest.raises(ValueError, match="n_jobs == 0"):
        backend.effective_n_jobs(0)
    # n_jobs=1 asks for no parallelism: the batches run here, not as tasks
    with joblib.parallel_backend("tray", n_jobs=1):
        out = joblib.Parallel()(joblib.delayed(where)(i) for i in range(3))
    assert [task_id for _, _, task_id in out] == [None, None, None]


def test_errors_are_the_original_exception(sim):
    with joblib.parallel_backend("ray", n_jobs=4):
        with pytest.raises(ValueError, match="three is bad") as caught:
            joblib.Parallel()(joblib.delayed(fail_on_three)(i) for i in range(8))
    assert type(caught.value) is ValueError
    assert isinstance(caught.value.__cause__, RemoteTraceback)
    assert "fail_on_three" in str(caught.value.__cause__)
    # the backend is usable after the failure
    with joblib.parallel_backend("ray", n_jobs=4):
        assert joblib.Parallel()(joblib.delayed(abs)(-i) for i in range(4)) == [0, 1, 2, 3]


def test_generators(sim):
    with joblib.parallel_backend("tray", n_jobs=2):
        results = joblib.Parallel(return_as="generator")(
            joblib.delayed(abs)(-i) for i in range(5))
        assert list(results) == [0, 1, 2, 3, 4]
        with pytest.raises(ValueError, match="generator_unordered"):
            joblib.Parallel(return_as="generator_unordered")(
                joblib.delayed(abs)(-i) for i in range(5))


def test_large_arguments_are_put_once(sim):
    data = np.arange(300_000, dtype=np.float64)  # 2.4 MB, over joblib's 1 MB max_nbytes
    with joblib.Parallel(backend="tray", n_jobs=4, batch_size=1) as parallel:
        sums = parallel(joblib.delayed(np.sum)(data) for _ in range(6))
        shared = parallel._backend._shared
        assert len(shared) == 1 and next(iter(shared.values()))[0] is data
    assert sums == [data.sum()] * 6
    small = np.arange(10)
    with joblib.Parallel(backend="tray", n_jobs=2) as parallel:
        parallel(joblib.delayed(np.sum)(small) for _ in range(3))
        assert parallel._backend._shared == {}


def test_nested_parallel_runs_sequentially_inside_a_batch(sim):
    with joblib.parallel_backend("tray", n_jobs=2):
        names = joblib.Parallel()(joblib.delayed(nested_backend_name)(i) for i in range(2))
    assert names == ["SequentialBackend", "SequentialBackend"]


def test_task_options_reach_the_batches(sim):
    with pytest.raises(ValueError, match="not_an_option"):
        with joblib.parallel_backend("tray", n_jobs=2, ray_remote_args={"not_an_option": 1}):
            joblib.Parallel()(joblib.delayed(abs)(-i) for i in range(3))
    with pytest.raises(TypeError, match="ray_remote_args must be a dict"):
        TrayBackend(ray_remote_args=["num_cpus", 2])
    with joblib.parallel_backend("tray", n_jobs=2, ray_remote_args={"num_cpus": 2}):
        out = joblib.Parallel()(joblib.delayed(where)(i) for i in range(4))
    assert [value for value, _, _ in out] == [0, 1, 4, 9]


def test_grid_search_replays_identically():
    def run() -> str:
        tray.init(backend="sim", num_nodes=2, num_cpus=2, seed=1)
        try:
            search, X, y = small_search()
            with joblib.parallel_backend("ray"):
                search.fit(X, y)
            return f"{search.best_params_} {tray.simtest.trace_digest()}"
        finally:
            tray.shutdown()

    assert run() == run()


def test_registering_without_joblib_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "joblib.parallel", None)
    with pytest.raises(ImportError, match=r"pip install 'tray\[util\]'"):
        register_tray()
