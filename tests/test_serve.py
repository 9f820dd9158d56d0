"""tray.serve: the API, the controller's logic and the router, mostly on the
simulated backend (virtual time: health checks, drains and autoscaling
delays cost nothing); handle calls on both backends. HTTP is in
test_serve_http.py."""

from __future__ import annotations

import asyncio
import time

import pytest

import tray
import tray.simtest
from tray import serve
from tray.serve import _api, _autoscaling
from tray.serve.config import AutoscalingConfig
from tray.serve.exceptions import BackPressureError, RayServeException


@pytest.fixture
def sim():
    tray.init(backend="sim", num_cpus=8, seed=0)
    try:
        yield tray.simtest.cluster()
    finally:
        serve.shutdown()
        tray.shutdown()


def _advance(seconds: float) -> None:
    tray.simtest.cluster().advance(seconds)


# ============================================================== deployments


@serve.deployment(ray_actor_options={"num_cpus": 0})
class Adder:
    def __init__(self, increment: int) -> None:
        self.increment = increment

    def __call__(self, x: int) -> int:
        return x + self.increment

    async def slow(self, x: int, sleep_s: float) -> int:
        await asyncio.sleep(sleep_s)
        return x + self.increment

    def fail(self, message: str):
        raise ValueError(message)

    def count_to(self, n: int):
        yield from range(n)

    async def count_async(self, n: int):
        for i in range(n):
            await asyncio.sleep(0.01)
            yield i * 10

    def whoami(self) -> tuple:
        context = serve.get_replica_context()
        return context.app_name, context.deployment, context.replica_id


@serve.deployment(ray_actor_options={"num_cpus": 0})
def doubler(x: int) -> int:
    return 2 * x


@serve.deployment(ray_actor_options={"num_cpus": 0})
class Pipeline:
    def __init__(self, first, second) -> None:
        self.first = first
        self.second = second

    async def __call__(self, x: int) -> int:
        # A response passed to another handle call without fetching it here.
        return await self.second.remote(self.first.remote(x))

    async def both(self, x: int) -> list:
        return list(await asyncio.gather(self.first.remote(x), self.second.remote(x)))


def test_options_are_checked_where_given():
    with pytest.raises(ValueError, match="max_ongoing_requests"):
        serve.deployment(max_ongoing_requests=0)(Adder.func_or_class)
    with pytest.raises(TypeError, match="num_replicas"):
        Adder.options(num_replicas="two")
    with pytest.raises(ValueError, match="min_replicas"):
        Adder.options(autoscaling_config={"min_replicas": 3, "max_replicas": 2})
    with pytest.raises(ValueError, match="unknown autoscaling_config"):
        Adder.options(autoscaling_config={"max_replica": 2})
    with pytest.raises(ValueError, match="not both"):
        Adder.options(num_replicas=2, autoscaling_config={"max_replicas": 2})
    with pytest.raises(ValueError, match="invalid ray_actor_options"):
        Adder.options(ray_actor_options={"num_cpu": 1})
    with pytest.raises(ValueError, match="runtime_env"):
        Adder.options(ray_actor_options={"runtime_env": {"pipp": ["x"]}})
    with pytest.raises(TypeError, match="unknown option"):
        serve.deployment(num_replica=2)
    with pytest.raises(ValueError, match="max_batch_size"):
        serve.batch(max_batch_size=0)
    with pytest.raises(TypeError, match="async"):
        serve.batch(lambda items: items)
    scaled = Adder.options(num_replicas="auto")
    assert scaled.autoscaling_config.max_replicas == 100
    assert Adder.options(num_replicas=3).num_replicas == 3
    assert Adder.options(name="Renamed").name == "Renamed"


def test_applications_are_built_with_handles_and_unique_names():
    from tray.serve._deployment import build

    app = Pipeline.bind(Adder.bind(1), Adder.bind(2))
    ingress, specs = build(app, "app", "/")
    assert ingress == "Pipeline"
    assert [s.name for s in specs] == ["Adder", "Adder_1", "Pipeline"]  # Ray's renaming
    assert specs[-1].route_prefix == "/" and specs[0].route_prefix is None
    assert specs[0].version != specs[1].version  # other constructor arguments
    assert build(Adder.bind(1), "app", "/")[1][0].version == specs[0].version
    with pytest.raises(TypeError, match=r"call Adder.bind\(\)"):
        build(Adder, "app", "/")
    with pytest.raises(TypeError, match="unbound"):
        build(Pipeline.bind(Adder, Adder.bind(1)), "app", "/")
    with pytest.raises(TypeError, match="bind"):
        Adder.bind()  # the constructor needs an argument
    with pytest.raises(TypeError, match="cannot be pickled"):
        __import__("pickle").dumps(app)
    with pytest.raises(RuntimeError, match="called directly"):
        Adder(1)


