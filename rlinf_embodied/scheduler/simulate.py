"""Discrete-event simulation of one iteration under a plan (paper section 5.2 scale studies).

Where :mod:`~rlinf_embodied.scheduler.cost_model` uses closed forms, the simulator plays the
iteration out: items are split into integer chunks, micro-batches and per-rank shares (uneven
when they do not divide), every call is an event on its device group's resource, micro-batches
of a split cycle circulate through the ring with FIFO queues at each member, pipeline chunks of a
spatial plan wait for their previous stage and for the stage's devices, and a temporal plan runs
its sides back to back with the switch costs. Calls pay the profile's ``loop_s`` and, on shared
CPU cores, ``ring_s`` as in the cost model; the core-seconds bound of stages that compute at the
same time on shared cores is the cost model's alone (events here only wait for their devices). Optional multiplicative jitter on every call
(``jitter=0.1`` draws each call time from ``U(0.9, 1.1)`` times the profile) estimates how
sensitive a plan is to variance. Profiles are per device, so clusters of any size (8 to 1024
devices) can be simulated on a laptop.
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Sequence
from dataclasses import dataclass, field

from rlinf_embodied.scheduler.cost_model import (
    Cycle,
    Leaf,
    Plan,
    Spatial,
    Temporal,
    components_of,
    even_split,
    first_stage,
    spatial_stages,
)
from rlinf_embodied.scheduler.profiles import WorkflowProfile

__all__ = ["SimResult", "simulate"]


@dataclass
class SimResult:
    """Outcome of one simulated iteration.

    Attributes:
        iteration_s: Simulated seconds for the iteration (including the weight sync).
        busy_s: Worker group -> seconds its devices spent in calls (per device group, not
            summed over devices).
        events: Number of call events simulated.
    """

    iteration_s: float
    busy_s: dict = field(default_factory=dict)
    events: int = 0


class _Sim:
    def __init__(self, profile: WorkflowProfile, jitter: float, seed: int):
        self.profile = profile
        self.jitter = jitter
        self.rng = random.Random(seed)
        self.busy: dict = {}
        self.events = 0

    def _noise(self) -> float:
        return 1.0 + self.rng.uniform(-self.jitter, self.jitter) if self.jitter else 1.0

    def calls(self, name: str, items: int, devices: int, batch: int) -> float:
        """Duration of ``devices`` ranks processing ``items`` (uneven shares) in calls of at
        most ``batch``: the slowest rank."""
        prof = self.profile[name]
        worst = 0.0
        shares = even_split(items, devices)
        if not self.jitter:  # identical ranks give identical times: simulate each size once
            shares = tuple(sorted(set(shares)))
        for share in shares:
            t = 0.0
            while share > 0:
                b = min(batch, share)
                t += prof.time(b) * self._noise()
                share -= b
                self.events += 1
            worst = max(worst, t)
        dur = worst * prof.scale(devices)
        self.busy[name] = self.busy.get(name, 0.0) + dur
        return dur

    def run(self, plan: Plan, items_frac: Sequence[tuple[int, int]], t0: float) -> float:
        """Simulate ``plan`` on the chunk ``items_frac`` (path of (index, count) splits) from
        time ``t0``; return the end time."""
        if isinstance(plan, Leaf):
            items = _portion(plan.stage.items, items_frac)
            for _ in range(plan.stage.rounds):
                t0 += self.calls(plan.name, items, plan.devices, plan.batch)
                t0 += self.profile[plan.name].loop_time(plan.devices)
            return t0
        if isinstance(plan, Cycle):
            return self._cycle(plan, _portion(plan.stage.items, items_frac), t0)
        if isinstance(plan, Temporal):
            t = self.run(plan.left, items_frac, t0)
            st = first_stage(plan.right)
            nbytes = st.in_bytes * _fraction(items_frac)
            if nbytes > 0:
                t += self.profile.message_s(nbytes, False, plan.devices, st.in_tensors)
            t = self.run(plan.right, items_frac, t)
            if plan.offload:
                t += sum(
                    self.profile[c].offload_s + self.profile[c].onload_s
                    for c in components_of(plan)
                )
            return t
        return self._pipeline(plan, items_frac, t0)

    def _pipeline(self, plan: Spatial, items_frac, t0: float) -> float:
        stages = spatial_stages(plan)
        free = [t0] * len(stages)
        end = t0
        for c in range(plan.chunks):
            path = list(items_frac) + [(c, plan.chunks)]
            ready = t0
            for s, stage in enumerate(stages):
                start = max(ready, free[s])
                if s > 0:
                    st = first_stage(stage)
                    nbytes = st.in_bytes * _fraction(path)
                    if nbytes > 0:
                        start += self.profile.message_s(nbytes, True, plan.devices, st.in_tensors)
                ready = free[s] = self.run(stage, path, start)
            end = max(end, ready)
        return end

    def _cycle(self, plan: Cycle, items: int, t0: float) -> float:
        members = plan.stage.members
        devs = plan.member_devices()
        sizes = even_split(items, plan.micro_batches)
        rounds = plan.stage.rounds
        free = [t0] * (len(members) if plan.split else 1)
        ring = plan.stage.ring_bytes
        tensors = plan.stage.ring_tensors or (1,) * len(ring)
        pipelined = plan.split and sum(1 for n in sizes if n > 0) > 1
        alternate = self.profile.cpu_cores > 0 and not pipelined
        # event: (ready time, seq, micro-batch, round, member index)
        heap = [(t0, j, j, 0, 0) for j in range(len(sizes)) if sizes[j] > 0]
        heapq.heapify(heap)
        seq, end = len(heap), t0
        while heap:
            ready, _, j, r, i = heapq.heappop(heap)
            res = i if plan.split else 0
            start = max(ready, free[res])
            start += self.profile.message_s(ring[i - 1] * sizes[j], plan.split, plan.devices,
                                            tensors[i - 1])
            call = self.calls(members[i], sizes[j], devs[i], sizes[j])
            prof = self.profile[members[i]]
            if alternate:
                call += min(prof.ring_s, call)
            done = start + call + prof.loop_s
            free[res] = done
            nxt_i, nxt_r = (i + 1) % len(members), r + (i + 1) // len(members)
            if nxt_r < rounds:
                heapq.heappush(heap, (done, seq, j, nxt_r, nxt_i))
                seq += 1
            end = max(end, done)
        return end


def _portion(total: int, path: Sequence[tuple[int, int]]) -> int:
    for index, count in path:
        total = even_split(total, count)[index]
    return total


def _fraction(path: Sequence[tuple[int, int]]) -> float:
    f = 1.0
    for _, count in path:
        f /= count
    return f


def simulate(
    plan: Plan, profile: WorkflowProfile, jitter: float = 0.0, seed: int = 0
) -> SimResult:
    """Simulate one iteration of ``plan``.

    Args:
        plan: A plan tree from the planner or built by hand.
        profile: Per-device component profiles (use :meth:`WorkflowProfile.scaled` for other
            hardware).
        jitter: Relative half-width of uniform noise on every call time, in [0, 1).
        seed: Seed of the noise.

    Returns:
        The simulated iteration time, per-group busy time and event count.

    Raises:
        ValueError: if ``jitter`` is outside [0, 1).
    """
    if not 0.0 <= jitter < 1.0:
        raise ValueError(f"jitter must be in [0, 1) (got {jitter}).")
    sim = _Sim(profile, jitter, seed)
    end = sim.run(plan, [], 0.0)
    return SimResult(end + profile.weight_sync_s, dict(sorted(sim.busy.items())), sim.events)

