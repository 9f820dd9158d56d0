"""``TrayBackend``: joblib's ``ParallelBackendBase`` over tray tasks.

Each batch joblib dispatches (a ``BatchedCalls``: a few ``delayed`` calls)
becomes one tray task, so scikit-learn's ``n_jobs`` work spreads over the
cluster, with tray's scheduling, retries and lineage.

Design choices:

* **Tasks, not a pool of actors.** Ray's backend patches joblib's
  ``PicklingPool`` to inherit from its multiprocessing pool (a global
  change to joblib). Batches are independent and stateless, so plain tasks
  fit: the scheduler places them where CPUs are free, a batch whose worker
  dies is retried (``max_retries``, 3 by default), and nothing global
  changes. ``n_jobs`` bounds how many batches joblib keeps in flight
  (``pre_dispatch``); ``-1`` means the cluster's CPUs.
* **No callback thread.** joblib's process backends fire a callback from a
  pool thread when a batch ends. This backend declares
  ``supports_retrieve_callback = False``: joblib's own thread asks for each
  result in turn (``retrieve_result``), which waits on the batch's ref and
  then lets joblib dispatch the next batch. No thread means the same
  behaviour in the simulator, where a run replays from its seed.
  ``return_as="generator"`` works; ``"generator_unordered"`` needs the
  callback and raises ``ValueError``.
* **Large arguments go to the object store once.** An argument of at least
  ``max_nbytes`` (joblib's setting, 1 MB by default) — a dataset given to
  every fit of a grid search — is ``put`` once per backend lifetime and
  passed by ref, so each batch carries a reference, not a copy, and workers
  read NumPy arrays zero-copy (read-only, as joblib's memmapping does).
* **Errors** come back as the original exception with the remote traceback
  as its ``__cause__``, as with joblib's process backends.
* **Nested parallelism** inside a batch runs sequentially: each batch holds
  one CPU, and threads inside it would oversubscribe the node.
* **Batch sizes** (``batch_size="auto"``) follow joblib's auto-batching, fed
  with each batch's run time measured inside its task (in the simulator
  that is virtual time, so batch sizes replay too).
"""

from __future__ import annotations

import sys
import time

from joblib._parallel_backends import AutoBatchingMixin, ParallelBackendBase, SequentialBackend

import tray
from tray import exceptions

from ..multiprocessing.remote_errors import RemoteError, capture

__all__ = ["TrayBackend", "RayBackend"]

_MAX_NBYTES_DEFAULT = 1_000_000  # joblib's default max_nbytes ("1M")


class _Shared:
    """Stands for the ``index``-th object-store argument of a batch task."""
    __slots__ = ("index",)

    def __init__(self, index: int) -> None:
        self.index = index

    def __reduce__(self):
        return (_Shared, (self.index,))


def _run_batch(batch, *shared):
    """The task: put the shared arguments (resolved by tray from their
    refs) back in place, run the batch, time it."""
    if shared:
        def resolve(value):
            return shared[value.index] if isinstance(value, _Shared) else value
        batch.items = [(func, [resolve(a) for a in args],
                        {k: resolve(v) for k, v in kwargs.items()})
                       for func, args, kwargs in batch.items]
    start_s = time.time()
    try:
        results = batch()
    except Exception as error:  # noqa: BLE001 - sent back as a value, raised by the caller
        return capture(error), time.time() - start_s
    return results, time.time() - start_s


_remote_run_batch = None


def _batch_task():
    global _remote_run_batch
    if _remote_run_batch is None:
        _remote_run_batch = tray.remote(_run_batch)
    return _remote_run_batch


class _Job:
    """What ``submit`` returns: the batch's ref and joblib's callback."""
    __slots__ = ("ref", "callback", "batch_size")

    def __init__(self, ref, callback, batch_size: int) -> None:
        self.ref = ref
        self.callback = callback
        self.batch_size = batch_size


