"""Resource sampling: valid snapshots, deltas, and no failure over a missing or broken GPU."""

from __future__ import annotations

import os
from types import SimpleNamespace

import psutil
import pytest
import torch

from antdt.schemas.models import ResourceSnapshot
from antdt.worker.resources import (
    NO_GPU,
    FirstOf,
    GpuReading,
    NoGpu,
    NvmlGpu,
    ResourceSampler,
    TorchGpu,
    detect_gpu,
    import_nvml,
)


class FakeClock:
    def __init__(self, now: float = 100.0):
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_snapshot_validates_and_first_sample_primes():
    sampler = ResourceSampler()
    first = sampler.sample()
    assert isinstance(first, ResourceSnapshot)
    ResourceSnapshot.model_validate(first.model_dump())
    assert first.process_cpu_percent == first.host_cpu_percent == first.cpu_steal_percent == 0.0
    assert first.io_read_bytes == first.io_write_bytes == 0
    assert first.net_sent_bytes == first.net_recv_bytes == 0
    assert first.rss_bytes > 0
    assert 0.0 < first.host_memory_percent <= 100.0
    assert first.load_1m >= 0.0


def test_deltas_are_non_negative_and_cpu_is_measured():
    clock = FakeClock()
    sampler = ResourceSampler(clock=clock)
    sampler.sample()
    before = psutil.Process().cpu_times()
    total = 0
    # burn CPU until the counter moves
    while sum(psutil.Process().cpu_times()[:2]) - sum(before[:2]) < 0.05:
        total += sum(range(1000))
    clock.now += 1.0
    second = sampler.sample()
    for name in ("io_read_bytes", "io_write_bytes", "net_sent_bytes", "net_recv_bytes"):
        assert getattr(second, name) >= 0
    assert second.process_cpu_percent > 0.0  # >= 50 ms of CPU over one fake second
    assert 0.0 <= second.host_cpu_percent <= 100.0
    assert 0.0 <= second.cpu_steal_percent <= 100.0


def test_io_write_delta_grows_after_fsync(tmp_path):
    process = psutil.Process()
    try:
        process.io_counters()
    except (psutil.Error, AttributeError):
        pytest.skip("this platform does not report process IO counters")
    sampler = ResourceSampler(gpu=NoGpu())
    sampler.sample()
    before = process.io_counters().write_bytes
    size = 1 << 20
    with open(tmp_path / "blob", "wb") as f:
        f.write(os.urandom(size))
        f.flush()
        os.fsync(f.fileno())
    if process.io_counters().write_bytes == before:
        pytest.skip("this filesystem (tmpfs?) does not count storage writes")
    assert sampler.sample().io_write_bytes >= size // 2
    assert sampler.sample().io_write_bytes < size // 2  # a delta, not a running total


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the host without a GPU")
def test_no_gpu_gives_none_fields():
    assert isinstance(detect_gpu(), NoGpu)
    snapshot = ResourceSampler(device=0).sample()
    assert snapshot.gpu_utilization_percent is None
    assert snapshot.gpu_memory_used_bytes is None
    assert snapshot.gpu_memory_total_bytes is None


class FakeNvmlError(Exception):
    pass


class FakeNvml:
    """A pynvml stand-in; ``fail`` names the calls that raise."""

    def __init__(self, *fail: str):
        self.fail = set(fail)
        self.calls: list[str] = []

    def _call(self, name: str, result=None):
        self.calls.append(name)
        if name in self.fail:
            raise FakeNvmlError(name)
        return result

    def nvmlInit(self):
        return self._call("init")

    def nvmlShutdown(self):
        return self._call("shutdown")

    def nvmlDeviceGetHandleByIndex(self, index):
        return self._call("handle", f"gpu{index}")

    def nvmlDeviceGetUtilizationRates(self, handle):
        return self._call("utilization", SimpleNamespace(gpu=42, memory=10))

    def nvmlDeviceGetMemoryInfo(self, handle):
        return self._call("memory", SimpleNamespace(used=3 << 30, total=80 << 30, free=77 << 30))


def test_nvml_reads_utilisation_and_memory():
    nvml = FakeNvml()
    gpu = NvmlGpu(0, nvml)
    assert gpu.read() == GpuReading(42.0, 3 << 30, 80 << 30)
    gpu.close()
    assert nvml.calls.count("init") == 1 and nvml.calls[-1] == "shutdown"


def test_nvml_init_failure_is_tried_once_and_reads_nothing():
    nvml = FakeNvml("init")
    gpu = NvmlGpu(0, nvml)
    assert gpu.read() == NO_GPU
    assert gpu.read() == NO_GPU
    assert nvml.calls == ["init"]  # not retried every second, no shutdown without init


def test_nvml_field_failure_leaves_only_that_field_none():
    gpu = NvmlGpu(0, FakeNvml("utilization"))
    assert gpu.read() == GpuReading(None, 3 << 30, 80 << 30)


def test_broken_nvml_falls_back_to_torch_memory():
    cuda = SimpleNamespace(
        is_initialized=lambda: True, mem_get_info=lambda index: (6 << 30, 16 << 30)
    )
    sampler = ResourceSampler(gpu=FirstOf([NvmlGpu(0, FakeNvml("handle")), TorchGpu(0, cuda)]))
    snapshot = sampler.sample()
    assert snapshot.gpu_utilization_percent is None
    assert snapshot.gpu_memory_used_bytes == 10 << 30
    assert snapshot.gpu_memory_total_bytes == 16 << 30


def test_torch_fallback_never_creates_a_cuda_context():
    def mem_get_info(index):
        raise AssertionError("would create a CUDA context")

    cuda = SimpleNamespace(is_initialized=lambda: False, mem_get_info=mem_get_info)
    assert TorchGpu(0, cuda).read() == NO_GPU


def test_a_gpu_reader_that_raises_gives_none_fields():
    class Exploding:
        def read(self):
            raise RuntimeError("driver gone")

        def close(self):
            raise RuntimeError("driver gone")

    snapshot = ResourceSampler(gpu=Exploding()).sample()
    assert snapshot.gpu_utilization_percent is None
    assert snapshot.gpu_memory_used_bytes is None
    assert snapshot.gpu_memory_total_bytes is None


def test_unreadable_process_io_counts_zero(monkeypatch):
    process = psutil.Process()

    def denied():
        raise psutil.AccessDenied(process.pid)

    monkeypatch.setattr(process, "io_counters", denied)
    sampler = ResourceSampler(gpu=NoGpu(), process=process)
    sampler.sample()
    snapshot = sampler.sample()
    assert snapshot.io_read_bytes == snapshot.io_write_bytes == 0


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_real_gpu_reports_its_memory_without_a_cuda_context():
    context_before = torch.cuda.is_initialized()
    sampler = ResourceSampler(device=0)
    sampler.sample()
    snapshot = sampler.sample()
    assert 0 < snapshot.gpu_memory_used_bytes <= snapshot.gpu_memory_total_bytes
    if import_nvml() is not None:  # utilisation comes from NVML alone
        assert 0.0 <= snapshot.gpu_utilization_percent <= 100.0
        assert torch.cuda.is_initialized() == context_before  # NVML reads without creating one