# ============================================================ handle calls


def test_handle_calls_composition_streaming_and_errors(one_node):
    serve.start(proxy_location="Disabled")  # handles only (HTTP: test_serve_http.py)
    handle = serve.run(Adder.bind(10), name="adder", route_prefix="/adder")
    assert handle.remote(1).result() == 11
    assert [r.result() for r in [handle.slow.remote(i, 0.01) for i in range(6)]] == \
        [10 + i for i in range(6)]
    assert handle.options(method_name="slow").remote(5, 0.0).result() == 15
    with pytest.raises(ValueError, match="bad input"):
        handle.fail.remote("bad input").result()
    assert list(handle.options(stream=True).count_to.remote(4)) == [0, 1, 2, 3]
    assert list(handle.options(stream=True).count_async.remote(3)) == [0, 10, 20]
    with pytest.raises(TypeError, match="stream=True"):
        handle.count_to.remote(2).result()
    app_name, deployment, replica_id = handle.whoami.remote().result()
    assert (app_name, deployment) == ("adder", "Adder") and replica_id.startswith("adder#Adder#")
    # A response passed on to another call: its value reaches the replica.
    assert handle.remote(handle.remote(1)).result() == 21
    pipeline = serve.run(Pipeline.bind(Adder.bind(1), doubler.bind()), name="pipe",
                         route_prefix="/pipe")
    assert pipeline.remote(3).result() == 8
    assert pipeline.both.remote(3).result() == [4, 6]
    assert serve.get_app_handle("pipe").remote(4).result() == 10
    assert serve.get_deployment_handle("doubler", "pipe").remote(7).result() == 14
    with pytest.raises(RayServeException, match="does not exist"):
        serve.get_app_handle("nope")
    with pytest.raises(RayServeException, match="does not exist"):
        serve.get_deployment_handle("Nope", "pipe")
    status = serve.status()
    assert status.applications["pipe"].status == serve.ApplicationStatus.RUNNING
    assert set(status.applications["pipe"].deployments) == {"Adder", "doubler", "Pipeline"}
    serve.delete("pipe")
    assert "pipe" not in serve.status().applications
    with pytest.raises(RayServeException, match="does not exist"):
        serve.get_app_handle("pipe")
    serve.shutdown()
    assert serve.status().applications == {}
    with pytest.raises(ValueError):
        tray.get_actor("SERVE_CONTROLLER_ACTOR", namespace="serve")


@serve.deployment(ray_actor_options={"num_cpus": 0})
class Interruptible:
    def __init__(self) -> None:
        self.cancelled = 0

    async def wait_long(self) -> str:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        return "waited"

    def cancelled_so_far(self) -> int:
        return self.cancelled


def test_cancelling_a_response_cancels_the_request_in_its_replica(one_node):
    # As Ray Serve's: the request's asyncio task in the replica is cancelled.
    serve.start(proxy_location="Disabled")
    handle = serve.run(Interruptible.bind(), name="interruptible", route_prefix=None)
    assert handle.cancelled_so_far.remote().result() == 0
    response = handle.wait_long.remote()
    with pytest.raises(TimeoutError):
        response.result(timeout_s=0.5)  # running in its replica
    response.cancel()
    with pytest.raises(tray.exceptions.TaskCancelledError):
        response.result(timeout_s=60)
    for _ in range(200):
        if handle.cancelled_so_far.remote().result() == 1:
            break
        time.sleep(0.05)
    assert handle.cancelled_so_far.remote().result() == 1
    serve.shutdown()


@tray.remote(num_cpus=0)
def call_from_a_task(handle, values):
    return [handle.remote(v).result() for v in values]


def test_handles_travel_to_tasks(sim):
    handle = serve.run(Adder.bind(100), name="a")
    assert tray.get(call_from_a_task.remote(handle, [1, 2, 3])) == [101, 102, 103]


@serve.deployment(ray_actor_options={"num_cpus": 0,
                                     "runtime_env": {"env_vars": {"GREETING": "hello"}}})
class Greeter:
    def __call__(self, name: str) -> str:
        import os

        return f"{os.environ.get('GREETING')} {name}"


