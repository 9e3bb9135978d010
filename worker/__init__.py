"""The agent a training script embeds: metrics, data shards, commands.

``from antdt.worker import Agent, ShardedDataset`` is all a script needs;
:mod:`antdt.worker.ddp` adds per-worker batch sizes under DDP and
:mod:`antdt.worker.checkpoint` saves the shard-state version with the model;
``ElasticJob`` is synchronous training under torchrun (:mod:`antdt.worker.elastic`),
``PartialReduceJob`` partial reduce (:mod:`antdt.worker.preduce`) and
``ParameterServerJob`` asynchronous training (:mod:`antdt.worker.ps`), the same loop.
Names are imported lazily, so services that only need the shard client do
not pay for importing torch.
"""

from antdt.exports import lazy_exports

__all__, __getattr__ = lazy_exports(
    __name__,
    {
        "Agent": "antdt.worker.agent",
        "AgentSpec": "antdt.worker.agent",
        "AgentState": "antdt.worker.agent",
        "WorkerExit": "antdt.worker.agent",
        "EXIT_RESTART": "antdt.worker.agent",
        "EXIT_EVICTED": "antdt.worker.agent",
        "ShardedDataset": "antdt.worker.dataset",
        "ElasticJob": "antdt.worker.elastic.job",
        "PartialReduceJob": "antdt.worker.preduce.job",
        "ParameterServerJob": "antdt.worker.ps.job",
        "BatchSizing": "antdt.sizing",
        "ShardClient": "antdt.worker.shard_client",
    },
)
