"""Actor -> rollout weight transfer, versioned.

After each update the actor gathers its sharded weights (rank 0 holds the full tensors) and puts
them in Ray's object store once; every rollout rank pulls them itself (RLBoost's pull-based
transfer). On one node the object store is shared memory, so a rollout worker on the actor's
device reads the tensors in place, without a copy through the driver or another process; across
nodes Ray moves them once per node. With LoRA only the trainable tensors (adapters and heads)
travel. Each transfer carries a version; on-policy rollouts refuse weights of another version
(:class:`~rlinf_embodied.workers.rollout_worker.StaleWeightsError`).
"""

from __future__ import annotations

import time

from rlinf_embodied.runtime import WorkerGroup

__all__ = ["WeightSync"]


class WeightSync:
    """Moves the actor group's weights to the rollout group.

    Args:
        actor: the actor WorkerGroup (ActorWorker ranks).
        rollout: the rollout WorkerGroup (RolloutWorker ranks).
        trainable_only: send only parameters with ``requires_grad`` (LoRA adapters, heads);
            the very first sync always sends everything.
    """

    def __init__(self, actor: WorkerGroup, rollout: WorkerGroup, trainable_only: bool = False):
        self.actor = actor
        self.rollout = rollout
        self.trainable_only = trainable_only
        self.version = -1
        self.last_seconds = 0.0

    def push(self, version: int) -> float:
        """Publish the actor's current weights as ``version`` and load them on every rollout rank.

        Returns:
            Seconds spent.
        """
        if version == self.version:
            return 0.0  # already there (e.g. pushed for evaluation)
        t0 = time.perf_counter()
        partial = self.trainable_only and self.version >= 0
        payload = self.actor.publish_weights(partial).wait()[0]
        loaded = self.rollout.load_weights(payload, version).wait()
        assert all(v == version for v in loaded), loaded
        self.version = version
        self.last_seconds = time.perf_counter() - t0
        return self.last_seconds