def test_replicas_run_in_their_runtime_env(sim):
    handle = serve.run(Greeter.bind(), name="greeter")
    assert handle.remote("tray").result() == "hello tray"


# ========================================================== bad deployments


def test_a_route_prefix_can_serve_one_application(sim):
    serve.run(Adder.bind(1), name="first", route_prefix="/api")
    with pytest.raises(RayServeException, match='being used by application "first"'):
        serve.run(Adder.bind(2), name="second", route_prefix="/api")
    with pytest.raises(ValueError, match="start with '/'"):
        serve.run(Adder.bind(2), name="second", route_prefix="api")
    serve.run(Adder.bind(3), name="first", route_prefix="/api")  # the same app may update
    assert serve.get_app_handle("first").remote(0).result() == 3


@serve.deployment(ray_actor_options={"num_cpus": 0})
class Broken:
    def __init__(self) -> None:
        raise RuntimeError("no model file")


def test_a_failing_constructor_makes_the_application_deploy_failed(sim):
    with pytest.raises(RayServeException, match="no model file"):
        serve.run(Broken.bind(), name="broken")
    app = serve.status().applications["broken"]
    assert app.status == serve.ApplicationStatus.DEPLOY_FAILED
    assert "no model file" in app.message
    assert app.deployments["Broken"].status == serve.DeploymentStatus.DEPLOY_FAILED
    assert "RuntimeError" in app.deployments["Broken"].message
    # Calls fail at once with the reason instead of waiting for a replica.
    with pytest.raises(RayServeException, match="failed to deploy"):
        serve.get_app_handle("broken").remote().result()
    # Fixing the code and deploying again recovers.
    serve.run(Adder.bind(5), name="broken")
    assert serve.get_app_handle("broken").remote(1).result() == 6


@serve.deployment(ray_actor_options={"num_cpus": 0}, user_config={"factor": 2})
class Configured:
    def __init__(self) -> None:
        self.factor = None

    def reconfigure(self, config: dict) -> None:
        self.factor = config["factor"]

    def __call__(self, x: int) -> tuple:
        return x * self.factor, serve.get_replica_context().replica_id


@serve.deployment(ray_actor_options={"num_cpus": 0}, user_config={"a": 1})
class NoReconfigure:
    def __call__(self) -> int:
        return 1


def test_user_config_is_applied_in_place(sim):
    handle = serve.run(Configured.bind(), name="cfg")
    value, first_replica = handle.remote(3).result()
    assert value == 6
    serve.run(Configured.options(user_config={"factor": 5}).bind(), name="cfg")
    value, replica = handle.remote(3).result()
    assert value == 15
    assert replica == first_replica  # reconfigured, not replaced
    with pytest.raises(RayServeException, match="reconfigure"):
        serve.run(NoReconfigure.bind(), name="noreconf", route_prefix=None)


# =================================================== rolling update, health


@serve.deployment(ray_actor_options={"num_cpus": 0}, num_replicas=2,
                  graceful_shutdown_wait_loop_s=0.5)
class Versioned:
    def __init__(self, version: str) -> None:
        self.version = version

    async def __call__(self, sleep_s: float) -> str:
        await asyncio.sleep(sleep_s)
        return self.version


@tray.remote(num_cpus=0)
def stream_calls(count: int, sleep_s: float) -> list:
    handle = serve.get_app_handle("versioned")
    results = []
    for _ in range(count):
        results.append(handle.remote(sleep_s).result())
    return results


def test_rolling_update_drops_no_request(sim):
    serve.run(Versioned.bind("v1"), name="versioned")
    before = {r[0] for r in _api._list_replicas("versioned", "Versioned")}
    streams = [stream_calls.remote(40, 0.05) for _ in range(3)]
    _advance(0.3)
    serve.run(Versioned.bind("v2"), name="versioned")  # new arguments: new replicas
    results = tray.get(streams)  # any error would raise here
    flat = [r for stream in results for r in stream]
    assert len(flat) == 120 and set(flat) <= {"v1", "v2"} and "v2" in flat
    for stream in results:  # each caller switches once, never back
        assert stream == sorted(stream)
    after = _api._list_replicas("versioned", "Versioned")
    assert len(after) == 2 and not before & {r[0] for r in after}
    assert serve.get_app_handle("versioned").remote(0.0).result() == "v2"


