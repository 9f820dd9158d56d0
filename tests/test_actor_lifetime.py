"""Actor lifetime, as Ray's: a non-detached actor ends when the last handle
to it is gone anywhere in the cluster (the creator's and every borrower's)
and the calls already made have finished; ``tray.actor.exit_actor()`` and
``handle.__ray_terminate__.remote()`` end it from inside; detached actors
outlive their handles.

Most tests run on the simulator (virtual time: waiting is free); the ones
where real processes matter (a worker process that exits, atexit handlers)
run on both backends or on the local one."""

from __future__ import annotations

import gc
import os
import time

import pytest

import tray
from tray.exceptions import ActorDiedError

BACKENDS = [b for b in os.environ.get("TRAY_TEST_BACKENDS", "sim,local").split(",") if b]


def _info(actor_id: str):
    from tray.api.blocking import gcs_call

    return gcs_call("get_actor", actor_id)


def _state(actor_id: str) -> str:
    return _info(actor_id).state


def _eventually(condition, timeout_s: float = 20.0, step_s: float = 0.25) -> bool:
    """Poll every ``step_s`` for up to ``timeout_s`` of the driver's sleep
    (virtual time in the simulator, where the driver's ``time.time`` stays
    real, so the polls are counted; wall time on real processes)."""
    for _ in range(int(timeout_s / step_s)):
        gc.collect()
        if condition():
            return True
        time.sleep(step_s)
    return condition()


def _ends(actor_id: str, timeout_s: float = 20.0) -> bool:
    return _eventually(lambda: _state(actor_id) == "DEAD", timeout_s)


def _stays_alive(actor_id: str, seconds: float, step_s: float = 0.25) -> bool:
    """Never dead during ``seconds`` of the driver's sleep (virtual in the
    simulator), and alive at the end."""
    for _ in range(int(seconds / step_s)):
        gc.collect()
        if _state(actor_id) == "DEAD":
            return False
        time.sleep(step_s)
    return _state(actor_id) == "ALIVE"


@pytest.fixture
def sim():
    tray.init(backend="sim", num_cpus=4, seed=0)
    yield
    tray.shutdown()


@tray.remote
class Counter:
    def __init__(self):
        self.value = 0

    def inc(self, delay_s: float = 0.0):
        if delay_s:
            time.sleep(delay_s)
        self.value += 1
        return self.value

    def pid(self):
        return os.getpid()

    def actor_id(self):
        return tray.get_runtime_context().get_actor_id()

    def bye(self):
        tray.actor.exit_actor()
        return "not reached"

    def swallow_exit(self):
        try:
            tray.actor.exit_actor()
        except Exception:  # noqa: BLE001 - exit_actor's SystemExit is not an Exception
            return "swallowed"


@tray.remote
class Holder:
    """Keeps whatever it is given (a borrower of the refs inside)."""

    def hold(self, boxed):
        self.kept = boxed[0]
        return True

    def hold_named(self, name):
        self.kept = tray.get_actor(name)
        return True

    def call(self):
        return tray.get(self.kept.inc.remote())

    def drop(self):
        self.kept = None
        gc.collect()
        return True


@tray.remote
class Signal:
    def __init__(self):
        self.sent = False

    def send(self):
        self.sent = True

    def is_sent(self):
        return self.sent


def _wait_signal(signal) -> None:
    while not tray.get(signal.is_sent.remote()):
        time.sleep(0.5)


# ============================================================ by handles

def test_an_actor_ends_when_its_only_handle_is_dropped(one_node):
    # Ray's test_actor_deletion: the actor's process exits and its
    # resources come back.
    actor = Counter.options(num_cpus=1).remote()
    pid = tray.get(actor.pid.remote())
    actor_id = actor._actor_id
    assert _state(actor_id) == "ALIVE"
    del actor
    assert _ends(actor_id)
    assert "went out of scope" in _info(actor_id).death_cause.reason
    assert _info(actor_id).restarts == 0
    assert _eventually(lambda: tray.available_resources().get("CPU") == 4.0)
    if one_node.backend == "local":
        def exited():
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return True
            return False
        assert _eventually(exited)


def test_many_actors_end_with_their_list(sim):
    actors = [Counter.remote() for _ in range(5)]
    ids = tray.get([a.actor_id.remote() for a in actors])
    assert all(_state(actor_id) == "ALIVE" for actor_id in ids)
    actors = None
    assert all(_ends(actor_id) for actor_id in ids)


