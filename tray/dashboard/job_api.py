"""The job API over HTTP: Ray's job REST routes, served by the dashboard.

``routes(gcs_address=, token=, session_dir=)`` returns the Starlette routes
the dashboard server on the head node mounts (Ray's paths, so Ray's REST
clients find them):

    POST   /api/jobs/                       submit  {entrypoint, submission_id?, runtime_env?, metadata?}
    GET    /api/jobs/                       list    [JobInfo...]
    GET    /api/jobs/{id}                   info    JobInfo
    POST   /api/jobs/{id}/stop              stop    {stopped}
    DELETE /api/jobs/{id}                   delete  {deleted}
    GET    /api/jobs/{id}/logs              logs    {logs}
    GET    /api/jobs/{id}/logs/tail         the log as it grows (a chunked text stream
                                            that ends when the job does; Ray uses a websocket)
    GET    /api/packages/{uri}              200 if the working_dir package is stored, else 404
    PUT    /api/packages/{uri}              upload a working_dir package (zip bytes)

Every request must carry the cluster's token (``Authorization: Bearer
<token>``): without it, or with another, the answer is 401 and nothing is
done, whatever the route; the comparison takes constant time. Whoever
holds the token can already run any code in the cluster, so it is the
right key for "run this command on the head node".

Bad input is a 400 with ``{"error": message}``, an unknown job a 404, a
cluster that does not answer a 503. Bodies are bounded (a package at
``PACKAGE_BYTES_MAX``, anything else at 1 MiB): more is a 413, read no
further.

Until the dashboard server serves these routes, ``python -m
tray.dashboard.job_api --address auto`` serves them alone (uvicorn, on
127.0.0.1:8265 unless told otherwise)."""

from __future__ import annotations

import argparse
import hmac
import json
import os

import anyio
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from ..exceptions import TrayError
from ..job_submission._common import (
    PACKAGE_BYTES_MAX,
    JobNotFoundError,
    JobSubmissionError,
)
from ..job_submission._manager import JobManager

DEFAULT_PORT = 8265
JSON_BODY_BYTES_MAX = 1024 * 1024
TAIL_POLL_S = 0.2
TAIL_STATUS_EVERY_S = 1.0
TAIL_CHUNK_BYTES = 64 * 1024


class _BodyTooLarge(Exception):
    pass


async def _read_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise _BodyTooLarge(limit)
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise _BodyTooLarge(limit)
        chunks.append(chunk)
    return b"".join(chunks)


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)