def test_in_flight_requests_finish_when_their_replica_is_stopped(sim):
    handle = serve.run(Versioned.bind("v1"), name="versioned")
    slow = [handle.remote(5.0) for _ in range(4)]  # longer than the drain loop
    serve.run(Versioned.options(num_replicas=1).bind("v1"), name="versioned")
    assert [r.result() for r in slow] == ["v1"] * 4
    assert len(_api._list_replicas("versioned", "Versioned")) == 1
    serve.delete("versioned")  # drains too
    assert "versioned" not in serve.status().applications


@serve.deployment(ray_actor_options={"num_cpus": 0}, health_check_period_s=0.5,
                  health_check_timeout_s=1.0)
class Fragile:
    def __init__(self) -> None:
        self.healthy = True

    def break_it(self) -> None:
        self.healthy = False

    def check_health(self) -> None:
        if not self.healthy:
            raise RuntimeError("lost the GPU")

    def __call__(self) -> str:
        return serve.get_replica_context().replica_id


def test_unhealthy_and_dead_replicas_are_replaced(sim):
    handle = serve.run(Fragile.bind(), name="fragile")
    first = handle.remote().result()
    handle.break_it.remote().result()
    _advance(5.0)  # three failed checks
    second = handle.remote().result()
    assert second != first
    actor = tray.get_actor(_api._list_replicas("fragile", "Fragile")[0][1], namespace="serve")
    sim.kill_worker(sim.worker_of(actor))
    try:
        handle.remote().result()
    except tray.exceptions.ActorDiedError:
        pass  # the request that found it dead; the router reports it
    _advance(3.0)
    third = handle.remote().result()
    assert third not in (first, second)
    assert serve.status().applications["fragile"].status == serve.ApplicationStatus.RUNNING


def _checkpoint_keys() -> list:
    from tray.experimental import internal_kv

    return [k.decode() for k in internal_kv._internal_kv_list("", namespace="serve")]


def _checkpoint_state() -> dict:
    import cloudpickle

    from tray.experimental import internal_kv

    return cloudpickle.loads(internal_kv._internal_kv_get("controller/state",
                                                          namespace="serve"))


def test_the_controller_recovers_its_state_after_a_crash(sim):
    handle = serve.run(Adder.bind(7), name="kept", route_prefix="/kept")
    replicas = _api._list_replicas("kept", "Adder")
    controller = tray.get_actor("SERVE_CONTROLLER_ACTOR", namespace="serve")
    sim.kill_worker(sim.worker_of(controller))  # it restarts (max_restarts=-1)
    _advance(2.0)
    assert handle.remote(1).result() == 8  # the replicas never stopped
    assert _api._list_replicas("kept", "Adder") == replicas  # (once it recovered)
    _advance(0.5)  # statuses are worked out again in its loop's next steps
    status = serve.status().applications["kept"]
    assert status.status == serve.ApplicationStatus.RUNNING and status.route_prefix == "/kept"
    serve.run(Adder.bind(8), name="kept", route_prefix="/kept")  # and it still deploys
    assert handle.remote(1).result() == 9
    replicas = _api._list_replicas("kept", "Adder")
    sim.kill_worker(sim.worker_of(tray.get_actor("SERVE_CONTROLLER_ACTOR", namespace="serve")))
    _advance(2.0)
    assert _api._list_replicas("kept", "Adder") == replicas
    _advance(0.5)
    assert serve.status().applications["kept"].status == serve.ApplicationStatus.RUNNING
    assert handle.remote(2).result() == 10


def test_the_checkpoint_outlives_a_gcs_restart_with_the_controller_down(sim):
    # simtest serve/chaos seeds 8, 28 and 165: the controller's worker
    # crashed while the GCS restarted, and the checkpoint's store actors
    # (all of them, in 165) restarted empty meanwhile: Serve's state was
    # gone. It lives in the GCS's key-value store now, whose storage outlives
    # the GCS's restarts (Redis; the simulator's), as Ray Serve keeps it.
    handle = serve.run(Adder.bind(7), name="kept", route_prefix="/kept")
    replicas = _api._list_replicas("kept", "Adder")
    controller = tray.get_actor("SERVE_CONTROLLER_ACTOR", namespace="serve")
    sim.restart_gcs(down_for_s=1.0)
    sim.kill_worker(sim.worker_of(controller))  # at the same instant
    _advance(3.0)
    assert handle.remote(1).result() == 8  # the replicas never stopped
    assert _api._list_replicas("kept", "Adder") == replicas
    _advance(0.5)
    assert serve.status().applications["kept"].status == serve.ApplicationStatus.RUNNING


