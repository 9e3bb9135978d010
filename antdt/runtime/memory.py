"""Give the memory the allocator keeps free back to the operating system.

glibc's malloc keeps what a process frees for its next allocations and
returns little of it. Measured in soaks (``bench/soak_bench.py``) with a
roll of the embedded broker every 2 minutes, the sharder's memory in use
stayed at 50-90 MB while malloc's free memory rose to 108-180 MB, and its
RSS with it. ``malloc_trim(0)`` releases every whole free page of every
arena: on that soak 10-40 MB a call, not all of it (free chunks share pages
with live ones). Fewer malloc arenas (:func:`limit_malloc_arenas`) keep
less free memory in the first place. No-ops where the C library has no such
calls (musl, macOS).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import gc
import time

#: glibc's mallopt parameter for the most arenas malloc makes (malloc.h).
M_ARENA_MAX = -8
#: The sharder's arenas: one per thread by default (up to 8 a core), each keeping its own free
#: memory. Measured: a 10-minute soak rolling the broker every minute (``bench/soak_bench.py
#: --minutes 10 --hours 2.67 --roll-at-mb 100``, one run each), the sharder at 253-302 MB from
#: minute 3 on with 2 arenas against 302-388 MB without, its CPU the same.
SHARDER_ARENAS = 2
#: How often ``antdt sharder`` freezes its live objects out of the collector's full passes
#: (:class:`HeapFreeze`).
SHARDER_FREEZE_EVERY_S = 1.0


@functools.cache
def _libc_call(name: str):
    library = ctypes.util.find_library("c")
    try:
        return getattr(ctypes.CDLL(library), name) if library else None
    except (OSError, AttributeError):
        return None


def limit_malloc_arenas(count: int) -> bool:
    """Let malloc make at most ``count`` arenas from now on (before the threads start: each
    thread's first allocation picks its arena); whether the C library could."""
    mallopt = _libc_call("mallopt")
    return mallopt is not None and mallopt(M_ARENA_MAX, count) == 1


def release_free_memory() -> bool:
    """Return malloc's free pages to the system; whether the C library could."""
    trim = _libc_call("malloc_trim")
    if trim is None:
        return False
    trim(0)
    return True


class FreeMemoryRelease:
    """:func:`release_free_memory` at most every ``every_s`` seconds, or at once when asked."""

    def __init__(self, every_s: float, clock=time.monotonic) -> None:
        self.every_s, self._clock = every_s, clock
        self._last = clock()

    def due(self) -> bool:
        """Release if ``every_s`` has passed since the last release; whether it did."""
        if self._clock() - self._last < self.every_s:
            return False
        return self.now()

    def now(self) -> bool:
        self._last = self._clock()
        return release_free_memory()


class HeapFreeze:
    """Keeps the cyclic collector's full passes short in a service whose heap is large and busy.

    A full collection walks every tracked object, and nothing else in the
    process runs meanwhile. The sharder under a soak's load
    (``bench/soak_bench.py``) holds 260,000-450,000 of them (an epoch's
    slots, their applied samples, the recent events it keeps for a reset),
    and an epoch's churn promotes enough of them to start a full pass every
    5-15 s: 140-150 ms at the median, in which no grant is answered
    (docs/reliability.md, "The sharder's collector"). So every
    ``freeze_every_s`` the objects alive then are frozen (``gc.freeze``: out
    of every collection, freed as usual when their last reference goes), and
    a full pass walks only what was made since. Garbage cycles among frozen
    objects would never be collected, so every ``thaw_every_s`` everything
    is thawed and collected in one full pass, then frozen again.
    """

    def __init__(self, freeze_every_s: float, thaw_every_s: float, clock=time.monotonic) -> None:
        self.freeze_every_s, self.thaw_every_s, self._clock = freeze_every_s, thaw_every_s, clock
        self._frozen_at = self._thawed_at = clock()

    def due(self) -> bool:
        """Freeze, or thaw and collect, if its time has come; whether it did either."""
        now = self._clock()
        if now - self._thawed_at >= self.thaw_every_s:
            gc.unfreeze()
            gc.collect()
            self._thawed_at = now
        elif now - self._frozen_at < self.freeze_every_s:
            return False
        gc.freeze()
        self._frozen_at = now
        return True

    def close(self) -> None:
        """Everything back under the collector (a service's end, a test's)."""
        gc.unfreeze()
