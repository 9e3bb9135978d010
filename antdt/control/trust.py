"""Which control changes a service may apply: signed with a control key, and never seen before.

Run-time configuration and controller epoch claims are operator and
controller actions, so with a control key configured a change must carry a
valid signature (:mod:`antdt.control.signing`). A valid signature is not
enough against a copy of an old change written again, so a change is also
refused when its ``config_id`` was already admitted, or when it was issued
before the newest change admitted for the same topic key (the original
may have been lost with a reset bus). Epoch claims are ordered by their
epoch, not by clocks, and are exempt from that last check: a replayed
claim names an epoch already passed and changes nothing.

Without a control key every change is admitted, as before keys existed; a
service says so once at start.
"""

from __future__ import annotations

import logging
from datetime import datetime
from enum import Enum

from antdt.control.epoch import EPOCH_KEY
from antdt.control.signing import sign, verify_any
from antdt.schemas.models import ControlConfig
from antdt.settings import Settings

log = logging.getLogger(__name__)


class Refusal(str, Enum):
    UNSIGNED = "unsigned"
    FORGED = "forged"
    REPLAYED = "replayed"
    STALE = "stale"


def control_keys(settings: Settings) -> list[bytes]:
    """The keys a control change may be signed with: the current one, then the one being
    rotated out."""
    keys = (settings.control_key, settings.control_previous_key)
    return [key.get_secret_value().encode() for key in keys if key is not None]


def signed_change(change: ControlConfig, settings: Settings) -> ControlConfig:
    """``change`` signed with the current control key, or as it is when there is none."""
    key = settings.control_key
    return sign(change, key.get_secret_value().encode()) if key is not None else change


class ControlGate:
    """Admits a change once, and only an authentic one; remembers what it admitted."""

    def __init__(self, keys: list[bytes]):
        self._keys = keys
        self._seen: set[str] = set()
        self._newest: dict[bytes, datetime] = {}  # per topic key: the latest issued_at admitted

    @classmethod
    def for_settings(cls, settings: Settings, who: str) -> ControlGate:
        keys = control_keys(settings)
        if not keys:
            log.warning(
                "%s: no control key (ANTDT_CONTROL_KEY): control changes are not authenticated",
                who,
            )
        return cls(keys)

    def refusal(self, change: ControlConfig, topic_key: bytes) -> Refusal | None:
        """Why ``change`` must not be applied, or None (then it is admitted)."""
        if self._keys and change.signature is None:
            return Refusal.UNSIGNED
        if self._keys and not verify_any(change, self._keys):
            return Refusal.FORGED
        if change.config_id in self._seen:
            return Refusal.REPLAYED
        newest = self._newest.get(topic_key)
        if EPOCH_KEY not in change.changes and newest is not None and change.issued_at < newest:
            return Refusal.STALE
        self._admit(change, topic_key)
        return None

    def _admit(self, change: ControlConfig, topic_key: bytes) -> None:
        self._seen.add(change.config_id)
        if EPOCH_KEY not in change.changes:
            self._newest[topic_key] = max(
                change.issued_at, self._newest.get(topic_key, change.issued_at)
            )
