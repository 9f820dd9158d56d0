"""``JobSubmissionClient``: Ray's job SDK, over the job API's HTTP routes.

A client finds its cluster's job API at ``address`` (``http://host:port``;
by default ``TRAY_API_SERVER_ADDRESS`` or ``TRAY_ADDRESS`` when an http(s)
URL, else the dashboard of the cluster started on this machine, else
``http://127.0.0.1:8265``, Ray's port) and proves itself with the
cluster's token: ``token=``, else ``TRAY_CLUSTER_TOKEN``, else the token
that ``tray start --head`` kept (mode 0600) for the cluster started on this
machine.

A local ``working_dir`` (a directory or a .zip) and ``py_modules`` are
packed here, by ``tray.runtime_env.packaging`` (content-named zips,
``excludes`` honoured, the size limit naming the largest files), uploaded
(a package the cluster already holds is not sent again) and replaced in the
runtime_env by their ``gcs://`` names; the job's supervisor unpacks them on
the head node, and the job's workers find the same packages."""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator
from typing import Any

import httpx

from ..exceptions import TrayError
from ._common import JobInfo, JobNotFoundError, JobStatus, JobSubmissionError

DEFAULT_ADDRESS = "http://127.0.0.1:8265"
# Where the dashboard of a head started here writes its URL (in the session directory).
DASHBOARD_INFO_FILE = "dashboard.json"
REQUEST_TIMEOUT_S = 60.0
UPLOAD_TIMEOUT_S = 600.0


def _default_address() -> str:
    """Where the job API is when no address is given, as Ray looks for it:
    ``TRAY_API_SERVER_ADDRESS``, else ``TRAY_ADDRESS`` when it is an http(s)
    URL, else the dashboard of the cluster started on this machine (its URL
    is kept in the head's session directory), else Ray's default port."""
    for name in ("TRAY_API_SERVER_ADDRESS", "TRAY_ADDRESS"):
        address = os.environ.get(name, "")
        if address.startswith(("http://", "https://")):
            return address
    from ..backends.local.session import read_current_cluster, read_private_file

    current = read_current_cluster()
    if current and current.get("session_dir"):
        try:
            info = json.loads(read_private_file(os.path.join(current["session_dir"],
                                                             DASHBOARD_INFO_FILE)))
            if isinstance(info.get("url"), str):
                return info["url"]
        except (OSError, ValueError):
            pass
    return DEFAULT_ADDRESS


def _is_loopback(address: str) -> bool:
    import ipaddress

    host = httpx.URL(address).host
    try:
        return host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _find_token(address: str) -> str:
    """``TRAY_CLUSTER_TOKEN``, else the token of the cluster started on this
    machine, but that one only for a job API on this machine: the token is
    never sent to another host because a local cluster happens to exist."""
    token = os.environ.get("TRAY_CLUSTER_TOKEN")
    if token:
        return token
    from ..backends.local.session import nothing_listens_at, read_current_cluster

    current = read_current_cluster()
    if current and current.get("token") and _is_loopback(address):
        return current["token"]
    url = httpx.URL(address)
    if url.host and nothing_listens_at(url.host, url.port or (443 if url.scheme == "https"
                                                                else 80)):
        raise TrayError(f"nothing answers at {address}: is a tray cluster's job API running "
                        "there ('tray start --head' serves it)?")
    raise TrayError(f"no token for the job API at {address}: pass token= (or --token-file), "
                    "or set TRAY_CLUSTER_TOKEN to the token 'tray start --head' printed; on "
                    "the head's machine, a job API on 127.0.0.1 finds it by itself")


def _read_requirements(path) -> list[str]:
    """A requirements file's requirements, read here (the cluster cannot see
    this machine's files)."""
    try:
        with open(path) as file:
            lines = [line.split("#", 1)[0].strip() for line in file]
    except OSError as error:
        raise ValueError(f"runtime_env pip: cannot read the requirements file {path!r}: "
                         f"{error.strerror}") from None
    return [line for line in lines if line]