def test_calls_made_before_the_handle_goes_finish_first(one_node):
    # Ray's test_actor_method_deletion, with calls still queued.
    assert tray.get(Counter.remote().inc.remote()) == 1
    actor = Counter.remote()
    actor_id = actor._actor_id
    refs = [actor.inc.remote(delay_s=0.2) for _ in range(3)]
    del actor
    assert tray.get(refs) == [1, 2, 3]
    assert _ends(actor_id)


def test_fire_and_forget_calls_keep_the_actor_until_they_ran(sim):
    counter = Counter.remote()
    actor_id = counter._actor_id
    for _ in range(3):
        counter.inc.remote(delay_s=1.0)  # results dropped at once
    del counter
    gc.collect()
    # The three calls take 3 s of virtual time; the actor ends after them.
    assert _stays_alive(actor_id, 2.5)
    assert _ends(actor_id)


def test_a_borrower_in_a_task_keeps_the_actor_alive(sim):
    # Ray's test_distributed_actor_handle_deletion, one level deeper: the
    # task hands the handle on to a nested task that calls it later.
    @tray.remote
    def nested(actor, signal):
        _wait_signal(signal)
        return tray.get(actor.inc.remote())

    @tray.remote
    def outer(actor, signal):
        return tray.get(nested.remote(actor, signal))

    signal = Signal.remote()
    actor = Counter.remote()
    actor_id = actor._actor_id
    result = outer.remote(actor, signal)
    del actor
    assert _stays_alive(actor_id, 2.0)
    signal.send.remote()
    assert tray.get(result) == 1
    assert _ends(actor_id)


def test_a_handle_kept_by_an_actor_keeps_it_alive(one_node):
    actor = Counter.remote()
    actor_id = actor._actor_id
    holder = Holder.remote()
    assert tray.get(holder.hold.remote([actor]))
    del actor
    assert _stays_alive(actor_id, 2.0)
    assert tray.get(holder.call.remote()) == 1
    assert tray.get(holder.drop.remote())
    assert _ends(actor_id)


def test_a_handle_inside_a_put_object_keeps_it_alive(sim):
    actor = Counter.remote()
    actor_id = actor._actor_id
    box = tray.put({"actor": actor})
    del actor
    assert _stays_alive(actor_id, 1.5)
    again = tray.get(box)["actor"]
    assert tray.get(again.inc.remote()) == 1
    del again
    assert _stays_alive(actor_id, 1.0)  # the box still holds it
    del box
    assert _ends(actor_id)


def test_a_handle_passed_to_a_constructor_keeps_the_actor_alive(sim):
    @tray.remote
    class User:
        def __init__(self, boxed):
            self.actor = boxed[0]

        def call(self):
            return tray.get(self.actor.inc.remote())

    actor = Counter.remote()
    actor_id = actor._actor_id
    user = User.remote([actor])
    del actor
    assert _stays_alive(actor_id, 1.5)
    assert tray.get(user.call.remote()) == 1
    del user
    assert _ends(actor_id)


def test_a_handle_returned_from_a_task(sim):
    # The actor is owned by the task's worker; the driver borrows it.
    @tray.remote
    def make():
        actor = Counter.remote()
        tray.get(actor.inc.remote())
        return actor

    actor = tray.get(make.remote())
    actor_id = actor._actor_id
    assert _stays_alive(actor_id, 1.5)
    assert tray.get(actor.inc.remote()) == 2
    del actor
    assert _ends(actor_id)


def test_a_handle_returned_from_an_actor_method(sim):
    @tray.remote
    class Outer:
        def __init__(self):
            self.inner = Counter.remote()

        def get(self):
            return [self.inner]

        def forget(self):
            self.inner = None
            gc.collect()
            return True

    outer = Outer.remote()
    inner = tray.get(outer.get.remote())[0]
    actor_id = inner._actor_id
    assert tray.get(outer.forget.remote())
    assert _stays_alive(actor_id, 2.0)  # the driver's copy keeps it
    assert tray.get(inner.inc.remote()) == 1
    del inner
    assert _ends(actor_id)
    assert _state(outer._actor_id) == "ALIVE"


