"""The trial's side of reporting: ``tune.report``, ``tune.get_checkpoint``,
``tune.get_context``.

A trial runs inside a runner actor, in the actor's own thread of control
(tray actors have no background threads yet, and in the simulator a thread
would escape virtual time). So ``report`` is synchronous: it persists the
checkpoint, appends the result to the trial's ``result.json``, and makes a
blocking call to the experiment's controller, which answers with the
scheduler's decision at once. CONTINUE returns; STOP and PAUSE unwind the
trainable with ``TrialInterrupt`` (a ``BaseException``, so a user's
``except Exception`` cannot swallow it), which the runner catches. The
trainable therefore never runs ahead of a decision, and in the simulator
every decision happens at a reproducible point of virtual time.

The session lives in a ``ContextVar``: in the simulator all runners share
one process, each in its own trio task with its own context.
"""

from __future__ import annotations

import contextvars
import json
import math
import os
import time
from dataclasses import dataclass
from typing import Any

import tray

from .checkpoint import Checkpoint, persist

RESULT_FILE = "result.json"
PARAMS_FILE = "params.json"

# Results reported at a rate above this many per trial are still all kept;
# the limit is on what one result may hold, so that one report cannot blow
# up the controller's memory (every field is also in result.json).
RESULT_BYTES_MAX = 1_000_000
# Results that need no answer are batched: at most this many, or this old.
PENDING_RESULTS_MAX = 32
PENDING_RESULTS_S = 1.0


class TrialInterrupt(BaseException):
    """Unwinds a trainable after a STOP or PAUSE decision."""

    def __init__(self, kind: str) -> None:
        super().__init__(kind)
        self.kind = kind


class ControllerLost(BaseException):
    """The experiment's controller died: the runner gives its trial up."""


@dataclass
class Work:
    """One start of one trial, as the controller hands it to a runner."""
    trial_id: str
    attempt: int
    trial_name: str
    trial_dir: str
    experiment_path: str
    experiment_name: str
    config: dict
    restore: Any  # CheckpointRecord or None
    truncate: bool  # drop results and checkpoints past ``restore`` (a retry)
    next_checkpoint_index: int
    checkpoint_frequency: int
    checkpoint_at_end: bool
    reuse_actors: bool
    strict_metrics: tuple  # metrics every result must hold
    results_ahead: int = 0  # results the trial may send before it waits for an answer


def _json_default(value: Any) -> Any:
    if hasattr(value, "tolist"):
        return value.tolist()
    if hasattr(value, "item"):
        return value.item()
    return repr(value)


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None  # JSON has no NaN; pandas reads None back as NaN
    return value


