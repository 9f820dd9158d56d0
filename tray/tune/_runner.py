"""The runner actor: where trials run.

A runner reserves one trial's resources (it is an actor created with the
trial's ``num_cpus``/``num_gpus``/``resources``) and pulls work from the
controller: it asks for a trial, runs it to its end (the trainable
returns, raises, or a STOP/PAUSE decision unwinds it), tells the
controller how it ended and gets its next trial in the same reply. Runners
are reused across trials of the same resource shape, so a thousand short
trials cost a handful of actor starts, not a thousand (Ray's
``reuse_actors``; here the process is always reused, and a class
trainable's instance only with ``reuse_actors=True``, through
``reset_config``).

The runner's ``serve`` call lasts as long as the runner works; the driver
waits on it, so a runner that dies (its node crashed) is noticed at once
and its trial retried.
"""

from __future__ import annotations

import time
import traceback
from typing import Any

import tray

from . import _session
from ._session import ControllerLost, Session, TrialInterrupt, Work, call_controller
from .trainable import TrainableSpec, load_state

IDLE_SLEEP_S = (0.01, 0.2)  # backoff while the controller has nothing for this runner


def _error_outcome(error: BaseException) -> dict:
    text = "".join(traceback.format_exception(error))
    try:
        import cloudpickle

        blob = cloudpickle.dumps(error)
    except Exception:  # noqa: BLE001 - an unpicklable exception travels as text
        blob = None
    return {"kind": "error", "error": text, "exception": blob,
            "error_type": f"{type(error).__module__}.{type(error).__name__}"}


class TrialRunner:
    def __init__(self, spec: TrainableSpec, controller, runner_id: int, shape: str) -> None:
        self.spec = spec
        self.controller = controller
        self.runner_id = runner_id
        self.shape = shape
        self._parameters: dict | None = None
        self._instance: Any = None  # the last class trainable, for reuse_actors

    def _params(self) -> dict:
        if self._parameters is None:  # fetched once per runner, kept across trials
            self._parameters = {name: tray.get(ref) for name, ref in self.spec.parameters.items()}
        return self._parameters

    def serve(self) -> str:
        """Run trials until the controller says the experiment is over."""
        idle_s = IDLE_SLEEP_S[0]
        try:
            work = call_controller(self.controller.next_work.remote(self.runner_id, self.shape))
            while True:
                if work in ("finished", "retire"):
                    return work
                if work == "wait":
                    time.sleep(idle_s)
                    idle_s = min(idle_s * 2, IDLE_SLEEP_S[1])
                    work = call_controller(self.controller.next_work.remote(
                        self.runner_id, self.shape))
                    continue
                idle_s = IDLE_SLEEP_S[0]
                outcome = self._run(work)  # carries the results not sent yet
                work = call_controller(self.controller.trial_ended.remote(
                    self.runner_id, work.trial_id, work.attempt, outcome, self.shape))
        except ControllerLost:
            return "controller_lost"

    # ------------------------------------------------------------ one trial

    def _run(self, work: Work) -> dict:
        session = Session(work, self.controller, self.runner_id)
        token = _session._current.set(session)
        try:
            session.prepare_directory()
            if self.spec.is_class:
                session.is_function = False
                outcome = self._run_class(session)
            else:
                outcome = self._run_function(session)
        except ControllerLost:
            raise
        except TrialInterrupt as interrupt:
            outcome = {"kind": interrupt.kind}
        except Exception as error:  # noqa: BLE001 - the trial's error, reported
            outcome = _error_outcome(error)
        finally:
            _session._current.reset(token)
        outcome["results"] = session.take_pending()
        return outcome

    def _run_function(self, session: Session) -> dict:
        try:
            returned = self.spec.trainable(dict(session.work.config), **self._params())
        except TrialInterrupt as interrupt:
            return {"kind": interrupt.kind}
        if isinstance(returned, dict):  # a returned dict is the last result
            decision = session.send(session.make_result(returned), None)
            del decision  # the trial ends either way
        elif returned is not None:
            raise TypeError(f"a function trainable returns None or a dict of metrics, got "
                            f"{type(returned).__name__}")
        return {"kind": "returned"}

    def _make_instance(self, work: Work):
        cls = self.spec.trainable
        cached = self._instance
        self._instance = None
        if work.reuse_actors and cached is not None and type(cached) is cls:
            if cached.reset_config(dict(work.config)):
                cached.config = dict(work.config)
                return cached
            cached.stop()
        elif cached is not None:
            cached.stop()
        return cls(dict(work.config), **self._params())

    def _run_class(self, session: Session) -> dict:
        work = session.work
        trainable = self._make_instance(work)
        trainable._trial_id, trainable._trial_name = work.trial_id, work.trial_name
        trainable._logdir = work.trial_dir
        trainable._iteration = session.iteration
        keep = False
        try:
            if work.restore is not None:
                trainable.load_checkpoint(load_state(work.restore.path))
            last_saved_at = -1
            while True:
                metrics = trainable.step()
                if not isinstance(metrics, dict):
                    raise TypeError(f"{type(trainable).__name__}.step() must return a dict of "
                                    f"metrics, got {type(metrics).__name__}")
                result = session.make_result(metrics)
                trainable._iteration = session.iteration
                done = bool(result.get("done"))
                should_save = bool(result.pop("should_checkpoint", False)) or (
                    work.checkpoint_frequency
                    and session.iteration % work.checkpoint_frequency == 0) or (
                    done and work.checkpoint_at_end)
                checkpoint = self._save(session, trainable) if should_save else None
                if checkpoint is not None:
                    last_saved_at = session.iteration
                decision = session.send(result, checkpoint)
                if len(decision) > 1 and decision[1] and last_saved_at != session.iteration:
                    checkpoint = self._save(session, trainable)
                    last_saved_at = session.iteration
                    decision = call_controller(self.controller.saved.remote(
                        work.trial_id, work.attempt, checkpoint))
                action = decision[0]
                if action == "continue" and not done:
                    continue
                if action == "stop" or done:
                    if work.checkpoint_at_end and last_saved_at != session.iteration:
                        if session.pending:  # the results first, in order
                            self.controller.report.remote(work.trial_id, work.attempt,
                                                          session.take_pending())
                        call_controller(self.controller.saved.remote(
                            work.trial_id, work.attempt, self._save(session, trainable)))
                    keep = True
                    return {"kind": "returned" if action != "stop" else "stopped"}
                keep = True
                return {"kind": "paused"}
        finally:
            if keep and work.reuse_actors:
                self._instance = trainable
            else:
                trainable.stop()

    def _save(self, session: Session, trainable) -> dict:
        def write(directory: str) -> None:
            state = trainable.save_checkpoint(directory)
            if state is not None:
                import os
                import pickle

                from .trainable import DICT_CHECKPOINT_FILE

                if not isinstance(state, dict):
                    raise TypeError(f"save_checkpoint() returns None or a dict, got "
                                    f"{type(state).__name__}")
                with open(os.path.join(directory, DICT_CHECKPOINT_FILE), "wb") as file:
                    pickle.dump(state, file)
        return session.persist_checkpoint(None, save=write)


TrialRunner.__module__ = "tray.tune._runner"
RunnerActor = tray.remote(TrialRunner)
