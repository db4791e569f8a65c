"""Pull-based, versioned weight transfer for elastic rollout workers (RLBoost, section 3).

The actor publishes each version once into Ray's object store and registers the reference with
a :class:`WeightStore` actor pinned to the driver's (reserved) node. Workers are never pushed
to: a worker handed a request of version v that holds another version fetches v itself, so a
worker that joins mid-run provisions itself without the trainer's involvement.
"""

from __future__ import annotations

import time
from typing import Optional

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from rlinf_embodied.weight_sync import WeightSync

__all__ = ["ElasticWeightSync", "PullsWeights", "WeightStore", "weight_store"]

KEEP_VERSIONS = 2
"""Versions the store keeps: the current one and the previous (a request of the old version
may still be in flight when the next is published; on-policy runs never ask for older)."""


class PullsWeights:
    """Mixin of an elastic worker: holds one weights version and pulls others from the
    :class:`WeightStore` itself. The worker class implements :meth:`_load_weights`."""

    def _connect_weights(self, store_name: str) -> None:
        """Find the store; a worker joining mid-run provisions itself with the latest version."""
        self.store = ray.get_actor(store_name)
        self.version = -1
        self.pulls = 0
        latest = ray.get(self.store.latest.remote())
        if latest >= 0:
            self._pull(latest)

    def _ensure_version(self, version: int) -> None:
        """Hold weights ``version`` (pulled if another one is loaded)."""
        if self.version != version:
            self._pull(version)

    def _pull(self, version: int) -> None:
        payload = ray.get(self.store.get.remote(version))
        if payload is None:
            raise RuntimeError(f"weights version {version} is not in the store (latest: "
                               f"{ray.get(self.store.latest.remote())}); publish it before the rollout.")
        self._load_weights(ray.get(payload[0]), int(version))
        self.version = int(version)
        self.pulls += 1

    def _load_weights(self, state: dict, version: int) -> None:
        raise NotImplementedError


@ray.remote(num_cpus=0)
class WeightStore:
    """Version -> ``[ObjectRef]`` of a full state dict (the list keeps Ray from resolving it)."""

    def __init__(self) -> None:
        self._versions: dict[int, list] = {}

    def publish(self, version: int, payload: list) -> None:
        self._versions[int(version)] = payload
        for v in sorted(self._versions)[:-KEEP_VERSIONS]:
            del self._versions[v]

    def get(self, version: int) -> Optional[list]:
        """The payload of ``version`` (None if unknown or already dropped)."""
        return self._versions.get(int(version))

    def latest(self) -> int:
        """The newest version (-1 before the first publish)."""
        return max(self._versions, default=-1)


def weight_store(name: str, create: bool = False):
    """The named :class:`WeightStore` of a run; ``create`` starts it on the driver's node.

    The creator must keep the returned handle: the store lives as long as it does."""
    if not create:
        return ray.get_actor(name)
    here = ray.get_runtime_context().get_node_id()
    return WeightStore.options(
        name=name, scheduling_strategy=NodeAffinitySchedulingStrategy(here, soft=False)
    ).remote()


class ElasticWeightSync(WeightSync):
    """:class:`~rlinf_embodied.weight_sync.WeightSync` that also registers every version with a
    :class:`WeightStore`, for elastic workers to pull (always the full weights: a worker that
    joins needs every tensor, not just the LoRA adapters)."""

    def __init__(self, actor, rollout, store) -> None:
        super().__init__(actor, rollout, trainable_only=False)
        self.store = store

    def push(self, version: int) -> float:
        """Publish ``version`` to the store and load it on the placed rollout group.

        Returns:
            Seconds spent.
        """
        if version == self.version:
            return 0.0
        t0 = time.perf_counter()
        payload = self.actor.publish_weights(False).wait()[0]
        ray.get(self.store.publish.remote(version, payload))
        loaded = self.rollout.load_weights(payload, version).wait()
        if any(v != version for v in loaded):
            raise RuntimeError(f"rollout ranks loaded versions {loaded}, expected {version}")
        self.version = version
        self.last_seconds = time.perf_counter() - t0
        return self.last_seconds
