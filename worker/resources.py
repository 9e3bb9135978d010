"""Resource sampling for the worker's metrics: what the monitor needs to name a cause.

A step-time outlier says *that* a worker is slow; the resources say *why*
(CPU contention or steal, memory pressure, IO, network, the GPU), and a
verdict with evidence is what lets the controller pick the right remedy. The
agent takes one :class:`ResourceSampler` sample per report interval (1 s by
default) from a background thread, so a sample must be cheap and must never
block: CPU percentages are computed from counters relative to the previous
sample (psutil's ``interval=None`` style) rather than by sleeping, and byte
counters are reported as deltas since the previous sample, as the
``ResourceSnapshot`` contract says.

The sampler keeps its own previous host CPU times instead of calling
``psutil.cpu_percent(interval=None)``: that function keeps its "previous"
sample in module-global state, so any other caller in the process (a
library, a dashboard) would silently shorten our interval.

Nothing here raises because a GPU, a library or a permission is missing: a
counter that cannot be read reports 0 (byte deltas, percentages) or None (GPU
fields), because a worker must never fail to report its step times over a
resource it could not see.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple, Protocol

import psutil

from antdt.schemas.models import ResourceSnapshot

#: Failures a psutil read may raise on some platform or permission setup.
_PSUTIL_ERRORS = (psutil.Error, OSError, AttributeError, NotImplementedError, RuntimeError)


# ---------------------------------------------------------------- GPU


class GpuReading(NamedTuple):
    """One reading of the worker's GPU; a field is None when it could not be read."""

    utilization_percent: float | None = None
    memory_used_bytes: int | None = None
    memory_total_bytes: int | None = None

    @property
    def complete(self) -> bool:
        return None not in self


NO_GPU = GpuReading()


class GpuReader(Protocol):
    """Something that reads the worker's GPU. ``read`` may raise; the sampler copes."""

    def read(self) -> GpuReading: ...

    def close(self) -> None: ...


class NoGpu:
    """The reader for a process without a GPU: every field None."""

    def read(self) -> GpuReading:
        return NO_GPU

    def close(self) -> None:
        pass


def import_nvml() -> Any | None:
    """The NVML bindings (``nvidia-ml-py`` or the older ``pynvml``), or None."""
    try:
        import pynvml  # type: ignore[import-not-found]
    except Exception:  # ImportError, or a broken install raising anything at import
        return None
    return pynvml


class NvmlGpu:
    """Utilisation and memory of one device through NVML.

    NVML is the only source of utilisation, and it reads memory without a CUDA
    context. ``index`` is the NVML index (which differs from the CUDA index
    under ``CUDA_VISIBLE_DEVICES``; :func:`detect_gpu` maps it). Initialising
    NVML is tried once: a host where it fails (no driver, a container without
    the NVML library) is not asked again every second. A failure to read one
    field leaves that field None, so a MIG slice without utilisation counters
    still reports its memory.
    """

    def __init__(self, index: int, nvml: Any | None = None):
        self.index = index
        self._nvml = nvml if nvml is not None else import_nvml()
        self._handle: Any | None = None
        self._initialised = False
        self._failed = self._nvml is None

    def _device(self) -> Any | None:
        if self._handle is None and not self._failed:
            try:
                self._nvml.nvmlInit()
                self._initialised = True
                self._handle = self._nvml.nvmlDeviceGetHandleByIndex(self.index)
            except Exception:  # NVMLError and anything a broken binding raises
                self._failed = True
                self.close()
        return self._handle

    def read(self) -> GpuReading:
        handle = self._device()
        if handle is None:
            return NO_GPU
        utilization = used = total = None
        try:
            utilization = float(self._nvml.nvmlDeviceGetUtilizationRates(handle).gpu)
        except Exception:
            pass
        try:
            memory = self._nvml.nvmlDeviceGetMemoryInfo(handle)
            used, total = int(memory.used), int(memory.total)
        except Exception:
            pass
        return GpuReading(utilization, used, total)

    def close(self) -> None:
        self._handle = None
        if self._initialised:
            self._initialised = False
            try:
                self._nvml.nvmlShutdown()
            except Exception:
                pass


