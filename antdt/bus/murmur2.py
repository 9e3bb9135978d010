"""Kafka's murmur2 key hash, so any process can compute a key's partition.

Workers read their own partition of ``shard.assignments`` and
``controller.commands`` by manual assignment, without a consumer group, so
they must know which partition their key lands on. Every antdt producer uses
``partitioner=murmur2_random`` (librdkafka) and Faust (aiokafka) hashes with
murmur2 too; this is the same function as Java's ``Utils.murmur2``.
"""

from __future__ import annotations

_SEED = 0x9747B28C
_M = 0x5BD1E995
_MASK = 0xFFFFFFFF


def murmur2(data: bytes) -> int:
    """32-bit murmur2 of ``data`` as Kafka computes it, as a signed int like Java's."""
    length = len(data)
    h = (_SEED ^ length) & _MASK
    for i in range(0, length - length % 4, 4):
        k = data[i] | data[i + 1] << 8 | data[i + 2] << 16 | data[i + 3] << 24
        k = (k * _M) & _MASK
        k ^= k >> 24
        k = (k * _M) & _MASK
        h = ((h * _M) & _MASK) ^ k
    tail = length & ~3
    extra = length % 4
    if extra == 3:
        h ^= data[tail + 2] << 16
    if extra >= 2:
        h ^= data[tail + 1] << 8
    if extra >= 1:
        h ^= data[tail]
        h = (h * _M) & _MASK
    h ^= h >> 13
    h = (h * _M) & _MASK
    h ^= h >> 15
    return h - (1 << 32) if h & 0x80000000 else h


def partition_for(key: bytes | str, partitions: int) -> int:
    """The partition Kafka's default (murmur2) partitioner puts ``key`` on."""
    if partitions < 1:
        raise ValueError(f"partitions must be >= 1, got {partitions}")
    raw = key.encode() if isinstance(key, str) else key
    return (murmur2(raw) & 0x7FFFFFFF) % partitions
