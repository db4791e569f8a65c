"""Preemption simulator: which shard request of an iteration is followed by a kill (seeded).

Requests are counted among those sent to preemptible workers (reserved capacity is never
preempted). Decisions depend only on (config, iteration, that count), never on timing, so a
schedule replays exactly; the worker hit is whichever preemptible worker received the request.
"""

from __future__ import annotations

import random
from typing import List, Set

from rlinf_embodied.config import PreemptionConfig

__all__ = ["PreemptionSimulator"]


class PreemptionSimulator:
    """Decides, per dispatched shard request, whether its worker is preempted.

    Args:
        cfg: the ``elastic.preemption`` block.
        num_shards: shards per iteration (random kills are drawn from the first ``num_shards``
            preemptible requests).
    """

    def __init__(self, cfg: PreemptionConfig, num_shards: int) -> None:
        self.cfg, self.num_shards = cfg, num_shards
        self._due: Set[int] = set()

    def kill_indices(self, iteration: int) -> List[int]:
        """Preemptible-request indices of ``iteration`` after which the worker is killed."""
        c = self.cfg
        if c.mode == "schedule":
            return sorted(e.dispatch for e in c.schedule if e.iteration == iteration)
        if c.mode == "random":
            rng = random.Random(c.seed * 1_000_003 + iteration)
            k = min(c.kills_per_iteration, self.num_shards)
            return sorted(rng.sample(range(self.num_shards), k))
        return []

    def begin_iteration(self, iteration: int) -> None:
        """Arm the kills of ``iteration`` (kills of the last one that never came are dropped)."""
        self._due = set(self.kill_indices(iteration))

    def on_dispatch(self, preemptible_index: int) -> bool:
        """Whether the worker that received the ``preemptible_index``-th shard request sent to a
        preemptible worker in this iteration (0-based) is to be killed now."""
        if preemptible_index in self._due:
            self._due.discard(preemptible_index)
            return True
        return False
