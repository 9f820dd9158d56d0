"""A fork server for a node's worker processes (a "zygote", as Android's).

Starting a worker with ``python -m tray.backends.local.worker`` costs
~0.2–0.3 s of CPU before it can register, nearly all of it importing
(trio, cloudpickle, greenback, tray's ~370 modules); a node that prestarts
one worker per CPU, or creates a thousand actors, pays it each time, on a
machine whose cores the user wanted for their tasks. The node process has
imported all that already, so it forks its zygote first thing (``prefork``,
before its event loop, its logging or any connection), and the zygote forks
a worker per request: a fork of a process that has only imported modules
(no threads, no event loop, no connections) costs a few milliseconds, and
the child runs ``worker.main`` exactly as a fresh process would.

Only workers whose process needs nothing the zygote cannot give are forked:
the node's own environment (a runtime_env's ``env_vars`` are read at
interpreter start, by libraries imported since, so those workers are
started fresh), and the node's own interpreter (``TRAY_WORKER_PYTHON``, a
pip runtime_env's Python: fresh). ``TRAY_WORKER_FORK=0`` turns it off.
Ray starts every worker fresh (README, "Differences from Ray").

The protocol, over one ``SOCK_SEQPACKET`` socket pair (a message each):

* node -> zygote: ``("start", worker_id, argv, env)`` with the worker's
  stdout and stderr pipes as ancillary file descriptors;
* zygote -> node: ``("started", worker_id, pid)``, and for every child that
  ends ``("exited", pid, returncode)`` (the zygote is their parent, so it
  reaps them; ``returncode`` as ``subprocess.Popen``'s: ``-N`` for signal N).

The zygote ends when the node's end of the socket closes (the node exited),
killing the workers it forked first; the node waits for it before it
removes the session's directories."""

from __future__ import annotations

import atexit
import collections
import gc
import logging
import os
import pickle
import select
import signal
import socket
import subprocess
import sys
import time
import traceback

import trio

logger = logging.getLogger("tray.node")

MAX_MESSAGE_BYTES = 1 << 20  # a request is argv plus an environment: far less
# A forked worker's command line is its zygote's (``ps`` shows the zygote's
# arguments); its process name (``ps -o comm``, ``top``, psutil's
# ``name()``) says what it is.
WORKER_PROCESS_NAME = "tray::worker"
ZYGOTE_PROCESS_NAME = "tray::zygote"
# How long a stopping node waits for its zygote to kill and reap its workers.
CLOSE_TIMEOUT_S = 5.0


def _name_process(name: str) -> None:
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(15, name.encode()[:15], 0, 0, 0)  # PR_SET_NAME
    except (OSError, AttributeError):
        pass  # not Linux: the name stays python's


# ============================================================ the node's end


