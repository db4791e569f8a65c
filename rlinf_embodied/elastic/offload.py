"""Adaptive rollout offload: how shards are split between reserved and preemptible workers.

RLBoost (``rollout-manager/src/balance.rs``, see ../shared/REFERENCE.md) moves the reserved
cluster's share of rollout by a third of the measured idle-time gap each step and cannot run
without remote workers. Here the split follows measured throughput directly: each worker class
keeps an exponential moving average of its seconds per shard, and an idle worker takes the next
shard only if that finishes the iteration's queue no later than leaving it to the others
(earliest-finish-time list scheduling on the estimates). With no preemptible worker alive the
reserved workers take everything; when preemptible workers come back they get shards again at
once, and their share converges to their throughput within a few iterations.
"""

from __future__ import annotations

import heapq
from typing import Dict, Iterable, List, Optional, Tuple

__all__ = ["OffloadPlanner", "finish_time"]

RESERVED, PREEMPTIBLE = "reserved", "preemptible"
STRAGGLER_FACTOR = 2.0
"""A busy worker past this many times its class's seconds per shard no longer counts as
capacity in the take-or-leave decision."""


def finish_time(shards: int, workers: Iterable[Tuple[float, float]]) -> float:
    """When ``shards`` equal shards finish on ``workers`` under greedy earliest-finish dispatch.

    Args:
        shards: shards left to run (>= 0).
        workers: ``(available_at, seconds_per_shard)`` per worker, in seconds from now.

    Returns:
        Seconds from now until the last shard finishes (0 for no shards; ``inf`` for shards
        but no worker).
    """
    heap = [(a + s, s) for a, s in workers]
    if not shards:
        return 0.0
    if not heap:
        return float("inf")
    heapq.heapify(heap)
    end = 0.0
    for _ in range(shards):
        done, s = heapq.heappop(heap)
        end = max(end, done)
        heapq.heappush(heap, (done + s, s))
    return end


class OffloadPlanner:
    """Per-class throughput estimates and the take-or-leave decision of an idle worker.

    Args:
        ema: weight of the newest iteration's measurement (1 = last iteration only).
        prior_s: seconds per shard assumed for a class before it was measured.
    """

    def __init__(self, ema: float = 0.5, prior_s: float = 1.0) -> None:
        self.ema = ema
        self.prior_s = prior_s
        self.seconds: Dict[str, Optional[float]] = {RESERVED: None, PREEMPTIBLE: None}

    def estimate(self, kind: str) -> float:
        """Seconds per shard of a worker of ``kind`` (the other class's estimate, else the prior,
        before the first measurement)."""
        own = self.seconds.get(kind)
        if own is not None:
            return own
        known = [v for v in self.seconds.values() if v is not None]
        return known[0] if known else self.prior_s

    def observe(self, kind: str, seconds_per_shard: List[float]) -> None:
        """Fold one iteration's measured shard durations of ``kind`` into its estimate."""
        if not seconds_per_shard:
            return
        mean = sum(seconds_per_shard) / len(seconds_per_shard)
        old = self.seconds.get(kind)
        self.seconds[kind] = mean if old is None else self.ema * mean + (1 - self.ema) * old

    def should_take(self, kind: str, queued: int, others: List[Tuple[str, float]]) -> bool:
        """Whether an idle worker of ``kind`` should take the next of ``queued`` shards.

        Args:
            kind: the idle worker's class.
            queued: shards waiting (>= 1).
            others: ``(kind, elapsed_s)`` of every other live worker: seconds on its current
                shard, -1 when idle. A worker past ``STRAGGLER_FACTOR`` times its estimate is
                left out (a hung or dying worker must not hold the queue back).

        Returns:
            True if taking it does not delay the estimated end of the queue.
        """
        avail = [(0.0 if el < 0 else max(0.0, self.estimate(k) - el), self.estimate(k))
                 for k, el in others if el <= STRAGGLER_FACTOR * self.estimate(k)]
        leave = finish_time(queued, avail)
        take = max(self.estimate(kind), finish_time(queued - 1, avail))
        return take <= leave

    def planned_share(self, reserved: int, preemptible: int, shards: int) -> float:
        """Fraction of ``shards`` the estimates give the reserved workers when all start idle."""
        if shards <= 0 or reserved + preemptible == 0:
            return 0.0
        r, p = self.estimate(RESERVED), self.estimate(PREEMPTIBLE)
        heap = [(r, r, RESERVED)] * reserved + [(p, p, PREEMPTIBLE)] * preemptible
        heapq.heapify(heap)
        taken = 0
        for _ in range(shards):
            done, s, k = heapq.heappop(heap)
            taken += k == RESERVED
            heapq.heappush(heap, (done + s, s, k))
        return taken / shards