def test_a_named_actor_ends_with_its_handles_get_actor_ones_included(sim):
    # Ray's test_keep_calling_get_actor: named is not detached.
    actor = Counter.options(name="counter").remote()
    actor_id = actor._actor_id
    found = tray.get_actor("counter")
    del actor
    assert _stays_alive(actor_id, 1.5)
    assert tray.get(found.inc.remote()) == 1
    del found
    assert _ends(actor_id)
    with pytest.raises(ValueError):
        tray.get_actor("counter")


def test_get_actor_in_another_process_borrows_the_handle(sim):
    actor = Counter.options(name="shared").remote()
    actor_id = actor._actor_id
    holder = Holder.remote()
    assert tray.get(holder.hold_named.remote("shared"))
    del actor
    assert _stays_alive(actor_id, 1.5)
    assert tray.get(holder.call.remote()) == 1
    assert tray.get(holder.drop.remote())
    assert _ends(actor_id)


def test_get_if_exists_borrows_the_existing_actor(sim):
    first = Counter.options(name="once", get_if_exists=True).remote()
    actor_id = first._actor_id
    second = Counter.options(name="once", get_if_exists=True).remote()
    assert second._actor_id == actor_id
    del first
    assert _stays_alive(actor_id, 1.5)
    assert tray.get(second.inc.remote()) == 1
    del second
    assert _ends(actor_id)


def test_a_detached_actor_outlives_its_handles(sim):
    actor = Counter.options(name="keeper", lifetime="detached").remote()
    actor_id = actor._actor_id
    assert tray.get(actor.inc.remote()) == 1
    del actor
    assert _stays_alive(actor_id, 2.0)
    again = tray.get_actor("keeper")
    assert tray.get(again.inc.remote()) == 2
    tray.kill(again)
    assert _ends(actor_id)


def test_the_owner_dying_still_ends_its_actors(sim):
    @tray.remote
    class Owner:
        def make(self):
            self.child = Counter.remote()
            return [self.child]

        def crash(self):
            os._exit(1)

    owner = Owner.options(max_restarts=0).remote()
    child = tray.get(owner.make.remote())[0]
    actor_id = child._actor_id
    owner.crash.remote()
    assert _ends(actor_id)
    with pytest.raises(ActorDiedError):
        tray.get(child.inc.remote())


def test_lifetime_by_handles_replays_identically():
    def run() -> str:
        tray.init(backend="sim", num_cpus=4, seed=3)
        try:
            holder = Holder.remote()
            for _ in range(3):
                actor = Counter.remote()
                tray.get(holder.hold.remote([actor]))
                actor.inc.remote()
                del actor
                tray.get(holder.call.remote())
            tray.get(holder.drop.remote())
            time.sleep(2.0)
            return tray.simtest.trace_digest()
        finally:
            tray.shutdown()

    import tray.simtest  # noqa: F401 - trace_digest

    assert run() == run()


# ============================================================== exits

def test_exit_actor_ends_the_actor_without_restart(one_node):
    actor = Counter.options(max_restarts=3).remote()
    actor_id = actor._actor_id
    assert tray.get(actor.inc.remote()) == 1
    with pytest.raises(ActorDiedError, match="exit_actor"):
        tray.get(actor.bye.remote())
    with pytest.raises(ActorDiedError):
        tray.get(actor.inc.remote())
    assert _ends(actor_id)
    info = _info(actor_id)
    assert info.restarts == 0
    assert "exit_actor" in info.death_cause.reason
    time.sleep(1.0)
    assert _state(actor_id) == "DEAD"  # and stays so: no restart
    with pytest.raises(ActorDiedError, match="exit_actor"):
        tray.get(actor.inc.remote())


def test_exit_actor_is_not_swallowed_by_except_exception(sim):
    actor = Counter.remote()
    with pytest.raises(ActorDiedError):
        tray.get(actor.swallow_exit.remote())
    with pytest.raises(ActorDiedError):
        tray.get(actor.inc.remote())


def test_exit_actor_in_an_async_actor(sim):
    @tray.remote
    class Async:
        async def ping(self):
            return "pong"

        async def bye(self):
            tray.actor.exit_actor()

    actor = Async.remote()
    assert tray.get(actor.ping.remote()) == "pong"
    with pytest.raises(ActorDiedError, match="exit_actor"):
        tray.get(actor.bye.remote())
    with pytest.raises(ActorDiedError):
        tray.get(actor.ping.remote())
    assert _ends(actor._actor_id)


