"""The control-config topic: run-time changes that every instance of a component applies.

A :class:`~antdt.schemas.models.ControlConfig` names a component (or ALL), an
optional job (None: every job) and changes as ``<component>.<key>`` ->
text, e.g. ``monitor.straggler_ratio=1.4``. Every instance must see every
change, so the topic is read without a consumer group: from its start at
launch (the history is the current configuration, folded in order) and then
followed. Catching up is proven with markers (:mod:`antdt.bus.markers`).

Only authentic, new changes come out of a follower (:mod:`antdt.control.trust`).
A record a follower cannot use or must refuse is logged with its provenance
and counted. It is dead-lettered only when it arrives while the service runs:
every instance reads the whole topic at every start, and dead-lettering there
would copy the same record again each time. The record itself is kept by the
topic; ``antdt control set`` validates before it writes.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Iterable
from typing import Any, TypeVar

from confluent_kafka import Message

from antdt.bus.admin import partition_counts
from antdt.bus.clients import make_admin, make_consumer, make_producer
from antdt.bus.config import FetchPace
from antdt.bus.deadletter import DeadLetter, SourceRecord
from antdt.bus.markers import marker_id
from antdt.bus.readers import poll_batch, read_to_markers
from antdt.bus.watch import BusWatch, Rewinder
from antdt.control.trust import ControlGate
from antdt.errors import AntdtError, BusError, ConfigError
from antdt.schemas.codec import Codec, make_codec
from antdt.schemas.models import ControlComponent, ControlConfig
from antdt.settings import Settings
from antdt.topics import topic_spec

log = logging.getLogger(__name__)

C = TypeVar("C")
_TRUE, _FALSE = {"true", "1", "yes", "on"}, {"false", "0", "no", "off"}


def _parse(kind: Any, key: str, text: str, what: str) -> Any:
    name = kind if isinstance(kind, str) else getattr(kind, "__name__", str(kind))
    try:
        if name == "bool":
            if text.strip().lower() not in _TRUE | _FALSE:
                raise ValueError
            return text.strip().lower() in _TRUE
        if name == "int":
            return int(text)
        if name == "float":
            return float(text)
        return text
    except ValueError:
        article = {"bool": "true or false", "int": "an integer", "float": "a number"}[name]
        raise ConfigError(f"{what}: {key}={text!r} is not {article}") from None


def parse_assignments(pairs: list[str]) -> dict[str, str]:
    """``["k=2", "window_s=20"]`` -> ``{"k": "2", "window_s": "20"}``; ConfigError on a pair without
    '='."""
    changes = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"{pair!r} is not KEY=VALUE")
        changes[key.strip()] = value.strip()
    return changes


def refuse_broken(what: str, checks: Iterable[tuple[bool, str]]) -> None:
    """ConfigError listing every ``(broken, message)`` check that is broken."""
    problems = [message for broken, message in checks if broken]
    if problems:
        raise ConfigError(f"{what}: {'; '.join(problems)}")


def with_text_changes(config: C, changes: dict[str, str], what: str) -> C:
    """A copy of the dataclass ``config`` with ``changes`` (field -> text, as the control topic
    carries them).

    Values are parsed by the field's type (bool, int, float, str). ConfigError
    names the key for an unknown field or a value that does not parse; the
    dataclass's own ``__post_init__`` checks the combination.
    """
    types = {f.name: f.type for f in dataclasses.fields(config)}
    parsed = {}
    for key, text in changes.items():
        if key not in types:
            raise ConfigError(f"{what}: unknown key {key!r} (known: {', '.join(sorted(types))})")
        parsed[key] = _parse(types[key], key, text, what)
    return dataclasses.replace(config, **parsed)


def control_topic(settings: Settings) -> str:
    return topic_spec("control", "config").full_name(settings.topic_prefix)


def key_prefix(component: ControlComponent) -> str:
    """``monitor.`` for MONITOR: the prefix of the keys a component owns."""
    return f"{component.value.lower()}."


def changes_for(control: ControlConfig, component: ControlComponent) -> dict[str, str] | None:
    """The changes meant for ``component``, keys without their prefix; None if not addressed to it.

    A record addressed to ALL carries keys for several components and each
    takes its own; one addressed to a single component must carry only that
    component's keys (ConfigError otherwise).
    """
    if control.component not in (component, ControlComponent.ALL):
        return None
    prefix = key_prefix(component)
    mine = {
        key[len(prefix) :]: value
        for key, value in control.changes.items()
        if key.startswith(prefix)
    }
    if control.component is component:
        foreign = sorted(key for key in control.changes if not key.startswith(prefix))
        if foreign:
            raise ConfigError(
                f"{', '.join(foreign)}: a {component.value} change takes {prefix}* keys only"
            )
    return mine


class ConfigLayers:
    """A component's configuration: defaults plus per-job overrides, changed by control records.

    ``defaults`` is a dataclass with ``with_changes(dict[str, str])``. A
    record is validated against every job it touches before anything is
    applied, so an invalid one leaves the configuration as it was.
    """

    def __init__(self, component: ControlComponent, defaults: Any, check: Any = None):
        self.component = component
        self.defaults = defaults
        # called with each new config before anything is applied; raises ConfigError
        self._check = check
        self.overrides: dict[str, dict[str, str]] = {}
        # effective config of each job with overrides, built in apply()
        self._overridden: dict[str, Any] = {}

    def for_job(self, job_id: str) -> Any:
        """The job's effective config: a lookup, since services ask on every event."""
        return self._overridden.get(job_id, self.defaults)

    def apply(self, control: ControlConfig, live_jobs: Iterable[str] = ()) -> dict[str, Any] | None:
        """Apply ``control`` if addressed to this component; the new config of every affected job.

        Returns None when the record is not for this component; raises
        ConfigError (nothing applied) when it is invalid.
        """
        changes = changes_for(control, self.component)
        if changes is None:
            return None
        defaults, overrides = self.defaults, self.overrides
        if control.job_id is None:
            defaults = defaults.with_changes(changes)
        else:
            overrides = {
                **overrides,
                control.job_id: {**overrides.get(control.job_id, {}), **changes},
            }
        configs = {
            job: defaults.with_changes(overrides.get(job, {})) for job in {*live_jobs, *overrides}
        }
        if self._check is not None:
            for config in (defaults, *configs.values()):
                self._check(config)
        self.defaults, self.overrides = defaults, overrides
        self._overridden = {job: configs[job] for job in overrides}
        return configs


