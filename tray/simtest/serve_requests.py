"""Serve's request API in the ``serve`` workload: ``@serve.batch`` and a
handle's method options (``serve-batches-as-configured``).

Half the seeds (a draw of their own) deploy ``Batcher``, one replica whose
``__call__`` is ``@serve.batch(max_batch_size=4)``, and send it a burst of
1-11 requests from one handle, plus a call through
``handle.options(method_name="echo")`` and one through ``handle.echo``.
Ray Serve's promises, checked:

* every request gets exactly its own answer, from a batch of at most
  ``max_batch_size`` (the batch handler's list, answered item by item);
* the batches' sizes add up to the requests sent, and, requests arriving
  together, they are as full as the limit allows: ``[4, 4, ..., the rest]``,
  each batch answering as many requests as it held (judged exactly when the
  replica stayed the same and nothing failed; otherwise only the bounds);
* ``options(method_name=...)`` and ``handle.<method>`` reach that method.

An error is permitted only from the seed's killing faults."""

from __future__ import annotations

from tray import serve

BATCH_APP = "serve-simtest-batch"
BATCH_P = 0.5  # the seeds that run the phase (a draw of its own)
MAX_BATCH_SIZE = 4
BATCHES: list = []  # the sizes of the batches the replicas ran, in order


class _Batcher:
    @serve.batch(max_batch_size=MAX_BATCH_SIZE, batch_wait_timeout_s=0.2)
    async def __call__(self, items: list) -> list:
        from tray.simtest import serve_requests

        serve_requests.BATCHES.append(len(items))
        return [(item, len(items)) for item in items]

    async def echo(self, x):
        return "echo", x


# (Its own name, not the Deployment's: see workloads_serve's SimWorker.)
Batcher = serve.deployment(name="Batcher", ray_actor_options={"num_cpus": 0},
                           max_ongoing_requests=32)(_Batcher)


def batch_phase(program, rng) -> None:
    from tray.serve import _api

    from .invariants import InvariantViolation, _is_fault_error

    def violation(message: str) -> InvariantViolation:
        return InvariantViolation("serve-batches-as-configured", message)

    def replicas() -> list:
        return sorted(r[0] for r in _api._list_replicas(BATCH_APP, "Batcher")
                      if r[2] == "RUNNING")

    handle = serve.run(Batcher.options(num_replicas=1).bind(), name=BATCH_APP,
                       route_prefix=None)
    BATCHES.clear()
    before = replicas()
    count = rng.randint(1, 11)
    responses = [handle.remote(i) for i in range(count)]
    by_option = handle.options(method_name="echo").remote("by option")
    by_attribute = handle.echo.remote("by attribute")
    outcomes, failed = [], False
    for response in [*responses, by_option, by_attribute]:
        try:
            outcomes.append(response.result(timeout_s=60.0))
        except Exception as error:  # noqa: BLE001 - only a fault may fail one
            if not (program.kills and _is_fault_error(error)):
                raise violation(f"a request failed: {type(error).__name__}: {error}") \
                    from None
            outcomes.append(None)
            failed = True
    del responses, by_option, by_attribute
    for index, outcome in enumerate(outcomes[:count]):
        if outcome is not None and (outcome[0] != index or
                                    not 1 <= outcome[1] <= MAX_BATCH_SIZE):
            raise violation(f"request {index} was answered {outcome!r}: not its own item, "
                            f"or from a batch not of 1..{MAX_BATCH_SIZE}")
    for outcome, sent in zip(outcomes[count:], ("by option", "by attribute"), strict=True):
        if outcome is not None and outcome != ("echo", sent):
            raise violation(f"a call to method echo ({sent}) was answered {outcome!r}")
    if any(size > MAX_BATCH_SIZE for size in BATCHES):
        raise violation(f"batches of {BATCHES} with max_batch_size={MAX_BATCH_SIZE}")
    if not failed and replicas() == before:
        full, rest = divmod(count, MAX_BATCH_SIZE)
        expected = [MAX_BATCH_SIZE] * full + ([rest] if rest else [])
        if BATCHES != expected:
            raise violation(f"{count} requests sent together ran in batches of {BATCHES}; "
                            f"with max_batch_size={MAX_BATCH_SIZE}, {expected}")
        # (Which request is in which batch follows their arrival at the
        # replica, which Ray does not order: each batch of n answers n.)
        claimed = sorted(outcome[1] for outcome in outcomes[:count])
        if claimed != sorted(size for size in expected for _ in range(size)):
            raise violation(f"the requests say they ran in batches of {claimed}; the batches "
                            f"were {BATCHES}")
    serve.delete(BATCH_APP)