def test_the_checkpoint_is_a_state_key_and_one_key_per_spec(sim):
    serve.run(Pipeline.bind(Adder.bind(1), doubler.bind()), name="p")
    keys = _checkpoint_keys()
    specs = [k for k in keys if k.startswith("controller/spec/")]
    assert keys == sorted(["controller/state", *specs]) and len(specs) == 3
    state = _checkpoint_state()
    assert sorted(d["spec_key"] for d in state["deployments"]) == sorted(specs)
    # Every replica is in the state (each is recorded before it is created).
    recorded = {r[0] for d in state["deployments"] for r in d["replicas"]}
    for name in ("Pipeline", "Adder", "doubler"):
        assert {r[0] for r in _api._list_replicas("p", name)} <= recorded
    # A new version of one deployment: its new spec is written, the old one
    # deleted once the state no longer names it.
    serve.run(Pipeline.bind(Adder.bind(2), doubler.bind()), name="p")
    _advance(1.0)
    new_specs = [k for k in _checkpoint_keys() if k.startswith("controller/spec/")]
    assert len(new_specs) == 3 and set(new_specs) != set(specs)
    assert sorted(d["spec_key"] for d in _checkpoint_state()["deployments"]) == new_specs
    serve.shutdown()
    assert _checkpoint_keys() == []  # serve.shutdown() deletes it


def test_a_restarted_controller_deletes_specs_its_state_does_not_name(sim):
    # A controller that died between writing a new spec and the state that
    # names it left the spec behind: its successor deletes it.
    from tray.experimental import internal_kv

    serve.run(Adder.bind(7), name="kept")
    internal_kv._internal_kv_put("controller/spec/left-behind", b"x", namespace="serve")
    sim.kill_worker(sim.worker_of(tray.get_actor("SERVE_CONTROLLER_ACTOR", namespace="serve")))
    _advance(1.0)
    assert len(_api._list_replicas("kept", "Adder")) == 1  # once it recovered
    _advance(0.5)
    keys = _checkpoint_keys()
    assert "controller/spec/left-behind" not in keys and len(keys) == 2
    assert serve.status().applications["kept"].status == serve.ApplicationStatus.RUNNING


def test_a_write_while_the_gcs_stays_down_is_made_again(caplog):
    # The GCS stays down past gcs_reconnect_timeout_s while an application
    # is updated: the checkpoint write fails, and is made again once the GCS
    # is back; a controller restarted then finds the update.
    from tray.core.config import Config
    from tray.serve._deployment import build

    tray.init(backend="sim", num_cpus=8, seed=0, config=Config(gcs_reconnect_timeout_s=5.0))
    try:
        sim = tray.simtest.cluster()
        handle = serve.run(Adder.bind(7), name="kept")
        controller = tray.get_actor("SERVE_CONTROLLER_ACTOR", namespace="serve")
        ingress, specs = build(Adder.bind(8), "kept", "/")
        sim.restart_gcs(down_for_s=12.0)
        deployed = controller.deploy_application.remote("kept", "/", ingress, specs)
        with caplog.at_level("WARNING", logger="tray.serve"):
            _advance(20.0)
        tray.get(deployed)
        assert "writing the checkpoint failed" in caplog.text
        assert handle.remote(1).result() == 9
        replicas = _api._list_replicas("kept", "Adder")
        state = _checkpoint_state()
        assert [r[0] for r in state["deployments"][0]["replicas"]] == [r[0] for r in replicas]
        sim.kill_worker(sim.worker_of(controller))
        _advance(2.0)
        assert _api._list_replicas("kept", "Adder") == replicas
        assert handle.remote(1).result() == 9
    finally:
        serve.shutdown()
        tray.shutdown()


def test_a_router_keeps_a_newer_target_over_an_older_controllers_answer():
    from tray.serve._common import ReplicaInfo, RoutingTarget
    from tray.serve._handle import Router

    router = Router(None, "app", "Dep", "seed")
    replica = ReplicaInfo(replica_id="app#Dep#1", actor=None, max_ongoing_requests=5)
    newer = RoutingTarget(version=("00000000000b", 3), exists=True, replicas=(replica,))
    router.apply_target(newer)
    # simtest serve/chaos seed 28: a long poll answered by a controller that
    # had restarted without its state, taken after serve.run handed over the
    # target of the next (redeployed) incarnation, undid it.
    router._apply(RoutingTarget(version=("00000000000a", -1), exists=False))
    assert router.target is newer and router.replicas == [replica]
    router._apply(RoutingTarget(version=("00000000000b", 2), exists=True))
    assert router.target is newer
    # Deleted since, in the same incarnation: that does apply.
    router._apply(RoutingTarget(version=("00000000000b", -1), exists=False))
    assert not router.target.exists and router.replicas == []


