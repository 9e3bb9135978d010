"""Running antdt services as child processes, the way they are deployed.

The demo, the benchmarks and the end-to-end tests start ``antdt sharder``,
``antdt monitor`` and the rest as separate processes configured only through
``ANTDT_*`` variables, then watch them through their HTTP endpoints:
``/readyz`` to know a service is serving, ``/metrics`` to know what it did.
Nothing here sleeps and hopes: every wait polls an observable condition and
fails with the child's own last words when it does not come.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from enum import Enum
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families
from pydantic import SecretStr

from antdt.embedded.broker import free_port
from antdt.errors import AntdtError
from antdt.settings import ENV_PREFIX, Settings


def settings_env(settings: Settings) -> dict[str, str]:
    """The ``ANTDT_*`` variables that reproduce ``settings`` in a child process."""
    env = {}
    for name, value in settings.model_dump(exclude_defaults=True).items():
        if value is None:
            continue
        if isinstance(value, SecretStr):
            value = value.get_secret_value()
        elif isinstance(value, Enum):
            value = value.value
        env[f"{ENV_PREFIX}{name.upper()}"] = str(value)
    return env


def http_get(port: int, path: str, timeout_s: float = 2.0) -> tuple[int, str]:
    """GET a path of a local health endpoint: (status, body), status 0 when nothing answers."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=timeout_s) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, ""
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return 0, ""


def scraped_samples(port: int) -> dict[str, float]:
    """The samples a local ``/metrics`` serves now, keyed ``name`` or ``name{label="v",...}``
    (labels sorted); empty when nothing answers."""
    status, text = http_get(port, "/metrics")
    if status != 200:
        return {}
    samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(sample.labels.items()))
            samples[f"{sample.name}{{{labels}}}" if labels else sample.name] = sample.value
    return samples


class ServiceProcess:
    """A running ``antdt <command>`` child with its health endpoint."""

    def __init__(self, process: subprocess.Popen, http_port: int, log_path: Path):
        self.process = process
        self.http_port = http_port
        self.log_path = log_path

    def get(self, path: str, timeout_s: float = 2.0) -> tuple[int, str]:
        """GET a path of the health endpoint: (status, body), status 0 when nothing answers."""
        return http_get(self.http_port, path, timeout_s)

    def is_ready(self) -> bool:
        return self.get("/readyz")[0] == 200

    def metrics(self) -> dict[str, float]:
        """Current samples, keyed ``name`` or ``name{label="v",...}`` (labels sorted)."""
        return scraped_samples(self.http_port)

    def metric(self, key: str) -> float:
        return self.metrics().get(key, 0.0)

    def wait_until(
        self,
        condition: Callable[[], bool],
        what: str,
        timeout_s: float = 60.0,
        every_s: float = 0.05,
    ) -> None:
        """Poll ``condition`` until true; AntdtError naming ``what`` (and the child's log)
        otherwise."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            # Exited first: another process on our port must not answer for a dead child.
            self.raise_if_exited(what)
            if condition():
                return
            time.sleep(every_s)
        raise AntdtError(f"{what}: not within {timeout_s:.0f} s; log:\n{self.log_tail()}")

    def raise_if_exited(self, what: str) -> None:
        """AntdtError with the child's log if it is no longer running."""
        if self.process.poll() is not None:
            raise AntdtError(
                f"{what}: the service exited with {self.process.returncode}; "
                f"log:\n{self.log_tail()}"
            )

    def wait_ready(self, timeout_s: float = 60.0) -> ServiceProcess:
        self.wait_until(self.is_ready, "service ready", timeout_s)
        return self

    def log_tail(self, chars: int = 4000) -> str:
        return self.log_path.read_text(errors="replace")[-chars:] if self.log_path.exists() else ""

    def stop(self, grace_s: float = 15.0) -> int:
        """SIGTERM, then SIGKILL after ``grace_s``; the exit code."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(grace_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return self.process.returncode


@contextmanager
def service_process(
    settings: Settings,
    command: str,
    *args: str,
    log_level: str = "WARNING",
    log_dir: Path | None = None,
    extra_env: dict[str, str] | None = None,
) -> Iterator[ServiceProcess]:
    """``antdt <command> <args>`` with ``settings`` in its environment, stopped on exit.

    The child gets a free port for its health endpoint and writes its output
    to a log file: in ``log_dir``, or in a folder of its own that goes with
    the child (a failure while it runs quotes the log's tail first).
    """
    port = free_port()
    own_dir = None if log_dir is not None else Path(tempfile.mkdtemp(prefix=f"antdt-{command}-"))
    log_dir = log_dir or own_dir
    log_path = log_dir / f"{command}-{port}.log"
    env = {**os.environ, **settings_env(settings), "PYTHONUNBUFFERED": "1", **(extra_env or {})}
    argv = [
        sys.executable,
        "-m",
        "antdt.cli.main",
        command,
        "--http-port",
        str(port),
        "--log-level",
        log_level,
        *args,
    ]
    with log_path.open("w") as log:
        process = subprocess.Popen(
            argv, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
        )
    service = ServiceProcess(process, port, log_path)
    try:
        yield service
    finally:
        service.stop()
        if own_dir is not None:
            shutil.rmtree(own_dir, ignore_errors=True)