class Session:
    """What ``report`` needs, for the trial running in this context."""

    def __init__(self, work: Work, controller, runner_id: int) -> None:
        self.work = work
        self.controller = controller
        self.runner_id = runner_id
        restore = work.restore
        self.iteration = restore.training_iteration if restore is not None else 0
        self.time_total_s = restore.time_total_s if restore is not None else 0.0
        self.iterations_since_restore = 0
        self.time_since_restore_s = 0.0
        self.started_at = time.time()
        self.last_at = self.started_at
        self.checkpoint_index = work.next_checkpoint_index
        self.checkpoint = Checkpoint(restore.path) if restore is not None else None
        self.reported = False
        self.is_function = True
        self.ahead = work.results_ahead  # results it may send without waiting for an answer
        self.pending: list = []  # those results, not sent yet
        self.pending_since = 0.0

    # ---------------------------------------------------------- files

    def prepare_directory(self) -> None:
        """Create the trial directory; on a retry, drop what the lost attempt
        wrote past the checkpoint it resumes from."""
        work = self.work
        os.makedirs(work.trial_dir, exist_ok=True)
        params = os.path.join(work.trial_dir, PARAMS_FILE)
        with open(params, "w", encoding="utf-8") as file:
            json.dump(work.config, file, default=_json_default, sort_keys=True)
        results = os.path.join(work.trial_dir, RESULT_FILE)
        if not work.truncate:
            return
        keep_up_to = self.iteration
        if os.path.exists(results):
            kept = []
            with open(results, encoding="utf-8") as file:
                for line in file:
                    try:
                        if json.loads(line).get("training_iteration", 0) <= keep_up_to:
                            kept.append(line)
                    except ValueError:
                        break  # a torn last line
            with open(results, "w", encoding="utf-8") as file:
                file.writelines(kept)
        for name in sorted(os.listdir(work.trial_dir)):
            if name.startswith("checkpoint_"):
                try:
                    index = int(name[len("checkpoint_"):].split(".")[0])
                except ValueError:
                    continue
                if index >= self.checkpoint_index:
                    import shutil

                    shutil.rmtree(os.path.join(work.trial_dir, name), ignore_errors=True)

    def persist_checkpoint(self, source: str | None, save=None) -> dict:
        """Copy ``source`` (or call ``save(dir)`` to write straight into place)
        into the trial directory; returns what the controller records."""
        index = self.checkpoint_index
        self.checkpoint_index += 1
        target = os.path.join(self.work.trial_dir, f"checkpoint_{index:06d}")
        if save is not None:
            staging = target + ".tmp"
            import shutil

            shutil.rmtree(staging, ignore_errors=True)
            os.makedirs(staging)
            save(staging)
            shutil.rmtree(target, ignore_errors=True)
            os.replace(staging, target)
        else:
            persist(source, target)
        return {"path": target, "index": index, "training_iteration": self.iteration,
                "time_total_s": self.time_total_s}

    # ---------------------------------------------------------- results

    def make_result(self, metrics: dict) -> dict:
        now = time.time()
        self.iteration += 1
        self.iterations_since_restore += 1
        this_iter = now - self.last_at
        self.last_at = now
        self.time_total_s += this_iter
        self.time_since_restore_s += this_iter
        result = dict(metrics)
        result.update({
            "training_iteration": self.iteration,
            "time_this_iter_s": this_iter,
            "time_total_s": self.time_total_s,
            "time_since_restore": self.time_since_restore_s,
            "iterations_since_restore": self.iterations_since_restore,
            "timestamp": int(now),
            "trial_id": self.work.trial_id,
        })
        result.setdefault("done", False)
        return result

    def send(self, result: dict, checkpoint: dict | None) -> tuple:
        """Write the result line and ask the controller what to do."""
        line = dict(result)
        line["checkpoint_dir_name"] = os.path.basename(checkpoint["path"]) if checkpoint else None
        line["config"] = self.work.config
        text = json.dumps({k: _finite(v) for k, v in line.items()}, default=_json_default)
        if len(text) > RESULT_BYTES_MAX:
            raise ValueError(f"a reported result is {len(text)} bytes as JSON; the limit is "
                             f"{RESULT_BYTES_MAX}: report metrics, and put large objects in "
                             f"a checkpoint")
        with open(os.path.join(self.work.trial_dir, RESULT_FILE), "a", encoding="utf-8") as f:
            f.write(text + "\n")
        self.reported = True
        if not self.pending:
            self.pending_since = time.time()
        self.pending.append((result, checkpoint))
        if self.ahead > 0:
            # The scheduler already said it lets this result pass: no round trip.
            # Results wait here in a bounded batch, and go out (without waiting
            # for an answer) when the batch is full or old, or with the next
            # report that waits, or with the trial's end: calls from one caller
            # run in order, so the controller sees every result, in order.
            self.ahead -= 1
            if len(self.pending) >= PENDING_RESULTS_MAX or \
                    time.time() - self.pending_since >= PENDING_RESULTS_S:
                self.controller.report.remote(self.work.trial_id, self.work.attempt,
                                              self.take_pending())
            return ("continue", False)
        decision = call_controller(self.controller.report.remote(
            self.work.trial_id, self.work.attempt, self.take_pending()))
        self.ahead = decision[2] if len(decision) > 2 else 0
        return decision

    def take_pending(self) -> list:
        """The results not sent yet (they go with the trial's end or a save)."""
        pending, self.pending = self.pending, []
        return pending

    def act(self, decision: tuple) -> None:
        action = decision[0]
        if action == "stop":
            raise TrialInterrupt("stopped")
        if action == "pause":
            raise TrialInterrupt("paused")


def call_controller(ref) -> Any:
    try:
        return tray.get(ref)
    except tray.exceptions.ActorError as error:
        raise ControllerLost(str(error)) from error


_current: contextvars.ContextVar[Session | None] = contextvars.ContextVar(
    "tray_tune_session", default=None)


def _session(what: str) -> Session:
    session = _current.get()
    if session is None:
        raise RuntimeError(f"tune.{what}() can only be called inside a trial, from the "
                           f"trainable that a tune.Tuner runs")
    return session


# ================================================================ public API

def report(metrics: dict, *, checkpoint: Checkpoint | None = None) -> None:
    """Report this iteration's ``metrics`` (and, optionally, a checkpoint to
    resume from); returns when the scheduler lets the trial go on."""
    session = _session("report")
    if not session.is_function:
        raise RuntimeError("tune.report() is for function trainables; a tune.Trainable "
                           "returns its metrics from step()")
    if not isinstance(metrics, dict):
        raise TypeError(f"tune.report() takes a dict of metrics, got {type(metrics).__name__}")
    if checkpoint is not None and not isinstance(checkpoint, Checkpoint):
        raise TypeError(f"checkpoint must be a tune.Checkpoint "
                        f"(Checkpoint.from_directory(path)), got {type(checkpoint).__name__}")
    result = session.make_result(metrics)
    persisted = session.persist_checkpoint(checkpoint.path) if checkpoint is not None else None
    if persisted is not None:
        session.checkpoint = Checkpoint(persisted["path"])
    session.act(session.send(result, persisted))


def get_checkpoint() -> Checkpoint | None:
    """The checkpoint this trial resumes from (after a failure, a pause or a
    PBT exploit), or its latest reported one; None on a fresh start."""
    return _session("get_checkpoint").checkpoint


class TuneContext:
    """What a trainable may ask about the trial it runs."""

    def __init__(self, session: Session) -> None:
        self._work = session.work

    def get_trial_id(self) -> str:
        return self._work.trial_id

    def get_trial_name(self) -> str:
        return self._work.trial_name

    def get_trial_dir(self) -> str:
        return self._work.trial_dir

    def get_experiment_name(self) -> str:
        return self._work.experiment_name


def get_context() -> TuneContext:
    return TuneContext(_session("get_context"))


for _obj in (report, get_checkpoint, get_context, TuneContext):
    _obj.__module__ = "tray.tune"
del _obj
