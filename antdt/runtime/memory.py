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
import time

#: glibc's mallopt parameter for the most arenas malloc makes (malloc.h).
M_ARENA_MAX = -8
#: The sharder's arenas: one per thread by default (up to 8 a core), each keeping its own free
#: memory. Measured: a 10-minute soak rolling the broker every minute (``bench/soak_bench.py
#: --minutes 10 --hours 2.67 --roll-at-mb 100``, one run each), the sharder at 253-302 MB from
#: minute 3 on with 2 arenas against 302-388 MB without, its CPU the same.
SHARDER_ARENAS = 2


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