def test_does_not_exist_is_checked_with_the_controller_before_a_caller_hears_it(sim):
    from tray.serve._common import RoutingTarget
    from tray.serve._handle import router_for

    handle = serve.run(Adder.bind(7), name="kept")
    assert handle.remote(1).result() == 8
    router = router_for("kept", "Adder")
    # An old answer, of an earlier controller that knew no such deployment.
    router.target = RoutingTarget(version=("000000000000", -1), exists=False)
    router.replicas = []
    assert handle.remote(2).result() == 9


@tray.remote(num_cpus=0)
def scale_versioned(num_replicas: int) -> None:
    # From another process: the driver's router is not handed the target.
    serve.run(Versioned.options(num_replicas=num_replicas).bind("v1"), name="versioned")


def test_a_synchronous_router_reads_the_current_target_before_it_routes(sim, monkeypatch):
    # simtest serve/chaos seed 205: the driver's router took a long-poll
    # answer that had waited for it since a scale-up (two replicas), while
    # a downscale had since drained and stopped one of them; its check that
    # the answer was still the latest (another poll, waited for 20 ms) lost
    # to a slow controller, so held requests went to the stopped replica,
    # failed, and were sent again only when the driver fetched them: for
    # 30 s they were load that no replica and no autoscaler saw. Now a
    # router that finds an answer waiting reads the current target.
    from tray.serve._controller import ServeController
    from tray.serve._handle import router_for

    busy = []
    listen = ServeController.listen_for_change

    async def slow_listen(self, *args, **kwargs):
        if busy:
            await asyncio.sleep(0.05)  # a busy controller answers late
        return await listen(self, *args, **kwargs)

    monkeypatch.setattr(ServeController, "listen_for_change", slow_listen)
    handle = serve.run(Versioned.options(num_replicas=1).bind("v1"), name="versioned")
    assert handle.remote(0.0).result() == "v1"
    router = router_for("versioned", "Versioned")
    tray.get(scale_versioned.remote(2))
    _advance(2.0)
    waiting = tray.get(router._poll_ref)  # the answer waits, unread
    assert len(waiting.replicas) == 2
    tray.get(scale_versioned.remote(1))
    _advance(5.0)  # one drained and stopped
    live = [r[0] for r in _api._list_replicas("versioned", "Versioned")]
    assert len(live) == 1
    assert live[0] in {r.replica_id for r in waiting.replicas}
    busy.append(True)
    responses = [handle.remote(0.0) for _ in range(6)]
    assert [r._replica.replica_id for r in responses] == live * 6
    assert [r.result() for r in responses] == ["v1"] * 6


# ============================================================ limits, scale


@serve.deployment(ray_actor_options={"num_cpus": 0}, max_ongoing_requests=1,
                  max_queued_requests=2)
class Narrow:
    async def __call__(self, sleep_s: float) -> str:
        await asyncio.sleep(sleep_s)
        return "done"


def test_backpressure_past_max_queued_requests(sim):
    handle = serve.run(Narrow.bind(), name="narrow")
    accepted = [handle.remote(1.0) for _ in range(3)]  # one running, two queued
    with pytest.raises(BackPressureError, match="max_queued_requests=2") as caught:
        handle.remote(1.0)
    assert caught.value.num_queued_requests == 2
    assert [r.result() for r in accepted] == ["done"] * 3
    assert handle.remote(0.0).result() == "done"  # room again


@serve.deployment(ray_actor_options={"num_cpus": 0}, max_ongoing_requests=10,
                  autoscaling_config={"min_replicas": 1, "max_replicas": 3,
                                      "target_ongoing_requests": 2, "metrics_interval_s": 0.2,
                                      "look_back_period_s": 1.0, "upscale_delay_s": 0.5,
                                      "downscale_delay_s": 2.0},
                  graceful_shutdown_wait_loop_s=0.2)
class Elastic:
    async def __call__(self, sleep_s: float) -> int:
        await asyncio.sleep(sleep_s)
        return 1