class TrayBackend(AutoBatchingMixin, ParallelBackendBase):
    """joblib backend running each batch as a tray task.

    ``ray_remote_args`` (in ``parallel_backend("ray", ray_remote_args=...)``
    or ``Parallel(..., ray_remote_args=...)``) are the batch tasks' options,
    e.g. ``{"num_cpus": 2}`` or ``{"max_retries": 0}``."""

    supports_retrieve_callback = False
    supports_timeout = True
    supports_return_generator = True
    supports_inner_max_num_threads = False
    supports_sharedmem = False
    uses_threads = False
    default_n_jobs = 1

    def __init__(self, nesting_level=None, inner_max_num_threads=None,
                 ray_remote_args: dict | None = None, **kwargs) -> None:
        super().__init__(nesting_level=nesting_level,
                         inner_max_num_threads=inner_max_num_threads, **kwargs)
        self._remote_args = _check_remote_args(ray_remote_args)
        self._max_nbytes = _MAX_NBYTES_DEFAULT
        self._shared: dict[int, tuple] = {}  # id(obj) -> (obj, ref), for this backend's life
        self._jobs: dict = {}                # ref -> _Job, dispatched and not retrieved

    # ------------------------------------------------------------ joblib API

    def effective_n_jobs(self, n_jobs) -> int:
        if n_jobs == 0:
            raise ValueError("n_jobs == 0 in Parallel has no meaning")
        if n_jobs is None:
            return 1
        if n_jobs < 0:
            cpus = int(tray.cluster_resources().get("CPU", 0))
            return max(cpus + 1 + n_jobs, 1)
        return n_jobs

    def configure(self, n_jobs=1, parallel=None, prefer=None, require=None,
                  ray_remote_args: dict | None = None, max_nbytes=_MAX_NBYTES_DEFAULT,
                  **backend_kwargs) -> int:
        n_jobs = self.effective_n_jobs(n_jobs)
        if n_jobs == 1:
            # What n_jobs=1 asks for: no parallelism, no task overhead.
            from joblib._parallel_backends import FallbackToBackend
            raise FallbackToBackend(SequentialBackend(nesting_level=self.nesting_level))
        if parallel is not None and not getattr(parallel, "return_ordered", True):
            raise ValueError("the tray joblib backend does not support "
                             "return_as='generator_unordered' (it needs a callback thread); "
                             "use 'list' or 'generator'")
        if ray_remote_args is not None:
            self._remote_args = _check_remote_args(ray_remote_args)
        self._max_nbytes = max_nbytes
        self.parallel = parallel
        return n_jobs

    def submit(self, func, callback=None) -> _Job:
        batch_size = len(func) if hasattr(func, "__len__") else 1
        shared_refs: dict = {}  # ref -> its index among the task's extra arguments
        if hasattr(func, "items") and self._max_nbytes is not None:
            func.items = [(f, [self._share(a, shared_refs) for a in args],
                           {k: self._share(v, shared_refs) for k, v in kwargs.items()})
                          for f, args, kwargs in func.items]
        task = _batch_task()
        if self._remote_args:
            task = task.options(**self._remote_args)
        ref = task.remote(func, *shared_refs)  # tray passes each shared ref's value
        job = self._jobs[ref] = _Job(ref, callback, batch_size)
        return job

    def retrieve_result(self, out: _Job, timeout=None):
        """The batch's results (joblib's thread calls this in order); then
        tells joblib the batch ended, which dispatches the next one."""
        try:
            value, duration_s = tray.get(out.ref, timeout=timeout)
        except exceptions.GetTimeoutError:
            raise  # the batch is still running: joblib aborts the call
        except BaseException:
            self._done(out, None)
            raise
        self._done(out, duration_s)
        if isinstance(value, RemoteError):
            raise value.exception()
        return value

    def _done(self, job: _Job, duration_s: float | None) -> None:
        self._jobs.pop(job.ref, None)
        if duration_s is not None:
            AutoBatchingMixin.batch_completed(self, job.batch_size, duration_s)
        if job.callback is not None:
            callback, job.callback = job.callback, None
            callback(None)

    def batch_completed(self, batch_size, duration):
        """joblib's own measure (dispatch to retrieval, in the caller's
        clock) is ignored: ``retrieve_result`` reports the task's run time."""

    def abort_everything(self, ensure_ready=True) -> None:
        """A batch failed: cancel the batches still running."""
        for ref in list(self._jobs):
            try:
                tray.cancel(ref)
            except exceptions.TrayError:
                pass  # finished or gone meanwhile
        self._jobs.clear()
        if not ensure_ready:
            self._shared.clear()

    def terminate(self) -> None:
        self._shared.clear()
        self._jobs.clear()
        self.reset_batch_stats()

    def get_nested_backend(self):
        return SequentialBackend(nesting_level=(self.nesting_level or 0) + 1), None

    # -------------------------------------------------------------- helpers

    def _share(self, value, shared_refs: dict):
        """``value`` itself, or a ``_Shared`` placeholder for its ref if it is
        large (put once per backend lifetime, passed once per batch)."""
        if isinstance(value, (int, float, str, bool, type(None), tray.ObjectRef)):
            return value
        try:
            size_bytes = sys.getsizeof(value)
        except Exception:  # noqa: BLE001 - some objects cannot say; send them inline
            return value
        if size_bytes < self._max_nbytes:
            return value
        entry = self._shared.get(id(value))
        if entry is None or entry[0] is not value:
            entry = self._shared[id(value)] = (value, tray.put(value))
        index = shared_refs.setdefault(entry[1], len(shared_refs))
        return _Shared(index)


def _check_remote_args(remote_args) -> dict:
    if remote_args is None:
        return {}
    if not isinstance(remote_args, dict):
        raise TypeError(f"ray_remote_args must be a dict of task options, got "
                        f"{type(remote_args).__name__}")
    return dict(remote_args)


# Ray's name for it.
RayBackend = TrayBackend
