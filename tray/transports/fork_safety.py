"""Fork safety for tray's sockets: what a child forked inside a task may not touch.

A task may fork (``os.fork``, ``multiprocessing`` with the fork start
method). The child shares the parent's sockets and its trio loop's epoll
instance: if it went on reading or writing them, it would steal the parent's
messages and events or answer calls in its place. After a fork the child's
copies of every tray socket point at /dev/null and its trio loop gets an
epoll of its own; a child that returns from the task into tray, or calls tray
at all, exits at once (status 0) without a word on the wire or a write to the
object store (``inert_after_fork``), and the parent answers the call.

The TCP transport (``tcp``, ``tcp_streams``) registers every socket it opens
here (``_track``) and checks ``_forked_child`` before each use of a
connection; the zygote's workers, forked before any connection, start afresh
(``begin_fresh_process``)."""

from __future__ import annotations

import os
import select
import weakref

from .. import _trio_private

_forked_child = False
# Every socket the transport opened and has not closed (WeakSet: a trio socket
# that is garbage collected has been closed).
_sockets: weakref.WeakSet = weakref.WeakSet()


def _track(sock) -> None:
    _sockets.add(sock)


def _after_fork_in_child() -> None:
    global _forked_child
    _forked_child = True
    placeholder = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
    try:
        for sock in list(_sockets):
            fd = sock.fileno()
            if fd >= 0:
                # The child's copy now reads EOF-less errors from /dev/null;
                # the parent's connection is untouched (it holds its own
                # reference to the socket, so no FIN is sent either).
                os.dup2(placeholder, fd, inheritable=False)
    finally:
        os.close(placeholder)
    _give_trio_loop_its_own_epoll()


def begin_fresh_process() -> None:
    """In a worker forked by the node's zygote (tray/backends/local/zygote):
    the zygote held no connections and ran no loop, so the child is a new
    process, not a copy of one using tray; undo what the fork hook assumed."""
    global _forked_child
    _forked_child = False


def _give_trio_loop_its_own_epoll() -> None:
    """The trio loop of the forking thread (if any) shares its epoll instance
    with the parent; trio registers fds with EPOLLONESHOT, so one epoll_wait
    in the child would take events the parent is waiting for. Point the
    child's epoll descriptor at a new, empty instance."""
    epoll = _trio_private.current_epoll()
    if epoll is None:  # no trio loop in this thread, or not the epoll backend
        return
    fresh = select.epoll()
    try:
        os.dup2(fresh.fileno(), epoll.fileno(), inheritable=False)
    finally:
        fresh.close()


def _exit_forked_child(*_args, **_kwargs) -> None:
    os.write(2, f"tray: process {os.getpid()}, forked inside a task, returned to tray or "
                "called it; it exits now (the parent answers the call)\n".encode())
    os._exit(0)


os.register_at_fork(after_in_child=_after_fork_in_child)


def inert_after_fork(obj, *method_names: str) -> None:
    """In a child forked from this process, calling one of ``obj``'s
    ``method_names`` ends the child as using a connection does. For what the
    child shares with its parent besides sockets: the object store, whose
    objects are the parent's to write and free (a child returning a large
    value from the task would otherwise put it under the parent's object id)."""
    target = weakref.ref(obj)

    def after_in_child() -> None:
        live = target()
        if live is not None:
            for name in method_names:
                setattr(live, name, _exit_forked_child)

    os.register_at_fork(after_in_child=after_in_child)
