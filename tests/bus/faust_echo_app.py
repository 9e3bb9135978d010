"""A tiny Faust app for the interoperability test, run as its own process.

It consumes WorkerMetrics (decoded by antdt's Faust codec) from the metrics
topic and answers each with a CommandAck (encoded by the same codec) on the
acks topic, so one test covers confluent-kafka -> Faust and Faust ->
confluent-kafka. Settings come from ANTDT_* variables, as in a deployment.
"""

from __future__ import annotations

from mode import Worker

from antdt.bus.faust_app import make_faust_app
from antdt.schemas.models import AckStatus, CommandAck, WorkerMetrics
from antdt.settings import load_settings
from antdt.topics import topic_spec

settings = load_settings()
app = make_faust_app(settings, "echo-test", topic_allow_declare=False)
metrics = app.topic(topic_spec("worker", "metrics").full_name(settings.topic_prefix))
acks = app.topic(topic_spec("worker", "acks").full_name(settings.topic_prefix))


@app.agent(metrics)
async def answer(stream):
    async for event in stream.events():
        value = event.value
        if not isinstance(value, WorkerMetrics):
            raise TypeError(f"expected WorkerMetrics, got {type(value).__name__}")
        ack = CommandAck(
            command_id=f"ack-{value.seq}",
            job_id=value.job_id,
            worker_id=value.worker_id,
            status=AckStatus.APPLIED,
            reason=f"samples={value.samples}",
            applied_step=value.last_step,
            controller_epoch=0,
            timestamp=value.window_end,
        )
        await acks.send(key=event.key, value=ack)


@app.task
async def announce_ready() -> None:
    print("FAUST-READY", flush=True)


if __name__ == "__main__":
    Worker(app, loglevel="warning", redirect_stdouts=False).execute_from_commandline()
