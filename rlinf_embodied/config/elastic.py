"""Config of elastic, preemptible rollout (the ``elastic:`` block of a job YAML).

:class:`ElasticConfig` (the pool of reserved and preemptible workers and how rollout is
sharded over it), :class:`PreemptionConfig` and :class:`PreemptionEvent` (the preemption
simulator) and the allowed values of their string fields. :class:`~rlinf_embodied.config.JobConfig`
and the reasoning job hold one :class:`ElasticConfig` field; the elastic path
(:mod:`rlinf_embodied.elastic`) reads it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional

from rlinf_embodied.config.errors import ConfigError

__all__ = [
    "ElasticConfig",
    "PREEMPTION_MODES",
    "PREEMPTION_TARGETS",
    "PreemptionConfig",
    "PreemptionEvent",
    "RESTART_POLICIES",
]

PREEMPTION_MODES = ("off", "schedule", "random")
PREEMPTION_TARGETS = ("worker", "node")
RESTART_POLICIES = ("immediate", "next_iteration", "never")


@dataclass
class PreemptionEvent:
    """One scheduled preemption: kill the preemptible worker (or its node) that received the
    ``dispatch``-th preemptible shard request of ``iteration`` (0-based, re-runs counted)."""

    iteration: int = 0
    """Training iteration (0-based) in which the preemption happens."""
    dispatch: int = 0
    """Index, counting only the iteration's shard requests sent to preemptible workers (0 =
    the first), of the request after which the worker that received it is killed (reserved
    capacity is never preempted). A kill whose request never comes is dropped."""


@dataclass
class PreemptionConfig:
    """The preemption simulator: kills (and restarts) preemptible workers or nodes on a seeded
    schedule, for tests and benchmarks. Real preemptions need no config: a dead worker is always
    detected, its in-flight shard re-queued and (per ``restart``) replaced."""

    mode: str = "off"
    """``off``; ``schedule`` (the events in ``schedule``); or ``random`` (``kills_per_iteration``
    preemptible-request indices per iteration drawn from ``Random(seed, iteration)``)."""
    seed: int = 0
    """Seed of ``random`` mode; the same seed kills after the same dispatch indices."""
    kills_per_iteration: int = 3
    """Preemptions per iteration in ``random`` mode (drawn from the first ``num_shards``
    preemptible requests; fewer happen when fewer requests go to preemptible workers)."""
    schedule: List[PreemptionEvent] = field(default_factory=list)
    """The events of ``schedule`` mode."""
    target: str = "worker"
    """What a preemption kills: the ``worker`` process (``ray.kill``), or its whole ``node``
    (needs a node provider, e.g. :class:`rlinf_embodied.elastic.LocalMultiNodeCluster`)."""
    restart: str = "immediate"
    """When the capacity comes back: ``immediate`` (a replacement worker, or node, starts at once
    and joins mid-iteration), ``next_iteration`` (at the start of the next iteration), or
    ``never`` (the run continues with fewer workers; reserved-only when none is left)."""
    kill_delay_s: float = 0.0
    """Seconds between the chosen dispatch and the kill, to land it mid-shard; 0 kills at once
    (the shard is in flight either way)."""

    def __post_init__(self) -> None:
        if str(self.mode).lower() == "false":  # YAML 1.1 reads a bare `off` as false
            self.mode = "off"
        if self.mode not in PREEMPTION_MODES:
            raise ConfigError(f"Set elastic.preemption.mode to one of {PREEMPTION_MODES} (got {self.mode!r}).")
        if self.target not in PREEMPTION_TARGETS:
            raise ConfigError(f"Set elastic.preemption.target to one of {PREEMPTION_TARGETS} (got {self.target!r}).")
        if self.restart not in RESTART_POLICIES:
            raise ConfigError(f"Set elastic.preemption.restart to one of {RESTART_POLICIES} (got {self.restart!r}).")
        if self.kills_per_iteration < 0 or self.kill_delay_s < 0:
            raise ConfigError(
                f"Set elastic.preemption.kills_per_iteration and kill_delay_s to >= 0 "
                f"(got {self.kills_per_iteration} and {self.kill_delay_s}).")


@dataclass
class ElasticConfig:
    """Elastic rollout (RLBoost-style): rollout runs as independent *shards* (``shard_envs``
    envs for ``trainer.rollout_steps`` policy queries, seeded by iteration and shard) on a pool
    of reserved and preemptible workers that may join and leave while training runs.

    A worker is one process owning its envs and a copy of the policy (env + rollout fused, like
    an RLBoost rollout instance). It pulls the weights of the requested version itself. A killed
    worker's shard is re-run from its seeds on another worker; results are kept per shard id, so
    no episode is lost or counted twice, and training is identical to a run without preemptions.
    """

    enabled: bool = False
    """Collect training rollouts through the elastic pool (evaluation keeps the placed groups)."""
    reserved_workers: int = 1
    """Workers on reserved (never preempted) capacity: the driver's node."""
    preemptible_workers: int = 0
    """Workers on preemptible capacity: nodes advertising ``preemptible_resource`` (any node
    when it is empty). 0 runs reserved-only (RLBoost itself needs at least one)."""
    preemptible_resource: str = "preemptible"
    """Ray custom resource marking preemptible nodes (``ray start --resources='{"preemptible":
    1}'``); empty places preemptible workers on the driver's node too (simulation)."""
    standby_workers: int = 0
    """Spare preemptible workers, started with the pool (weights pulled, envs built) that take
    no shard until a preemptible worker is lost: one then takes its place at once, so a
    preemption costs its lost shard's re-run but no start-up; the spare's own replacement
    starts when the iteration's rollout ends. They hold memory, not compute."""
    shard_envs: int = 0
    """Envs per shard; 0 picks the largest size up to ``env.num_envs / (reserved_workers +
    preemptible_workers)`` that divides every actor rank's envs (one shard per worker). Set it
    explicitly to keep trajectories identical across pools of different sizes: the shard size
    is part of the seeding (each shard resets and samples as one batch)."""
    shard_responses: int = 0
    """Reasoning workflow: responses per shard (0 = ``algorithm.group_size``, one prompt's
    group); must divide the step's ``prompts_per_step * group_size`` responses."""
    chunk_tokens: int = 4
    """Reasoning workflow: tokens a worker generates per response before it reports the partial
    tokens back; a preemption loses at most this many tokens of each in-flight response."""
    torch_threads: int = 1
    """CPU threads of each elastic worker process."""
    throughput_ema: float = 0.5
    """Weight of the newest iteration in the per-class throughput estimate (shards/s) that sets
    the reserved/preemptible split (1 = last iteration only)."""
    max_attempts: int = 8
    """Attempts per shard before the iteration fails (a shard that raises on every worker is a
    bug, not a preemption)."""
    join_timeout_s: float = 300.0
    """Seconds a joining worker may take to start (process, imports, envs)."""
    wait_for_joins: bool = False
    """Start each iteration only once the workers still starting have joined. For tests and
    benchmarks (the same pool every iteration); keep it off in real runs, where a slow node
    must not stall training."""
    records: bool = True
    """Write ``elastic/iter_<i>.json`` in the run directory: every finished episode of the
    iteration (by shard, env and ordinal), which worker ran each shard and how often."""
    preemption: PreemptionConfig = field(default_factory=PreemptionConfig)
    """The preemption simulator."""

    def __post_init__(self) -> None:
        if self.reserved_workers < 1:
            raise ConfigError(
                f"Set elastic.reserved_workers to at least 1 (got {self.reserved_workers}): "
                f"reserved capacity is what the run falls back to when every preemptible worker "
                f"is gone.")
        if self.chunk_tokens < 1 or self.shard_responses < 0:
            raise ConfigError(f"Set elastic.chunk_tokens >= 1 and elastic.shard_responses >= 0 "
                         f"(got {self.chunk_tokens} and {self.shard_responses}).")
        if min(self.preemptible_workers, self.shard_envs, self.standby_workers) < 0:
            raise ConfigError(
                f"Set elastic.preemptible_workers, elastic.standby_workers and elastic.shard_envs "
                f"to >= 0 (got {self.preemptible_workers}, {self.standby_workers} and "
                f"{self.shard_envs}).")
        if not 0.0 < self.throughput_ema <= 1.0:
            raise ConfigError(f"Set elastic.throughput_ema in (0, 1] (got {self.throughput_ema}).")
        if self.max_attempts < 1:
            raise ConfigError(f"Set elastic.max_attempts to at least 1 (got {self.max_attempts}).")

    def num_shards_for(self, num_envs: int, actor_ranks: int = 1) -> Optional[int]:
        """Shards per iteration for ``num_envs`` envs (None: the shard size does not divide)."""
        n = self.shard_envs or max(1, num_envs // (self.reserved_workers + self.preemptible_workers))
        while not self.shard_envs and n > 1 and (num_envs % n or (num_envs // actor_ranks) % n):
            n -= 1  # the largest even split not above one shard per worker
        if num_envs % n or (num_envs // actor_ranks) % n:
            return None
        return num_envs // n