class TorchGpu:
    """Device memory through ``torch.cuda``, for hosts without NVML bindings.

    Reads only once this process has initialised CUDA itself:
    ``mem_get_info`` would otherwise create a CUDA context (hundreds of MB of
    device memory) just to report on it. Utilisation needs NVML
    (``torch.cuda.utilization`` calls it too), so it stays None here.
    """

    def __init__(self, index: int, cuda: Any | None = None):
        self.index = index
        if cuda is None:
            import torch

            cuda = torch.cuda
        self._cuda = cuda

    def read(self) -> GpuReading:
        if not self._cuda.is_initialized():
            return NO_GPU
        free, total = self._cuda.mem_get_info(self.index)
        return GpuReading(None, max(0, int(total) - int(free)), int(total))

    def close(self) -> None:
        pass


class FirstOf:
    """Field by field, the first reader that could read it (NVML, then torch)."""

    def __init__(self, readers: Sequence[GpuReader]):
        self.readers = list(readers)

    def read(self) -> GpuReading:
        merged = NO_GPU
        for reader in self.readers:
            try:
                reading = reader.read()
            except Exception:
                continue
            merged = GpuReading(*(m if m is not None else r for m, r in zip(merged, reading)))
            if merged.complete:
                break
        return merged

    def close(self) -> None:
        for reader in self.readers:
            try:
                reader.close()
            except Exception:
                pass


def detect_gpu(device: int | None = None) -> GpuReader:
    """The reader for CUDA device ``device`` (default: the current device), or :class:`NoGpu`.

    The device is resolved once, here: a process that calls
    ``torch.cuda.set_device`` after creating its sampler should pass the
    device explicitly. Resolving the default never initialises CUDA.
    """
    try:
        import torch

        cuda = torch.cuda
        if not cuda.is_available():
            return NoGpu()
        index = (
            device
            if device is not None
            else (cuda.current_device() if cuda.is_initialized() else 0)
        )
    except Exception:
        return NoGpu()
    readers: list[GpuReader] = []
    nvml = import_nvml()
    if nvml is not None:
        try:  # CUDA_VISIBLE_DEVICES renumbers CUDA devices; NVML sees them all
            nvml_index = cuda._get_nvml_device_index(index)
        except Exception:
            nvml_index = index
        readers.append(NvmlGpu(nvml_index, nvml))
    readers.append(TorchGpu(index, cuda))
    return FirstOf(readers)


# ---------------------------------------------------------------- host and process


class _Counters(NamedTuple):
    """Cumulative counters; a sample reports the difference from the previous ones."""

    wall_s: float
    process_cpu_s: float
    host_busy_s: float
    host_total_s: float
    host_steal_s: float
    io_read: int
    io_write: int
    net_sent: int
    net_recv: int


def _host_cpu_times() -> tuple[float, float, float]:
    """(busy, total, steal) CPU seconds of the host, all cores, since boot.

    Counted as psutil's ``cpu_percent`` counts them: idle and iowait are not
    busy; guest time is already inside user time on Linux, so not added again.
    """
    times = psutil.cpu_times()
    total = sum(times) - getattr(times, "guest", 0.0) - getattr(times, "guest_nice", 0.0)
    idle = times.idle + getattr(times, "iowait", 0.0)
    return total - idle, total, getattr(times, "steal", 0.0)


def _percent(part: float, whole: float) -> float:
    """``part`` of ``whole`` as a percentage, 0 when either is meaningless."""
    if whole <= 0 or not math.isfinite(part) or not math.isfinite(whole):
        return 0.0
    return max(0.0, 100.0 * part / whole)


def _delta(now: int, before: int) -> int:
    """A counter's growth; 0 if it went backwards (a reset or a wrapped counter)."""
    return max(0, now - before)