def routes(*, gcs_address: str, token: bytes, session_dir: str) -> list[Route]:
    """The job API's routes for the cluster whose GCS is at ``gcs_address``
    (``tcp:host:port``) with ``token``; logs and unpacked working dirs go
    under ``session_dir`` (the head node's session directory)."""
    manager = JobManager(gcs_address, token, session_dir)
    expected = b"Bearer " + token

    def endpoint(handler):
        async def guarded(request: Request) -> Response:
            given = request.headers.get("authorization", "").encode()
            if not hmac.compare_digest(given, expected):
                return JSONResponse(
                    {"error": "this cluster's job API needs its token: Authorization: Bearer "
                              "<token> (tray finds it in the session files of the machine "
                              "that started the head, or TRAY_CLUSTER_TOKEN)"},
                    status_code=401, headers={"WWW-Authenticate": "Bearer"})
            try:
                return await handler(request)
            except JobNotFoundError as error:
                return _error(404, str(error))
            except JobSubmissionError as error:
                return _error(400, str(error))
            except _BodyTooLarge as error:
                return _error(413, f"the request body is over its limit of {error.args[0]} "
                                   "bytes")
            except TrayError as error:
                return _error(503, str(error))
        return guarded

    def in_thread(fn, *args, **kwargs):
        return anyio.to_thread.run_sync(lambda: fn(*args, **kwargs))

    async def submit(request: Request) -> Response:
        try:
            body = json.loads(await _read_body(request, JSON_BODY_BYTES_MAX))
        except ValueError:
            raise JobSubmissionError("the request body is not JSON") from None
        if not isinstance(body, dict):
            raise JobSubmissionError("the request body must be a JSON object")
        unknown = sorted(set(body) - {"entrypoint", "submission_id", "job_id", "runtime_env",
                                      "metadata"})
        if unknown:
            raise JobSubmissionError(f"unknown field(s) {', '.join(unknown)}")
        submission_id = await in_thread(
            manager.submit, entrypoint=body.get("entrypoint"),
            submission_id=body.get("submission_id") or body.get("job_id"),
            runtime_env=body.get("runtime_env"), metadata=body.get("metadata"))
        return JSONResponse({"job_id": submission_id, "submission_id": submission_id})

    async def list_jobs(request: Request) -> Response:
        jobs = await in_thread(manager.list)
        return JSONResponse([job.to_json() for job in jobs])

    async def info(request: Request) -> Response:
        job = await in_thread(manager.info, request.path_params["job_id"])
        return JSONResponse(job.to_json())

    async def stop(request: Request) -> Response:
        stopped = await in_thread(manager.stop, request.path_params["job_id"])
        return JSONResponse({"stopped": stopped})

    async def delete(request: Request) -> Response:
        deleted = await in_thread(manager.delete, request.path_params["job_id"])
        return JSONResponse({"deleted": deleted})

    async def logs(request: Request) -> Response:
        text = await in_thread(manager.logs, request.path_params["job_id"])
        return JSONResponse({"logs": text})

    async def tail(request: Request) -> Response:
        submission_id = request.path_params["job_id"]
        await in_thread(manager.info, submission_id)  # 404 before the stream starts
        path = manager.log_path(submission_id)

        async def chunks():
            offset, since_status, ended = 0, TAIL_STATUS_EVERY_S, False
            while True:
                data = await in_thread(_read_from, path, offset)
                if data:
                    offset += len(data)
                    yield data
                    continue
                if ended:
                    return  # the job had ended, and its whole log is sent
                if since_status >= TAIL_STATUS_EVERY_S:
                    since_status = 0.0
                    job = await in_thread(manager.info, submission_id)
                    ended = job.status.is_terminal()
                    if ended:
                        continue  # one more read: what it wrote last
                await anyio.sleep(TAIL_POLL_S)
                since_status += TAIL_POLL_S

        return StreamingResponse(chunks(), media_type="text/plain; charset=utf-8")

    async def package_exists(request: Request) -> Response:
        found = await in_thread(manager.has_package, request.path_params["uri"])
        return Response(status_code=200 if found else 404)

    async def package_upload(request: Request) -> Response:
        data = await _read_body(request, PACKAGE_BYTES_MAX)
        await in_thread(manager.put_package, request.path_params["uri"], data)
        return JSONResponse({"uploaded": True})

    return [
        Route("/api/jobs/", endpoint(submit), methods=["POST"]),
        Route("/api/jobs/", endpoint(list_jobs), methods=["GET"]),
        Route("/api/jobs/{job_id}", endpoint(info), methods=["GET"]),
        Route("/api/jobs/{job_id}", endpoint(delete), methods=["DELETE"]),
        Route("/api/jobs/{job_id}/stop", endpoint(stop), methods=["POST"]),
        Route("/api/jobs/{job_id}/logs", endpoint(logs), methods=["GET"]),
        Route("/api/jobs/{job_id}/logs/tail", endpoint(tail), methods=["GET"]),
        Route("/api/packages/{uri:path}", endpoint(package_exists), methods=["GET"]),
        Route("/api/packages/{uri:path}", endpoint(package_upload), methods=["PUT"]),
    ]


def _read_from(path: str, offset: int) -> bytes:
    try:
        with open(path, "rb") as file:
            file.seek(offset)
            return file.read(TAIL_CHUNK_BYTES)
    except FileNotFoundError:
        return b""


def app(*, gcs_address: str, token: bytes, session_dir: str) -> Starlette:
    """A server of the job API alone."""
    return Starlette(routes=routes(gcs_address=gcs_address, token=token,
                                   session_dir=session_dir))


def main(argv: list[str] | None = None) -> None:
    import uvicorn

    from ..backends.local import resolve_cluster
    from ..backends.local.session import read_current_cluster

    parser = argparse.ArgumentParser(prog="tray-job-api",
                                     description="serve the job API of a running cluster")
    parser.add_argument("--address", default="auto",
                        help="the cluster's GCS host:port ('auto': the head started here)")
    parser.add_argument("--session-dir", default=None,
                        help="where logs go (default: the head's session directory)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT)
    args = parser.parse_args(argv)
    gcs, token = resolve_cluster(args.address)
    session_dir = args.session_dir
    if session_dir is None:
        current = read_current_cluster() or {}
        if f"tcp:{current.get('address')}" != gcs or not current.get("session_dir"):
            parser.error("--session-dir is needed for a cluster not started on this machine")
        session_dir = current["session_dir"]
    os.makedirs(session_dir, exist_ok=True)
    uvicorn.run(app(gcs_address=gcs, token=token, session_dir=session_dir),
                host=args.host, port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
