"""antdt under torchrun (torch.distributed.elastic): identity, leaving an elastic job, synchronous
training.

:class:`~antdt.worker.elastic.job.ElasticJob` (``from antdt.worker import
ElasticJob``) is what a DDP script swaps in for its sampler, loader and DDP
wrapper (see ``examples/``). Nothing is imported here: the agent reads
:mod:`.env` without loading torch.
"""