class ResourceSampler:
    """Samples the current process and its host into :class:`ResourceSnapshot` models.

    Usage: make one per worker process, call :meth:`sample` once per report
    interval. The first call primes the counters: its CPU percentages and
    byte deltas are 0. Safe to call from several threads (one lock).
    """

    def __init__(
        self,
        device: int | None = None,
        *,
        gpu: GpuReader | None = None,
        process: psutil.Process | None = None,
        clock: Callable[[], float] = time.monotonic,
    ):
        """``device``: the CUDA device to report on (see :func:`detect_gpu`).

        ``gpu``, ``process`` and ``clock`` exist for tests: a GPU reader in place
        of the detected one, another process, a fake clock.
        """
        self.gpu: GpuReader = gpu if gpu is not None else detect_gpu(device)
        self._process = process or psutil.Process()
        self._clock = clock
        self._cores = psutil.cpu_count() or 1
        self._previous: _Counters | None = None
        self._lock = threading.Lock()

    # ------------------------------------------------------------ reads

    def _counters(self) -> _Counters:
        wall = self._clock()
        process_cpu = 0.0
        io_read = io_write = 0
        with self._process.oneshot():
            try:
                cpu = self._process.cpu_times()
                # not children: an injector's competitors are ours
                process_cpu = cpu.user + cpu.system
            except _PSUTIL_ERRORS:
                pass
            try:
                io = self._process.io_counters()
                io_read, io_write = int(io.read_bytes), int(io.write_bytes)
            except _PSUTIL_ERRORS:  # AccessDenied, or not offered on this platform
                pass
        try:
            busy, total, steal = _host_cpu_times()
        except _PSUTIL_ERRORS:
            busy = total = steal = 0.0
        try:
            net = psutil.net_io_counters()
            net_sent, net_recv = (int(net.bytes_sent), int(net.bytes_recv)) if net else (0, 0)
        except _PSUTIL_ERRORS:
            net_sent = net_recv = 0
        return _Counters(
            wall, process_cpu, busy, total, steal, io_read, io_write, net_sent, net_recv
        )

    def _gauges(self) -> tuple[float, int, float]:
        """(load per core, RSS bytes, host memory percent): levels, not deltas."""
        try:
            load = psutil.getloadavg()[0] / self._cores
        except _PSUTIL_ERRORS:
            load = 0.0
        try:
            rss = int(self._process.memory_info().rss)
        except _PSUTIL_ERRORS:
            rss = 0
        try:
            memory = float(psutil.virtual_memory().percent)
        except _PSUTIL_ERRORS:
            memory = 0.0
        return load, rss, memory

    def _gpu(self) -> GpuReading:
        try:
            reading = self.gpu.read()
        except Exception:  # a GPU must never stop the worker from reporting
            return NO_GPU
        utilization, used, total = reading
        return GpuReading(
            None
            if utilization is None or not math.isfinite(utilization)
            else max(0.0, float(utilization)),
            None if used is None else max(0, int(used)),
            None if total is None else max(0, int(total)),
        )

    # ------------------------------------------------------------ sample

    def sample(self) -> ResourceSnapshot:
        """One validated snapshot; CPU percentages and byte counts cover the time since the last
        call."""
        with self._lock:
            now = self._counters()
            before = self._previous or now
            self._previous = now
        host_total = now.host_total_s - before.host_total_s
        load, rss, memory = self._gauges()
        gpu = self._gpu()
        return ResourceSnapshot(
            process_cpu_percent=_percent(
                now.process_cpu_s - before.process_cpu_s, now.wall_s - before.wall_s
            ),
            host_cpu_percent=min(100.0, _percent(now.host_busy_s - before.host_busy_s, host_total)),
            cpu_steal_percent=min(
                100.0, _percent(now.host_steal_s - before.host_steal_s, host_total)
            ),
            load_1m=load if math.isfinite(load) and load > 0 else 0.0,
            rss_bytes=rss,
            host_memory_percent=min(100.0, max(0.0, memory)) if math.isfinite(memory) else 0.0,
            io_read_bytes=_delta(now.io_read, before.io_read),
            io_write_bytes=_delta(now.io_write, before.io_write),
            net_sent_bytes=_delta(now.net_sent, before.net_sent),
            net_recv_bytes=_delta(now.net_recv, before.net_recv),
            gpu_utilization_percent=gpu.utilization_percent,
            gpu_memory_used_bytes=gpu.memory_used_bytes,
            gpu_memory_total_bytes=gpu.memory_total_bytes,
        )

    def close(self) -> None:
        """Release the GPU library (NVML's init is reference-counted per process)."""
        self.gpu.close()

    def __enter__(self) -> ResourceSampler:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