def apply_and_count(apply: Any, change: ControlConfig, counter: Any) -> None:
    """Apply ``change`` through ``apply`` (True if it was for the caller); log and count it applied
    or rejected.

    An invalid change is refused whole by ``apply`` (ConfigError): it is
    logged and counted, and the service goes on with what it had.
    """
    try:
        if apply(change):
            counter.labels("applied").inc()
            log.info(
                "config %s applied (job %s): %s",
                change.config_id,
                change.job_id or "*",
                change.changes,
            )
    except AntdtError as exc:
        counter.labels("rejected").inc()
        log.warning("config %s rejected: %s", change.config_id, exc)


class ControlFollower:
    """Reads the control topic from its start, then follows it; yields decoded changes in order."""

    def __init__(
        self,
        settings: Settings,
        codec: Codec | None = None,
        client_id: str | None = None,
        deadletter: DeadLetter | None = None,
        refused: Any = None,
    ):
        self._settings = settings
        self._codec = codec or make_codec(settings.schema_registry_url)
        self._client_id = client_id
        self.topic = control_topic(settings)
        self._consumer = make_consumer(settings, client_id=client_id, pace=FetchPace.BACKGROUND)
        self._rewinder: Rewinder | None = None
        self._gate = ControlGate.for_settings(settings, client_id or "control follower")
        self._deadletter = deadletter
        self._refused_counter = refused  # the service's own, labelled by reason
        self.refused = 0

    def follow_resets(self, watch: BusWatch) -> ControlFollower:
        """After a bus reset, read the (new, empty) topic from its beginning again."""
        self._rewinder = Rewinder(self._consumer, watch)
        return self

    def catch_up(self, timeout_s: float = 30.0) -> list[ControlConfig]:
        """Every change written so far (proven by markers); afterwards :meth:`poll` returns new
        ones."""
        partitions = range(partition_counts(make_admin(self._settings), [self.topic])[self.topic])
        producer = make_producer(self._settings, client_id=self._client_id)
        records = read_to_markers(
            self._consumer, producer, self.topic, list(partitions), b"*", timeout_s=timeout_s
        )
        return self._admitted(records, live=False)

    def poll(self, timeout_s: float = 0.0, max_records: int = 500) -> list[ControlConfig]:
        """Changes that arrived since the last call."""
        if self._rewinder is not None:
            self._rewinder.check()
        return self._admitted(poll_batch(self._consumer, max_records, timeout_s), live=True)

    def read_through(self, config_id: str, timeout_s: float) -> list[ControlConfig]:
        """Changes from where the follower is up to the one with ``config_id``, and the rest of
        the batch it came in: a record read is never dropped (a claim after ours, dropped, would
        leave us claiming an epoch that another controller already holds). BusError past the
        bound."""
        deadline = time.monotonic() + timeout_s
        changes: list[ControlConfig] = []
        while time.monotonic() < deadline:
            batch = self.poll(timeout_s=0.1)
            changes += batch
            if any(change.config_id == config_id for change in batch):
                return changes
        raise BusError(f"control record {config_id} did not come back within {timeout_s:.0f} s")

    def _admitted(self, messages: Iterable[Message], live: bool) -> list[ControlConfig]:
        changes = []
        for message in messages:
            if marker_id(message) is not None:
                continue
            try:
                value = self._codec.decode(message.value() or b"", message.topic())
                if not isinstance(value, ControlConfig):
                    raise AntdtError(f"expected ControlConfig, got {type(value).__name__}")
            except AntdtError as exc:
                self._refuse(message, "unusable", f"refused control record: unusable: {exc}", live)
                continue
            refusal = self._gate.refusal(value, message.key() or b"")
            if refusal is not None:
                why = f"refused control change {value.config_id}: {refusal.value}"
                self._refuse(message, refusal.value, why, live)
                continue
            changes.append(value)
        return changes

    def _refuse(self, message: Message, reason: str, why: str, live: bool) -> None:
        self.refused += 1
        if self._refused_counter is not None:
            self._refused_counter.labels(reason).inc()
        where = f"{message.topic()}[{message.partition()}]@{message.offset()}"
        log.warning("%s at %s", why, where)
        if live and self._deadletter is not None:
            self._deadletter.send(SourceRecord.from_confluent(message), why)

    def close(self) -> None:
        self._consumer.close()
