"""EVICT under torchrun: the node leaves the job.

torchrun restarts a worker that exits with an error, so exiting is not
enough to leave: the evicted worker stops its node's torchrun agent (its
parent) with SIGTERM, which stops the node's workers and leaves the
rendezvous open. In an elastic job (``--nnodes MIN:MAX``) the other nodes'
groups break, torchrun restarts them, and they meet again without this
node, as long as at least MIN remain; in a job of fixed size the job ends.
"""

from __future__ import annotations

import logging
import os
import signal
import time

log = logging.getLogger(__name__)

#: How long the evicted worker waits for its torchrun agent to stop it.
STOP_WAIT_S = 30.0


def leave_torchrun_job(wait_s: float = STOP_WAIT_S) -> None:
    """Stop this node's torchrun agent, then wait (bounded) for it to stop this process."""
    agent = os.getppid()
    if agent <= 1:
        log.warning("evicted, but the torchrun agent is gone already: exiting")
        return
    log.warning(
        "evicted: stopping this node's torchrun agent (pid %d) so the node leaves the job", agent
    )
    os.kill(agent, signal.SIGTERM)
    deadline = time.monotonic() + wait_s
    while os.getppid() == agent:
        if time.monotonic() >= deadline:
            log.warning(
                "the torchrun agent did not stop this worker within %.0f s: exiting", wait_s
            )
            return
        time.sleep(0.1)
