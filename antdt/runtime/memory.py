"""Give the memory the allocator keeps free back to the operating system.

glibc's malloc keeps what a process frees for its next allocations and
returns little of it. Measured in soaks (``bench/soak_bench.py``) with a
roll of the embedded broker every 2 minutes, the sharder's memory in use
stayed at 50-90 MB while malloc's free memory rose to 108-180 MB, and its
RSS with it. ``malloc_trim(0)`` releases every whole free page of every
arena: on that soak 10-40 MB a call, not all of it (free chunks share pages
with live ones). A no-op where the C library has no such call (musl, macOS).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import time


@functools.cache
def _malloc_trim():
    name = ctypes.util.find_library("c")
    try:
        return ctypes.CDLL(name).malloc_trim if name else None
    except (OSError, AttributeError):
        return None


def release_free_memory() -> bool:
    """Return malloc's free pages to the system; whether the C library could."""
    trim = _malloc_trim()
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