def test_exit_actor_lets_the_calls_already_running_finish(sim):
    # Ray: in a concurrent actor, calls running when one exits complete.
    @tray.remote(max_concurrency=4)
    class Busy:
        async def slow(self):
            import asyncio

            await asyncio.sleep(2.0)
            return "done"

        async def bye(self):
            tray.actor.exit_actor()

    actor = Busy.remote()
    slow = [actor.slow.remote() for _ in range(2)]
    time.sleep(0.5)  # both are running
    with pytest.raises(ActorDiedError):
        tray.get(actor.bye.remote())
    assert tray.get(slow) == ["done", "done"]
    with pytest.raises(ActorDiedError):
        tray.get(actor.slow.remote())
    assert _ends(actor._actor_id)


def test_sys_exit_in_a_method_ends_the_actor(sim):
    @tray.remote
    class Quitter:
        def quit(self):
            raise SystemExit(0)

        def ping(self):
            return "pong"

    actor = Quitter.options(max_restarts=2).remote()
    with pytest.raises(ActorDiedError, match="sys.exit"):
        tray.get(actor.quit.remote())
    with pytest.raises(ActorDiedError):
        tray.get(actor.ping.remote())
    assert _info(actor._actor_id).restarts == 0


def test_exit_actor_outside_an_actor_is_a_type_error(sim):
    with pytest.raises(TypeError, match="inside an actor"):
        tray.actor.exit_actor()

    @tray.remote
    def task():
        try:
            tray.actor.exit_actor()
        except TypeError as error:
            return str(error)
        return "no error"

    assert "inside an actor" in tray.get(task.remote())


def test_exit_actor_in_a_constructor_is_refused_with_a_clear_error(sim):
    @tray.remote
    class Early:
        def __init__(self):
            tray.actor.exit_actor()

        def ping(self):
            return "pong"

    actor = Early.remote()
    with pytest.raises(ActorDiedError, match="constructor is not supported"):
        tray.get(actor.ping.remote())


def test_ray_terminate_runs_after_the_calls_queued_before_it(one_node):
    actor = Counter.options(max_restarts=3).remote()
    actor_id = actor._actor_id
    refs = [actor.inc.remote(delay_s=0.1) for _ in range(3)]
    done = actor.__ray_terminate__.remote()
    assert tray.get(refs) == [1, 2, 3]
    with pytest.raises(ActorDiedError):
        tray.get(done)
    with pytest.raises(ActorDiedError):
        tray.get(actor.inc.remote())
    assert _ends(actor_id)
    assert _info(actor_id).restarts == 0


def test_ray_ready(sim):
    actor = Counter.remote()
    assert tray.get(actor.__ray_ready__.remote()) is True
    with pytest.raises(AttributeError):
        getattr(actor, "__no_such_builtin__")  # noqa: B009


@pytest.mark.skipif("local" not in BACKENDS, reason="atexit needs real processes")
def test_atexit_handlers_run_on_graceful_exits_not_on_kill(tmp_path):
    # Ray's test_atexit_handler: exit_actor, __ray_terminate__ and the last
    # handle going run the actor's atexit handlers; tray.kill does not.
    @tray.remote
    class Writer:
        def __init__(self, path):
            import atexit

            def write():
                with open(path, "w") as file:
                    file.write("bye")
            atexit.register(write)

        def ready(self):
            return True

        def bye(self):
            tray.actor.exit_actor()

    tray.init(backend="local", num_cpus=4)
    try:
        paths = {how: tmp_path / f"{how}.txt" for how in
                 ("exit_actor", "terminate", "out_of_scope", "kill")}
        actors = {how: Writer.remote(str(path)) for how, path in paths.items()}
        assert all(tray.get([a.ready.remote() for a in actors.values()]))
        tray.wait([actors["exit_actor"].bye.remote()])
        tray.wait([actors["terminate"].__ray_terminate__.remote()])
        tray.kill(actors["kill"])
        ids = {how: actor._actor_id for how, actor in actors.items()}
        actors = None
        for how in ("exit_actor", "terminate", "out_of_scope"):
            assert _eventually(lambda how=how: paths[how].exists() and
                               paths[how].read_text() == "bye"), how
        assert all(_ends(actor_id) for actor_id in ids.values())
        assert not paths["kill"].exists()
    finally:
        tray.shutdown()
