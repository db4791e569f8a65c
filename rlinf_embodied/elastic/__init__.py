"""Elastic, preemptible rollout (RLBoost on the embodied workflow) and multi-node helpers.

* :class:`ElasticConfig` / :class:`PreemptionConfig`: the ``elastic:`` block of a job.
* :class:`~rlinf_embodied.elastic.pool.ElasticRolloutPool`: reserved + preemptible workers that
  join and leave; shards re-run from their seeds when a worker is lost.
* :class:`~rlinf_embodied.elastic.runner.ElasticEmbodiedRunner`: the embodied runner on it.
* :class:`~rlinf_embodied.elastic.multinode.LocalMultiNodeCluster`: real raylets on one machine.

Hook for the reasoning workflow: a reasoning runner plugs in by giving the pool a worker class
with ``run_shard(iteration, shard, version) -> {"shard", "traj", "episodes", "stats", ...}``
(one shard = a fixed slice of the iteration's prompts with per-prompt sampling seeds, so a
re-run reproduces the responses) and consuming :class:`~rlinf_embodied.elastic.pool.RolloutResult`.
Continuing a response from its partial tokens is not implemented.

Importing this package imports only the config; the rest loads on first use.
"""

from rlinf_embodied.elastic.config import ElasticConfig, PreemptionConfig, PreemptionEvent

__all__ = ["ElasticConfig", "LocalMultiNodeCluster", "PreemptionConfig", "PreemptionEvent"]


def __getattr__(name):
    if name == "LocalMultiNodeCluster":
        from rlinf_embodied.elastic.multinode import LocalMultiNodeCluster

        return LocalMultiNodeCluster
    raise AttributeError(name)
