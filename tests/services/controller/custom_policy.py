"""A custom policy, loaded by import path in the tests."""

from antdt.schemas.models import CommandAction, StragglerVerdict
from antdt.services.controller.policy import NOTHING, Decision, Intent


class PauseEveryStraggler:
    name = "pause-every-straggler"

    def decide(self, job, event, config, now):
        if isinstance(event, StragglerVerdict) and event.kind.value == "STRAGGLER":
            return Decision((Intent(CommandAction.PAUSE, event.worker_id, "custom: pause"),))
        return NOTHING


NOT_A_POLICY = object()
