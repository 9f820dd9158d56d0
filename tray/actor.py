"""Actor-side helpers under Ray's module name (``ray.actor``).

``exit_actor()`` ends the current actor from inside one of its methods (see
``tray.api.actor.exit_actor`` for the exact rules); ``ActorHandle`` and
``ActorClass`` are here too, where Ray keeps them."""

from __future__ import annotations

from .api.actor import ActorClass, ActorHandle, ActorMethod, exit_actor
from .core.worker.actor_host import ActorExit, AsyncioActorExit

__all__ = ["exit_actor", "ActorHandle", "ActorClass", "ActorMethod", "ActorExit",
           "AsyncioActorExit"]
