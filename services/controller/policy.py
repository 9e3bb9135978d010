"""The policy interface and registry.

A policy is a pure function: ``decide(job, event, config, now)`` looks at
what the controller knows about a job (:class:`JobView`), one incoming event
(a verdict or a worker report) and the configuration, and returns a
:class:`Decision`: the commands it wants (:class:`Intent`, before the
controller stamps ids, epoch, expiry, dry-run and signature), the reasons for
anything it chose not to do, and a memo the controller keeps for its next
call. It sends nothing and changes nothing.

Built-in policies register under a name (``antdt-nd``, ``antdt-dd``); a
custom one is named by import path, ``package.module:attribute``, where the
attribute is a policy object or a class with no required arguments.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

from antdt.errors import ConfigError
from antdt.schemas.models import CommandAction, StragglerVerdict, WorkerMetrics
from antdt.services.controller.config import ControllerConfig
from antdt.services.controller.state import JobView

Event = StragglerVerdict | WorkerMetrics


@dataclass(frozen=True)
class Intent:
    """A command a policy wants sent; the controller completes and publishes it."""

    action: CommandAction
    target_worker: str
    reason: str
    shard_quota: int | None = None
    batch_size: int | None = None
    global_batch_size: int | None = None
    effective_step: int | None = None
    parameters: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Decision:
    intents: tuple[Intent, ...] = ()
    skipped: tuple[str, ...] = ()  # why something the event called for was not done
    memo: Any = None  # kept by the controller for the policy's next call (None: unchanged)


NOTHING = Decision()


class Policy(Protocol):
    name: str

    def decide(
        self, job: JobView, event: Event, config: ControllerConfig, now: datetime
    ) -> Decision: ...


_REGISTRY: dict[str, Policy] = {}
# import path -> the policy loaded from it (the controller asks per event)
_IMPORTED: dict[str, Policy] = {}


def register(policy: Policy) -> Policy:
    """Make ``policy`` available under its name."""
    _REGISTRY[policy.name] = policy
    return policy


def registered() -> list[str]:
    return sorted(_REGISTRY)


def load_policy(name: str) -> Policy:
    """The policy registered as ``name``, or the one at import path ``module:attribute``."""
    if name in _REGISTRY:
        return _REGISTRY[name]
    if name in _IMPORTED:
        return _IMPORTED[name]
    module_name, sep, attribute = name.partition(":")
    if not sep or not module_name or not attribute:
        raise ConfigError(
            f"unknown policy {name!r}: not one of {', '.join(registered())} nor module:attribute"
        )
    try:
        target = getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"cannot load policy {name!r}: {exc}") from None
    policy = target() if isinstance(target, type) else target
    if not callable(getattr(policy, "decide", None)) or not isinstance(
        getattr(policy, "name", None), str
    ):
        raise ConfigError(
            f"{name!r} is not a policy (needs a name and decide(job, event, config, now))"
        )
    _IMPORTED[name] = policy
    return policy
