"""Makes ``tray.init()`` inside a submitted job join the job's cluster.

A job's supervisor puts this directory first on the entrypoint's
``PYTHONPATH``, with ``TRAY_ADDRESS`` (the cluster's GCS, host:port),
``TRAY_CLUSTER_TOKEN`` and ``TRAY_JOB_RUNTIME_ENV`` (the job's runtime_env,
JSON) in its environment. As Ray's drivers do with ``RAY_ADDRESS``, a
``tray.init()`` with no address (or the auto-init of a first ``.remote()``)
then connects to that cluster instead of starting one, and the job's
runtime_env (its uploaded working_dir, env_vars, pip) becomes the driver's
job-level runtime_env, under whatever the script passes itself (its keys
win; env_vars merge by name).

Why a hook and not a line in ``tray.init``: ``tray/core/api.py`` is not
this package's to change; when ``init`` reads ``TRAY_ADDRESS`` itself, this
hook finds an explicit address and does nothing. It costs nothing to a
Python process that never imports tray: it only watches for
``tray.core.api`` being imported, and wraps its ``init`` once it is."""

import importlib.abc
import importlib.util
import inspect
import json
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))


def _merged_runtime_env(job_env: dict, own: dict | None) -> dict:
    if not own:
        return dict(job_env)
    merged = {**job_env, **own}
    if "env_vars" in job_env and "env_vars" in own:
        merged["env_vars"] = {**job_env["env_vars"], **own["env_vars"]}
    return merged


def _record_driver_job(api) -> None:
    """Put this driver's job id into the submitted job's record (Ray's
    ``JobDetails.job_id``), so a submission and its driver are one job in
    ``tray list jobs``. Best effort: a job runs the same without it."""
    submission_id = os.environ.get("TRAY_JOB_SUBMISSION_ID")
    if not submission_id:
        return
    try:
        worker = api._worker()
        record = api._block(worker, worker.gcs_call, "job_submission_get", submission_id)
        if record is None:
            return
        fields = json.loads(record)
        fields["driver_job_id"] = worker.job_id.hex()
        api._block(worker, worker.gcs_call, "job_submission_put", submission_id,
                   json.dumps(fields, sort_keys=True).encode(), False)
    except Exception:  # noqa: BLE001 - never fail the user's init for it
        pass


def _wrap_init(api) -> None:
    original = api.init
    takes_runtime_env = "runtime_env" in inspect.signature(original).parameters

    def init(address=None, **kwargs):
        if address is None and kwargs.get("backend") in (None, "local") and \
                os.environ.get("TRAY_ADDRESS"):
            address = os.environ["TRAY_ADDRESS"]
            job_env = json.loads(os.environ.get("TRAY_JOB_RUNTIME_ENV") or "{}")
            if takes_runtime_env and job_env:
                kwargs["runtime_env"] = _merged_runtime_env(job_env, kwargs.get("runtime_env"))
            context = original(address, **kwargs)
            _record_driver_job(api)
            return context
        return original(address, **kwargs)

    init.__doc__ = original.__doc__
    init.__wrapped__ = original
    api.init = init


class _WatchTrayApi(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != "tray.core.api":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def exec_and_wrap(module):
            exec_module(module)
            _wrap_init(module)

        spec.loader.exec_module = exec_and_wrap
        return spec


if os.environ.get("TRAY_ADDRESS"):
    sys.meta_path.insert(0, _WatchTrayApi())

# Whatever sitecustomize this one hides still runs.
def _run_hidden_sitecustomize() -> None:
    import importlib.machinery

    path = [entry for entry in sys.path if os.path.abspath(entry or ".") != _HERE]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", path)
    if spec is not None and spec.loader is not None:
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)


_run_hidden_sitecustomize()