def _target_and_running(app: str, deployment: str) -> tuple:
    status = serve.status().applications[app].deployments[deployment]
    return status.target_num_replicas, status.replica_states.get("RUNNING", 0)


def test_autoscaling_follows_ongoing_requests(sim):
    handle = serve.run(Elastic.bind(), name="elastic")
    assert _target_and_running("elastic", "Elastic") == (1, 1)
    held = [handle.remote(10.0) for _ in range(5)]  # 5 ongoing / 2 per replica -> 3
    _advance(4.0)
    assert _target_and_running("elastic", "Elastic") == (3, 3)
    assert sum(r.result() for r in held) == 5
    _advance(6.0)
    assert _target_and_running("elastic", "Elastic") == (1, 1)
    status = serve.status().applications["elastic"]
    assert status.status == serve.ApplicationStatus.RUNNING


def test_autoscaling_policy_is_rays():
    config = AutoscalingConfig(min_replicas=1, max_replicas=10, target_ongoing_requests=2,
                               upscale_delay_s=0.5, downscale_delay_s=1.0)
    state = _autoscaling.PolicyState()
    assert _autoscaling.desired_replicas(config, 2, 8) == 4
    assert _autoscaling.desired_replicas(config, 2, 100) == 10  # bounded
    assert _autoscaling.desired_replicas(config, 4, 0) == 1
    # Up only once the decision held for upscale_delay_s (5 periods of 0.1 s).
    assert [_autoscaling.decide(config, state, 2, 2, 8) for _ in range(6)] == [2] * 5 + [4]
    # A short dip does not scale down; a long one does.
    assert [_autoscaling.decide(config, state, 4, 4, 0) for _ in range(3)] == [4, 4, 4]
    assert _autoscaling.decide(config, state, 4, 4, 8) == 4  # the counter resets
    assert [_autoscaling.decide(config, state, 4, 4, 0) for _ in range(11)] == [4] * 10 + [1]
    halved = AutoscalingConfig(min_replicas=1, max_replicas=10, target_ongoing_requests=1,
                               upscale_delay_s=0, upscaling_factor=0.5)
    assert _autoscaling.decide(halved, _autoscaling.PolicyState(), 2, 2, 10) == 6
    zero = AutoscalingConfig(min_replicas=0, max_replicas=4, downscale_delay_s=0.0)
    assert _autoscaling.decide(zero, _autoscaling.PolicyState(), 0, 0, 3) == 1  # from zero
    assert _autoscaling.decide(zero, _autoscaling.PolicyState(), 1, 1, 0) == 0


@serve.deployment(ray_actor_options={"num_cpus": 0}, max_ongoing_requests=100)
class Batched:
    def __init__(self) -> None:
        self.sizes = []

    @serve.batch(max_batch_size=4, batch_wait_timeout_s=0.5)
    async def handle(self, values: list) -> list:
        self.sizes.append(len(values))
        return [v * 10 for v in values]

    async def __call__(self, value: int) -> int:
        return await self.handle(value)

    def batch_sizes(self) -> list:
        return self.sizes


def test_batch_groups_concurrent_calls(sim):
    handle = serve.run(Batched.bind(), name="batched")
    responses = [handle.remote(i) for i in range(10)]
    assert [r.result() for r in responses] == [i * 10 for i in range(10)]
    sizes = handle.batch_sizes.remote().result()
    assert sum(sizes) == 10 and max(sizes) == 4 and sizes[:2] == [4, 4]
    assert handle.remote(99).result() == 990  # alone: the timeout sends it
    assert handle.batch_sizes.remote().result()[-1] == 1


def test_batch_without_a_cluster():
    @serve.batch(max_batch_size=3, batch_wait_timeout_s=0.01)
    async def square_all(values):
        return [v * v for v in values]

    @serve.batch(max_batch_size=2)
    async def wrong_length(values):
        return values[:1]

    async def main():
        squares = await asyncio.gather(*[square_all(i) for i in range(7)])
        with pytest.raises(TypeError, match="one result per item"):
            await asyncio.gather(wrong_length(1), wrong_length(2))
        return squares, square_all.statistics()

    squares, stats = asyncio.run(main())
    assert squares == [i * i for i in range(7)]
    assert stats.batches_run == 3


# ============================================================= determinism


