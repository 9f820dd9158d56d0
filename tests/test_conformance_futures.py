"""ObjectRefs as futures: ``ref.future()``, ``ref.as_future()`` and
``await ref`` from asyncio code in the driver, as Ray's (Ray's tests:
test_basic*.py and test_asyncio.py on ``ObjectRef.future`` / ``as_future``).

On the local backend the driver's loop has a thread of its own and resolves
the future by itself; in the simulator the future completes while the
simulation runs (any blocking call, ``result()``, the driver's
``time.sleep``, or an ``await`` of the ref)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import time

import pytest

import tray
import tray.exceptions as tex
import tray.simtest


def run_asyncio(coroutine):
    """Run ``coroutine`` on a standard asyncio loop, as ``asyncio.run`` does
    in a process that has not imported trio-asyncio (which tray's async
    actors import, and this module's tests create some; ``asyncio.run`` then
    runs trio-asyncio's loop: see test_await_under_trio_asyncio_s_default_loop)."""
    with asyncio.Runner(loop_factory=asyncio.SelectorEventLoop) as runner:
        return runner.run(coroutine)


@tray.remote
def square(x, delay_s=0.0):
    time.sleep(delay_s)
    return x * x


@tray.remote
def fails(message):
    raise ValueError(message)


@tray.remote
def wait_on_future_inside(delay_s):
    # A task's own thread is its worker's loop: result() runs that loop
    # (through greenback) instead of blocking it.
    future = square.remote(7, delay_s).future()
    return future.result(), future.done()


def test_future_is_a_concurrent_future_with_the_value(one_node):
    future = square.remote(3, one_node.tick_s).future()
    assert isinstance(future, concurrent.futures.Future)
    assert not future.running()  # as Ray: always False
    assert future.result() == 9
    assert future.done() and future.exception() is None


def test_future_carries_the_task_error(one_node):
    future = fails.remote("bad input").future()
    error = future.exception()
    assert isinstance(error, tex.TaskError) and isinstance(error, ValueError)
    assert "bad input" in str(error)
    with pytest.raises(ValueError, match="bad input"):
        future.result()


def test_future_done_callback_runs_once_with_the_future(one_node):
    seen = []
    future = square.remote(5).future()
    future.add_done_callback(seen.append)
    assert future.result() == 25
    deadline = time.monotonic() + 10
    while not seen and time.monotonic() < deadline:  # the loop thread runs it (local)
        time.sleep(0.01)
    assert seen == [future]


def test_future_result_times_out_while_the_task_runs(one_node):
    slow = square.remote(2, 30 * one_node.tick_s)
    future = slow.future()
    with pytest.raises(TimeoutError):
        future.result(timeout=one_node.tick_s)
    assert not future.done()
    tray.cancel(slow, force=True)
    with pytest.raises(tex.TaskCancelledError):
        future.result()


def test_future_holds_its_object(one_node):
    ref = square.remote(6, one_node.tick_s)
    future = ref.future()
    del ref  # the future alone keeps the object alive, as Ray's
    assert future.result() == 36


def test_futures_work_with_concurrent_futures_helpers(one_node):
    futures = [square.remote(i).future() for i in range(4)]
    if one_node.is_sim:
        # In the simulator a future completes while the simulation runs:
        # a blocking call runs it (concurrent.futures.wait alone does not).
        tray.wait([f.object_ref for f in futures], num_returns=4)
    done, not_done = concurrent.futures.wait(futures, timeout=30)
    assert not not_done
    assert sorted(f.result() for f in done) == [0, 1, 4, 9]


def test_future_inside_a_task(one_node):
    assert tray.get(wait_on_future_inside.remote(one_node.tick_s)) == (49, True)


def test_await_refs_from_asyncio_in_the_driver(one_node):
    async def main():
        one = await square.remote(3)
        both = await asyncio.gather(square.remote(4, one_node.tick_s), square.remote(5))
        with pytest.raises(ValueError, match="from asyncio"):
            await fails.remote("from asyncio")
        return one, both

    assert run_asyncio(main()) == (9, [16, 25])


def test_as_future_is_an_asyncio_future(one_node):
    async def main():
        future = square.remote(8).as_future()
        assert isinstance(future, asyncio.Future)
        return await asyncio.wait_for(future, timeout=60)

    assert run_asyncio(main()) == 64


def test_other_asyncio_tasks_run_while_a_ref_is_awaited(one_node):
    ticks = []

    async def ticker():
        for i in range(3):
            ticks.append(i)
            await asyncio.sleep(0)

    async def main():
        value, _ = await asyncio.gather(square.remote(9, 2 * one_node.tick_s), ticker())
        return value

    assert run_asyncio(main()) == 81
    assert ticks == [0, 1, 2]


def test_in_the_simulator_a_future_completes_as_the_simulation_runs():
    tray.init(backend="sim", seed=3)
    future = square.remote(4, 10.0).future()
    assert not future.done()  # nothing ran the simulation yet
    time.sleep(20)  # the driver's sleep runs 20 virtual seconds
    assert future.done() and future.result() == 16


def test_futures_and_await_replay_identically():
    def run() -> str:
        tray.init(backend="sim", seed=11, num_nodes=2)
        try:
            futures = [square.remote(i, 0.5 * i).future() for i in range(5)]

            async def main():
                return await asyncio.gather(*(square.remote(i) for i in range(5)))

            values = run_asyncio(main())
            assert [f.result() for f in futures] == values
        finally:
            tray.shutdown()
        return tray.simtest.trace_digest()

    assert run() == run()


@tray.remote(max_concurrency=2)
class Threaded:
    """A threaded actor: its methods run in threads beside the loop."""

    def value_of(self, refs):
        future = refs[0].future()
        return future.result(timeout=60), future.done()


def test_future_in_a_threaded_actor_method(one_node):
    actor = Threaded.remote()
    assert tray.get(actor.value_of.remote([square.remote(3, one_node.tick_s)])) == (9, True)


@pytest.mark.parametrize("backend_name", ["local", "sim"])
def test_await_under_trio_asyncio_s_default_loop(backend_name):
    # What a user writes: asyncio.run, which runs trio-asyncio's
    # SyncTrioEventLoop once trio-asyncio is imported (an async actor
    # imports it); a blocking call inside works too. In a fresh process.
    # Regression (sim): trio-asyncio's loop runs in a greenlet of this
    # thread with trio's run state swapped for its own, and a call from
    # there found no simulator ("must be called from async context").
    _run_asyncio_program(backend_name, "import trio_asyncio")


@pytest.mark.parametrize("backend_name", ["local", "sim"])
def test_asyncio_run_after_an_async_actor_exists(backend_name):
    # The way a program gets there: an async actor, then asyncio.run in the
    # driver, which awaits the actor's calls and blocks in tray.get.
    # (On the simulator the actor lives in the driver's process: trio-asyncio
    # is imported there, and its loop is asyncio.run's.)
    _run_asyncio_program(backend_name, f"""
        @tray.remote
        class Echo:
            async def echo(self, x):
                await asyncio.sleep(0.01)
                return x

        echo = Echo.remote()
        assert tray.get(echo.echo.remote(1)) == 1
        import sys
        assert ('trio_asyncio' in sys.modules) == {backend_name == "sim"}

        async def with_actor():
            return await echo.echo.remote(5), tray.get(echo.echo.remote(6))

        assert asyncio.run(with_actor()) == (5, 6)
    """)


@pytest.mark.parametrize("backend_name", ["local", "sim"])
def test_asyncio_run_in_a_driver_runs_a_standard_loop(backend_name):
    # ``import tray`` does not import trio-asyncio (the first async actor
    # does), so a driver's asyncio.run is asyncio's own loop, and works on
    # the simulator too.
    _run_asyncio_program(backend_name, "import sys; assert 'trio_asyncio' not in sys.modules")


def _run_asyncio_program(backend_name: str, before_run: str) -> None:
    import subprocess
    import sys
    import textwrap

    program = textwrap.dedent(f"""
        import asyncio
        import tray

        @tray.remote
        def square(x):
            return x * x

        tray.init(backend={backend_name!r}, num_cpus=1)

        async def main():
            blocking = tray.get(square.remote(2))
            return blocking, await square.remote(3)

        {textwrap.indent(textwrap.dedent(before_run), " " * 8).strip()}
        print(asyncio.run(main()), tray.get(square.remote(4)))
        tray.shutdown()
    """)
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split("\n")[-2] == "(4, 9) 16"


def test_asyncio_run_beside_an_async_actor_replays_on_the_simulator():
    """Two fresh processes, one seed: the same results and the same trace
    digest when the driver's asyncio.run (trio-asyncio's loop) awaits refs
    and blocks in tray.get."""
    import subprocess
    import sys
    import textwrap

    program = textwrap.dedent("""
        import asyncio
        import tray
        from tray.simtest import trace_digest

        tray.init(backend="sim", num_cpus=2, seed=7)

        @tray.remote
        class Echo:
            async def echo(self, x):
                await asyncio.sleep(0.01)
                return x

        @tray.remote
        def square(x):
            return x * x

        echo = Echo.remote()
        tray.get(echo.echo.remote(0))

        async def main():
            echoed = await asyncio.gather(*[echo.echo.remote(i) for i in range(20)])
            return sum(echoed), sum(tray.get([square.remote(i) for i in range(20)]))

        print(asyncio.run(main()), asyncio.run(main()), trace_digest())
        tray.shutdown()
    """)
    runs = [subprocess.run([sys.executable, "-c", program], capture_output=True, text=True,
                           timeout=120) for _ in range(2)]
    for done in runs:
        assert done.returncode == 0, done.stderr[-3000:]
        assert done.stdout.startswith("(190, 2470) (190, 2470) ")
    assert runs[0].stdout == runs[1].stdout