class JobSubmissionClient:
    """Submit jobs to a tray cluster and follow them (Ray's API)."""

    def __init__(self, address: str | None = None, *, token: str | None = None,
                 headers: dict[str, str] | None = None, verify: bool | str = True) -> None:
        address = address or _default_address()
        if "://" not in address:
            address = "http://" + address
        if not address.startswith(("http://", "https://")):
            raise ValueError(f"the job API's address must be an http(s) URL, got {address!r}")
        self._address = address.rstrip("/")
        token = token or _find_token(self._address)
        self._headers = {**(headers or {}), "Authorization": f"Bearer {token}"}
        self._verify = verify

    @property
    def address(self) -> str:
        return self._address

    # ------------------------------------------------------------ plumbing

    def _request(self, method: str, path: str, *, timeout_s: float = REQUEST_TIMEOUT_S,
                 **kwargs) -> httpx.Response:
        try:
            with httpx.Client(headers=self._headers, verify=self._verify,
                              timeout=timeout_s) as client:
                response = client.request(method, self._address + path, **kwargs)
        except httpx.TransportError as error:
            raise TrayError(f"no tray job API answers at {self._address} ({error}); is the "
                            "cluster's head (and its dashboard) running?") from None
        self._check(response)
        return response

    @staticmethod
    def _check(response: httpx.Response) -> None:
        if response.status_code < 400:
            return
        try:
            body = response.json()
            message = body.get("error", response.text) if isinstance(body, dict) \
                else response.text
        except ValueError:
            message = response.text
        if response.status_code == 404:
            raise JobNotFoundError(message)
        if response.status_code == 401:
            raise TrayError(f"the job API refused this client's token: {message}")
        raise JobSubmissionError(f"Request failed with status code {response.status_code}: "
                                 f"{message}")

    def _upload_code(self, runtime_env: dict) -> dict:
        """The runtime_env with its local code (working_dir, py_modules)
        packed here and uploaded (once per content), its requirements file
        read here: what the cluster receives names only package URIs.

        Packed at every submission, never from a cache: a second submission
        from the same process after an edit ships the edit."""
        from ..runtime_env import packaging

        runtime_env = dict(runtime_env)
        excludes = list(runtime_env.pop("excludes", None) or [])
        pip = runtime_env.get("pip")
        if isinstance(pip, (str, os.PathLike)):
            runtime_env["pip"] = _read_requirements(pip)
        elif isinstance(pip, dict) and isinstance(pip.get("packages"), (str, os.PathLike)):
            runtime_env["pip"] = {**pip, "packages": _read_requirements(pip["packages"])}
        working_dir = runtime_env.get("working_dir")
        if working_dir is not None and not packaging.is_package_uri(working_dir):
            runtime_env["working_dir"] = self._upload(
                packaging.pack_directory(working_dir, excludes))
        modules = runtime_env.get("py_modules")
        if isinstance(modules, (list, tuple)):
            runtime_env["py_modules"] = [self._upload_module(module, excludes)
                                         for module in modules]
        return runtime_env

    def _upload_module(self, module, excludes: list[str]) -> str:
        from .. import runtime_env
        from ..runtime_env import packaging

        if isinstance(module, str) and packaging.is_package_uri(module):
            return module
        return self._upload(runtime_env.local_package(module, "py_modules", excludes))

    def _upload(self, package) -> str:
        path = f"/api/packages/{package.uri}"
        if not self._request_status("GET", path):
            self._request("PUT", path, content=package.data, timeout_s=UPLOAD_TIMEOUT_S)
        return package.uri

    def _request_status(self, method: str, path: str) -> bool:
        try:
            self._request(method, path)
        except JobNotFoundError:
            return False
        return True

    # ------------------------------------------------------------ the API

    def submit_job(self, *, entrypoint: str, job_id: str | None = None,
                   runtime_env: dict[str, Any] | None = None,
                   metadata: dict[str, str] | None = None,
                   submission_id: str | None = None,
                   entrypoint_num_cpus: float | None = None,
                   entrypoint_num_gpus: float | None = None,
                   entrypoint_memory: int | None = None,
                   entrypoint_resources: dict[str, float] | None = None) -> str:
        """Submit ``entrypoint`` (a shell command, run on the head node) and
        return its submission id at once; the job runs on without this
        client. ``job_id`` is Ray's deprecated name for ``submission_id``."""
        if any(value is not None for value in (entrypoint_num_cpus, entrypoint_num_gpus,
                                                entrypoint_memory, entrypoint_resources)):
            raise ValueError("entrypoint_num_cpus/num_gpus/memory/resources are not supported "
                             "by tray yet: the entrypoint runs on the head node, reserving "
                             "nothing; its tasks and actors reserve what they ask for")
        if job_id is not None and submission_id is not None and job_id != submission_id:
            raise ValueError("job_id is the deprecated name of submission_id: pass one")
        if runtime_env is not None and not isinstance(runtime_env, dict):
            raise TypeError(f"runtime_env must be a dict, got {type(runtime_env).__name__}")
        runtime_env = self._upload_code(runtime_env or {})
        body = {"entrypoint": entrypoint, "submission_id": submission_id or job_id,
                "runtime_env": runtime_env, "metadata": metadata or {}}
        return self._request("POST", "/api/jobs/", json=body).json()["submission_id"]

    def get_job_info(self, job_id: str) -> JobInfo:
        return JobInfo.from_record(self._request("GET", f"/api/jobs/{job_id}").json())

    def get_job_status(self, job_id: str) -> JobStatus:
        return self.get_job_info(job_id).status

    def list_jobs(self) -> list[JobInfo]:
        return [JobInfo.from_record(job) for job in self._request("GET", "/api/jobs/").json()]

    def stop_job(self, job_id: str) -> bool:
        """Stop a job: SIGTERM to its driver, SIGKILL 3 s later; what the
        driver owned goes with it. False if it had already ended."""
        return self._request("POST", f"/api/jobs/{job_id}/stop").json()["stopped"]

    def delete_job(self, job_id: str) -> bool:
        """Forget a job that has ended (its record and its logs)."""
        return self._request("DELETE", f"/api/jobs/{job_id}").json()["deleted"]

    def get_job_logs(self, job_id: str) -> str:
        """The driver's stdout and stderr so far (the last 16 MiB)."""
        return self._request("GET", f"/api/jobs/{job_id}/logs").json()["logs"]

    async def tail_job_logs(self, job_id: str) -> AsyncIterator[str]:
        """The driver's output as it comes, until the job ends: ``async for
        lines in client.tail_job_logs(id)`` (under asyncio or trio)."""
        try:
            async with httpx.AsyncClient(headers=self._headers, verify=self._verify,
                                         timeout=httpx.Timeout(REQUEST_TIMEOUT_S,
                                                               read=None)) as client:
                async with client.stream("GET", f"{self._address}/api/jobs/{job_id}/logs/tail"
                                         ) as response:
                    if response.status_code >= 400:
                        await response.aread()
                        self._check(response)
                    async for text in response.aiter_text():
                        if text:
                            yield text
        except httpx.TransportError as error:
            raise TrayError(f"no tray job API answers at {self._address} ({error})") from None
