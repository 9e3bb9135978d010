"""The README's outside-consumer loop, run as printed against a real broker: it skips markers.

Only the address, the topic's prefix, a short session (the embedded broker holds a group join
for half the session timeout) and a bound on the loop are substituted.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from antdt.bus.clients import producing
from antdt.bus.markers import send_marker
from antdt.schemas import examples
from antdt.schemas.codec import make_codec
from antdt.topics import worker_key

README = Path(__file__).parents[2] / "README.md"


class Printed(Exception):
    """The loop printed its first line: what an operator would see."""


def readme_loop() -> str:
    text = README.read_text()
    start = text.index("```python", text.index("**Marker records.**")) + len("```python")
    return text[start : text.index("```", start)]


@pytest.mark.e2e
def test_the_readme_consumer_skips_a_marker_and_prints_the_command(settings, topics):
    topic = settings.topic("controller", "commands")
    command = examples.mitigation_command()
    key = worker_key(command.job_id, command.target_worker)
    with producing(settings) as producer:
        send_marker(producer, topic, key)  # first on the partition: a reader that decodes it fails
        producer.produce(topic, key=key, value=make_codec().encode(command))
    code = (
        readme_loop()
        .replace('"kafka:9092"', repr(settings.bootstrap_servers))
        .replace('"antdt.controller.commands"', repr(topic))
        .replace(
            '"auto.offset.reset": "earliest"',
            '"auto.offset.reset": "earliest", "session.timeout.ms": 2000',
        )
        .replace("while True:", "for _ in range(120):")
    )
    lines = []

    def capture(*values):
        lines.append(" ".join(str(v) for v in values))
        raise Printed

    namespace = {"print": capture}
    try:
        with pytest.raises(Printed):
            exec(compile(code, "README.md", "exec"), namespace)
    finally:
        if "consumer" in namespace:
            namespace["consumer"].close()
    assert lines == [
        f"{command.command_id} {command.target_worker} {command.action.value} {command.reason}"
    ]