def _serve_program() -> str:
    tray.init(backend="sim", num_cpus=8, seed=11)
    try:
        handle = serve.run(Pipeline.bind(Adder.bind(1), doubler.bind()), name="p")
        assert [r.result() for r in [handle.remote(i) for i in range(5)]] == \
            [2 * (i + 1) for i in range(5)]
        serve.shutdown()
        return tray.simtest.trace_digest()
    finally:
        tray.shutdown()


def test_a_serve_program_replays_from_its_seed():
    assert _serve_program() == _serve_program()


# ================================================== losing the checkpoint


@tray.remote(num_cpus=0)
class Ledger:
    def __init__(self) -> None:
        self.ids = []

    def add(self, replica_id: str) -> None:
        self.ids.append(replica_id)

    def get(self) -> list:
        return self.ids


@serve.deployment(ray_actor_options={"num_cpus": 0}, num_replicas=2, user_config={})
class SlowStart:
    def __init__(self, ledger) -> None:
        ledger.add.remote(serve.get_replica_context().replica_id)

    async def reconfigure(self, config: dict) -> None:
        await asyncio.sleep(2.0)  # part of starting: the controller dies meanwhile

    def __call__(self) -> str:
        return serve.get_replica_context().replica_id


@tray.remote(num_cpus=0)
def lose_serve_state(delay_s: float) -> None:
    """Crash the controller and delete its checkpoint at one instant (as when
    the GCS loses its storage): it restarts with nothing."""
    import time

    import tray.simtest
    from tray.experimental import internal_kv

    time.sleep(delay_s)
    sim = tray.simtest.cluster()  # the simulator is one process: reachable from a task
    sim.kill_worker(sim.worker_of(tray.get_actor("SERVE_CONTROLLER_ACTOR", namespace="serve")))
    internal_kv._internal_kv_del("", del_by_prefix=True, namespace="serve")


def test_a_lost_checkpoint_redeploys_and_stops_orphaned_replicas(sim):
    from tray.serve._common import SERVE_NAMESPACE, replica_actor_name

    serve.start()
    ledger = Ledger.remote()
    killer = lose_serve_state.remote(0.5)
    handle = serve.run(SlowStart.bind(ledger), name="slow")  # sent again to the new controller
    tray.get(killer)
    current = {r[0] for r in _api._list_replicas("slow", "SlowStart")}
    assert len(current) == 2
    assert handle.remote().result() in current
    orphans = set(tray.get(ledger.get.remote())) - current
    assert orphans  # the first controller's replicas, unknown to the new one
    # They stop themselves: no detached replica outlives what manages it.
    _advance(12.0)
    for replica_id in orphans:
        with pytest.raises(ValueError):
            tray.get_actor(replica_actor_name(replica_id), namespace=SERVE_NAMESPACE)
    for replica_id in current:
        tray.get_actor(replica_actor_name(replica_id), namespace=SERVE_NAMESPACE)  # alive
    assert serve.status().applications["slow"].status == serve.ApplicationStatus.RUNNING
    assert handle.remote().result() in current


@serve.deployment(ray_actor_options={"num_cpus": 0}, max_ongoing_requests=10,
                  autoscaling_config={"min_replicas": 1, "max_replicas": 3,
                                      "target_ongoing_requests": 1, "metrics_interval_s": 0.1,
                                      "look_back_period_s": 0.3, "upscale_delay_s": 0.1,
                                      "downscale_delay_s": 30.0},
                  user_config={}, graceful_shutdown_wait_loop_s=0.2)
class ElasticVersioned:
    def __init__(self, version: str) -> None:
        self.version = version

    async def reconfigure(self, config: dict) -> None:
        if self.version == "v2":
            await asyncio.sleep(2.0)  # a slow start: the autoscaler acts meanwhile

    async def __call__(self, sleep_s: float) -> str:
        await asyncio.sleep(sleep_s)
        return self.version


def test_serve_run_returns_once_no_old_replica_serves_while_autoscaling(sim):
    """A rolling update of a deployment the autoscaler scales up meanwhile:
    serve.run returns only when no replica of the old version takes
    requests, so the next request gets the new version (regression: an
    UPSCALING deployment counted as running while v1 replicas still served)."""
    handle = serve.run(ElasticVersioned.bind("v1"), name="ev")
    held = [handle.remote(6.0) for _ in range(3)]  # load: the target goes to 3
    serve.run(ElasticVersioned.bind("v2"), name="ev")
    assert [handle.remote(0.0).result() for _ in range(6)] == ["v2"] * 6
    assert [r.result() for r in held] == ["v1"] * 3  # drained, not dropped
