"""Free memory back to the system: the sharder's RSS after a burst."""

from __future__ import annotations

import subprocess
import sys

import pytest

from antdt.runtime.memory import FreeMemoryRelease, _libc_call

#: A child freezes its heap, as ``antdt sharder`` does (the collector is the process's: never this
#: one's): what was alive is out of the collector's passes, garbage cycles made since are still
#: collected, a cycle frozen waits for the thaw, and the thaw collects it.
FREEZE_THEN_THAW = """
import gc, weakref
from antdt.runtime.memory import HeapFreeze
now = [0.0]
heap = HeapFreeze(1.0, 600.0, clock=lambda: now[0])
class Node:
    pass
def cycle():
    node = Node()
    node.me = node
    return weakref.ref(node)
kept = [[i] for i in range(100_000)]
assert heap.due() is False
now[0] = 1.0
assert heap.due() is True
assert gc.get_freeze_count() >= 100_000, gc.get_freeze_count()
assert sum(len(gc.get_objects(g)) for g in range(3)) < 10_000  # what a full pass walks now
gone = cycle()
gc.collect()
assert gone() is None, "a cycle made since the freeze is collected"
gone = cycle()
now[0] = 1.5
assert heap.due() is False
now[0] = 2.0
assert heap.due() is True
gc.collect()
assert gone() is not None, "a frozen cycle is out of every pass"
now[0] = 600.0
assert heap.due() is True
assert gone() is None, "the thaw collects it"
assert gc.get_freeze_count() >= 100_000, "and freezes again"
heap.close()
assert gc.get_freeze_count() == 0
print("ok")
"""

#: A child fragments its heap (keeps one 1 kB buffer in 100 of 200,000), then trims it.
FRAGMENT_THEN_TRIM = """
import psutil
from antdt.runtime.memory import release_free_memory
rss = lambda: psutil.Process().memory_info().rss >> 20
buffers = [bytes(1024) for _ in range(200_000)]
kept = buffers[::100]
del buffers
before = rss()
assert release_free_memory()
print(before, rss())
"""


@pytest.mark.skipif(
    _libc_call("malloc_trim") is None, reason="a C library without malloc_trim (not glibc)"
)
def test_freed_pages_in_the_middle_of_the_heap_go_back_to_the_system():
    done = subprocess.run(
        [sys.executable, "-c", FRAGMENT_THEN_TRIM], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    before, after = map(int, done.stdout.split())
    # about 200 MB freed but held by malloc (a live buffer every 100 kB): most of it returned
    assert before - after > 100, (before, after)


def test_it_releases_at_most_every_period_unless_asked():
    now = [0.0]
    release = FreeMemoryRelease(60.0, clock=lambda: now[0])
    expected = _libc_call("malloc_trim") is not None
    assert release.due() is False
    now[0] = 59.0
    assert release.due() is False
    now[0] = 60.0
    assert release.due() is expected
    now[0] = 61.0
    assert release.due() is False and release.now() is expected
    now[0] = 120.0
    assert release.due() is False  # the period runs from the last release, asked for or not


def test_a_frozen_heap_is_out_of_full_collections_until_the_thaw_collects_its_cycles():
    done = subprocess.run(
        [sys.executable, "-c", FREEZE_THEN_THAW], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


#: A child limited to one arena: threads allocating at once share the main arena, so malloc makes
#: no other (glibc's malloc_info lists one ``<heap nr=...>`` per arena).
ONE_ARENA_THEN_THREADS = """
import ctypes, ctypes.util, os, tempfile, threading
from antdt.runtime.memory import limit_malloc_arenas
assert limit_malloc_arenas(1)
barrier = threading.Barrier(4)
def allocate():
    barrier.wait()
    kept = [bytes(512) for _ in range(20_000)]
    barrier.wait()
threads = [threading.Thread(target=allocate) for _ in range(4)]
for thread in threads: thread.start()
for thread in threads: thread.join()
libc = ctypes.CDLL(ctypes.util.find_library("c"))
libc.fopen.restype = ctypes.c_void_p
with tempfile.NamedTemporaryFile(suffix=".xml", delete=False) as made:
    path = made.name
stream = libc.fopen(path.encode(), b"w")
libc.malloc_info(0, ctypes.c_void_p(stream))
libc.fclose(ctypes.c_void_p(stream))
print(open(path).read().count("<heap nr="))
os.unlink(path)
"""


@pytest.mark.skipif(
    _libc_call("mallopt") is None or _libc_call("malloc_info") is None,
    reason="a C library without mallopt and malloc_info (not glibc)",
)
def test_a_process_limited_to_one_arena_makes_no_other_for_its_threads():
    done = subprocess.run(
        [sys.executable, "-c", ONE_ARENA_THEN_THREADS], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert int(done.stdout) == 1
