"""Elastic, preemptible rollout (RLBoost on the embodied workflow) and multi-node helpers.

* The ``elastic:`` block of a job is :class:`~rlinf_embodied.config.ElasticConfig` (with
  :class:`~rlinf_embodied.config.PreemptionConfig`), in :mod:`rlinf_embodied.config.elastic`.
* :class:`~rlinf_embodied.elastic.pool.ElasticRolloutPool`: reserved + preemptible workers that
  join and leave; shards re-run from their seeds when a worker is lost.
* :class:`~rlinf_embodied.elastic.runner.ElasticEmbodiedRunner`: the embodied runner on it.
* :class:`~rlinf_embodied.elastic.multinode.LocalMultiNodeCluster`: real raylets on one machine.

* :class:`~rlinf_embodied.reasoning.elastic.ElasticReasoningRunner`: the reasoning runner on
  it, with token-level migration (a preempted worker's responses continue from their partial
  tokens elsewhere, bit-identical to an un-preempted run).

Other workloads plug in by giving the pool a worker class (``worker_cls``, ``init_args``) with
``run_shard(iteration, shard, version[, state]) -> {"shard", "traj", "stats", ...}``; with
``collect(..., initial_state=...)`` shards are resumable (a call may return ``{"partial":
state}``, see :mod:`rlinf_embodied.elastic.pool`).

Importing this package imports nothing; its modules load on first use.
"""

__all__ = ["LocalMultiNodeCluster"]


def __getattr__(name):
    if name == "LocalMultiNodeCluster":
        from rlinf_embodied.elastic.multinode import LocalMultiNodeCluster

        return LocalMultiNodeCluster
    raise AttributeError(name)