class ForkedWorker:
    """A worker the zygote forked, with the part of ``subprocess.Popen`` the
    node uses (``pid``, ``poll``, ``returncode``, ``kill``), fed by the
    zygote's reports. ``pid`` is None until the zygote has forked it."""

    def __init__(self) -> None:
        self.pid: int | None = None
        self.returncode: int | None = None
        self.started = trio.Event()
        self._kill_when_started = False
        self.orphaned = False  # the zygote died: nobody reports this one's exit

    def poll(self) -> int | None:
        if self.orphaned and self.returncode is None and self.pid is not None:
            try:
                os.kill(self.pid, 0)
            except ProcessLookupError:
                self.returncode = -signal.SIGKILL  # (its real status went to init)
        return self.returncode

    def kill(self) -> None:
        if self.returncode is not None:
            return
        if self.pid is None:
            self._kill_when_started = True
            return
        try:
            os.kill(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def _forked(self, pid: int) -> None:
        self.pid = pid
        self.started.set()
        if self._kill_when_started:
            self.kill()


class ZygoteProcess:
    """The zygote as its node sees it (the part of ``subprocess.Popen`` the
    node uses): the node's own child, forked by ``prefork``."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:
                self.returncode = -signal.SIGKILL  # reaped elsewhere: gone
                return self.returncode
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float) -> int:
        deadline = time.monotonic() + timeout
        while self.poll() is None:
            if time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(f"zygote {self.pid}", timeout)
            time.sleep(0.002)
        return self.returncode

    def kill(self) -> None:
        if self.poll() is None:
            os.kill(self.pid, signal.SIGKILL)


def prefork() -> tuple[socket.socket, ZygoteProcess] | None:
    """Fork the node's zygote: called by the node process first thing,
    before it configures logging, runs its event loop or opens a
    connection. The node has imported nearly all a worker needs (all but
    three of ~370 modules), so its fork is a zygote at no cost, ready at
    once; a zygote started as a fresh interpreter spent ~0.25 s of CPU
    importing them again, on the path of every cluster's first task. None:
    no fork (workers then start fresh)."""
    from . import worker  # noqa: F401 - imported once, shared with every fork

    # What the imports made is out of the cyclic collector's sight from
    # here on, in the node, its zygote and every worker forked from it: a
    # full collection walks only what the process made since (tens of
    # thousands fewer objects: fewer milliseconds-long pauses on the task
    # path), and never writes to those objects' pages, which the forks
    # then keep sharing (Python's advice for fork servers).
    gc.freeze()
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        pid = os.fork()
    except OSError as error:
        logger.warning("tray: no zygote (%s); workers start as fresh processes", error)
        ours.close()
        theirs.close()
        return None
    if pid == 0:  # the zygote
        code = 0
        try:
            ours.close()
            stdin = os.open(os.devnull, os.O_RDONLY)
            os.dup2(stdin, 0)
            os.close(stdin)
            _name_process(ZYGOTE_PROCESS_NAME)
            try:
                serve(theirs)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the node is gone
        except BaseException:  # noqa: BLE001 - the zygote's end: said, then exit
            traceback.print_exc()
            code = 1
        finally:
            os._exit(code)
    theirs.close()
    return ours, ZygoteProcess(pid)


class Zygote:
    """The node's handle on its zygote: requests go out in order, replies
    and exits come back to one reader task."""

    def __init__(self, sock: socket.socket, process: ZygoteProcess) -> None:
        self._sock = sock
        self._process = process
        self.alive = True
        self._unsent: collections.deque = collections.deque()  # (message, fds, handle)
        self._sending = trio.Event()
        self._forking: dict[str, ForkedWorker] = {}  # by worker id, until forked
        self._children: dict[int, ForkedWorker] = {}  # by pid, until they exit
        self.forked = 0

    @classmethod
    def start(cls, nursery: trio.Nursery, forked: tuple) -> Zygote:
        """Serve the zygote ``prefork`` made."""
        ours, process = forked
        ours.setblocking(False)
        zygote = cls(ours, process)
        nursery.start_soon(zygote._send_requests)
        nursery.start_soon(zygote._read_reports)
        return zygote

    def fork(self, worker_id: str, argv: list, env: dict, stdout_fd: int,
             stderr_fd: int) -> ForkedWorker:
        """Ask for a worker; the pipes are the child's stdout and stderr (the
        caller closes its copies once this returns: they travel dup'ed)."""
        handle = ForkedWorker()
        message = pickle.dumps(("start", worker_id, argv, env))
        self._unsent.append((message, [os.dup(stdout_fd), os.dup(stderr_fd)], worker_id, handle))
        self._sending.set()
        return handle

    def reap(self) -> None:
        """Collect the zygote's exit status once it has gone (no zombie)."""
        if not self.alive:
            self._process.poll()

    def close(self) -> None:
        """The node stops: the zygote ends when its socket closes, with
        every worker it forked; this waits for that (a few milliseconds)."""
        self.alive = False
        trio.lowlevel.notify_closing(self._sock)
        self._sock.close()
        try:
            self._process.wait(timeout=CLOSE_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()

    async def _send_requests(self) -> None:
        while True:
            await self._sending.wait()
            self._sending = trio.Event()
            while self._unsent and self.alive:
                message, fds, worker_id, handle = self._unsent[0]
                try:
                    await trio.lowlevel.wait_writable(self._sock)
                    socket.send_fds(self._sock, [message], fds)
                except BlockingIOError:
                    continue
                except OSError:
                    self._died()
                    return
                self._unsent.popleft()
                for fd in fds:
                    os.close(fd)
                self._forking[worker_id] = handle

    async def _read_reports(self) -> None:
        try:
            while True:
                await trio.lowlevel.wait_readable(self._sock)
                try:
                    data = self._sock.recv(4096)
                except BlockingIOError:
                    continue
                if not data:
                    break
                kind, key, value = pickle.loads(data)
                if kind == "started":
                    handle = self._forking.pop(key)
                    self._children[value] = handle
                    self.forked += 1
                    handle._forked(value)
                else:  # "exited"
                    handle = self._children.pop(key, None)
                    if handle is not None:
                        handle.returncode = value
        except (OSError, trio.ClosedResourceError):
            pass
        self._died()  # (not when the node stops: its nursery's cancel skips this)

    def _died(self) -> None:
        if self.alive:
            logger.error("tray: the node's zygote (pid %d) exited; workers start as fresh "
                         "processes from now on", self._process.pid)
        self.alive = False
        for _message, fds, worker_id, handle in self._unsent:
            for fd in fds:
                os.close(fd)
            self._forking[worker_id] = handle
        self._unsent.clear()
        for handle in self._forking.values():
            handle.returncode = 1  # never forked: reported as a worker that failed to start
            handle.started.set()
        self._forking.clear()
        for handle in self._children.values():
            handle.orphaned = True
        self._children.clear()


# ========================================================= the zygote's end


def serve(sock: socket.socket) -> None:
    """The zygote's loop: fork on requests, report children's exits. When
    the node is gone, so are the workers it forked."""
    from . import worker

    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    os.set_blocking(wake_r, False)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.set_wakeup_fd(wake_w)
    # The node stops the zygote with its process group; SIGINT (a ^C in the
    # terminal of a `tray start --block`) is the node's to handle.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    children: set[int] = set()
    try:
        while True:
            readable, _, _ = select.select([sock, wake_r], [], [])
            if wake_r in readable:
                try:
                    os.read(wake_r, 4096)
                except BlockingIOError:
                    pass
            _report_exits(sock, children)
            if sock in readable:
                data, fds, _, _ = socket.recv_fds(sock, MAX_MESSAGE_BYTES, 2)
                if not data:
                    return  # the node is gone
                _kind, worker_id, argv, env = pickle.loads(data)
                sys.stdout.flush()
                sys.stderr.flush()
                pid = os.fork()
                if pid == 0:
                    _run_child(worker, argv, env, fds, (sock.fileno(), wake_r, wake_w))
                children.add(pid)
                for fd in fds:
                    os.close(fd)
                sock.send(pickle.dumps(("started", worker_id, pid)))
    finally:
        # The node killed the workers it knew of; a request it sent just
        # before it stopped may have been forked since (CI: such a worker
        # made the session's directories again after the node removed them).
        _kill_children(children)


def _report_exits(sock: socket.socket, children: set[int]) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        children.discard(pid)
        sock.send(pickle.dumps(("exited", pid, os.waitstatus_to_exitcode(status))))


def _kill_children(children: set[int]) -> None:
    for pid in children:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    for pid in children:
        try:
            os.waitpid(pid, 0)
        except ChildProcessError:
            pass


def _run_child(worker, argv: list, env: dict, fds: list, zygote_fds: tuple) -> None:
    """In the forked child: become the worker a fresh interpreter would be,
    run it, and never return into the zygote's loop."""
    code = 1
    try:
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        for fd in zygote_fds:
            os.close(fd)
        stdin = os.open(os.devnull, os.O_RDONLY)
        os.dup2(stdin, 0)
        os.dup2(fds[0], 1)
        os.dup2(fds[1], 2)
        for fd in (stdin, *fds):
            os.close(fd)
        os.environ.clear()
        os.environ.update(env)
        sys.argv = [worker.__file__, *argv]  # as `python -m tray.backends.local.worker` has
        _name_process(WORKER_PROCESS_NAME)
        from ...transports import fork_safety

        fork_safety.begin_fresh_process()  # forked before any connection: nothing to make inert
        try:
            worker.main(argv)
            code = 0
        except SystemExit as stop:
            if stop.code is None or isinstance(stop.code, int):
                code = stop.code or 0
            else:
                print(stop.code, file=sys.stderr)
        except BaseException:  # noqa: BLE001 - the worker's end, reported as a fresh one's
            traceback.print_exc()
        atexit._run_exitfuncs()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)

