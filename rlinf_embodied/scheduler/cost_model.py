"""Execution plans as small trees, and their predicted iteration time and memory.

Plan trees (paper section 3.3, "temporal, spatial and hybrid scheduling"):

* :class:`Leaf` - one worker group, data-parallel on ``devices`` devices, ``batch`` items per
  device per call (its micro-batch size).
* :class:`Cycle` - a collapsed interaction loop (env <-> rollout). ``split=False``: the members
  share all devices and run one after the other (context switched per micro-batch, both
  resident). ``split=True``: the devices are divided evenly among the members (section 3.4,
  "cycle-collapsed nodes are evenly partitioned") and the ``micro_batches`` micro-batches are
  pipelined around the ring (elastic pipelining, section 3.3).
* :class:`Temporal` - left then right on the same devices; with ``offload`` the side not running
  is moved off the devices (pay offload + onload of each side once per pass).
* :class:`Spatial` - left and right on disjoint devices, the iteration's data streamed through
  them in ``chunks`` equal chunks (pipeline granularity).

Cost formulas (all times in seconds; ``f`` is the fraction of one iteration's data a call
processes, 1 at the root):

* Leaf: per round, a device processes ``n = ceil(items * f / d)`` items in ``ceil(n / batch)``
  calls; time = ``rounds * (sum(call times) * dp_efficiency ** -log2(d) + loop_s +
  loop_dp_s * log2(d))`` (what the real loop adds per round: the optimizer step, and the
  collectives of ``d`` ranks).
* Cycle: ``e_i`` is member i's time on one micro-batch (incl. the transfer of its ring input
  when split), ``B_i`` its busy time per round over all ``m`` micro-batches (integer sizes
  ``q`` and ``q + 1``; member times include their input message and ``loop_s``). Shared:
  ``T * sum_i B_i``. Split: ``T * sum_i e_i`` for ``m = 1``; else
  ``max(T * B_b + sum_i e_i - e_b, T * sum_i e_i)`` with ``b`` the bottleneck member - a ring
  pipeline whose bottleneck never idles, plus one pass of the others to fill or drain; exact
  for two members with equal micro-batches.
* Shared CPU cores (profile ``cpu_cores = C > 0``: CPU device slots are shares of one node's
  cores, not devices of their own). Members that alternate (shared cycle, or split with
  ``m = 1``) each pay ``min(ring_s, call time)`` per call: the partner's idle threads still spin
  on the cores the member needs. In a pipelined split cycle the members compute at the same
  time, and the cores bound the steady state: ``T * B_b`` becomes
  ``T * max(B_b, sum_i B_i * min(c_i, C) / C)`` with ``c_i`` member i's CPU demand (threads it
  keeps busy, :meth:`~.profiles.ComponentProfile.demand`): the pipeline cannot run more
  core-seconds than the cores supply. Likewise the steady state of a chunked spatial pipeline,
  ``max_s c_s``, becomes ``max(max_s c_s, sum_s c_s * min(c_s', C) / C)`` with ``c_s'`` the
  largest demand in stage s. With ``C = 0`` (real accelerators) none of this applies.
* Fractional work (a chunk of ``x`` items) is the mean over ``floor(x)`` and ``ceil(x)``.
* Messages: every ring input of a cycle member (per micro-batch and round: the observations of
  its envs to the rollout, their action chunks back) and the data entering a later stage (the
  trajectories handed to the actor) is one channel message costing
  :meth:`WorkflowProfile.message_s` - the measured per-message cost of the relation of the two
  groups (shared devices or apart, one node or several); profiles without message costs keep the
  older rule (free on shared devices, a link transfer between disjoint ones).
* Temporal: ``time(L) + time(R) + hand-off message (+ offload and onload of every component of
  both sides)``.
* Spatial: stages ``s_1..s_n`` (nested spatial plans with the same ``chunks`` flatten into one
  pipeline), ``c_s`` = time of stage s on ``f / k`` of the data plus the message of its input;
  time = ``sum_s c_s + (k - 1) * max_s c_s`` (fill, steady state and drain).
* Iteration = root time at ``f = 1`` plus one weight sync.

Memory per device: a leaf needs :meth:`ComponentProfile.memory` at its largest call; members of a
shared cycle and the two sides of a non-offloaded temporal plan add up, an offloaded temporal
plan needs the larger side, spatial plans and split cycles sit on different devices.
:class:`discrete-event simulation <rlinf_embodied.scheduler.simulate>` checks these formulas.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Union

from rlinf_embodied.scheduler.graph import Stage
from rlinf_embodied.scheduler.profiles import GiB, WorkflowProfile

__all__ = [
    "CostModel",
    "Cycle",
    "Leaf",
    "Plan",
    "Spatial",
    "Temporal",
    "assign_devices",
    "components_of",
    "describe",
    "even_split",
    "plan_mode",
]


def _hash_once(self) -> int:
    h = self.__dict__.get("_hash")
    if h is None:
        h = hash(tuple(getattr(self, f) for f in self.__dataclass_fields__))
        object.__setattr__(self, "_hash", h)
    return h


def _plan_node(cls):
    """Frozen dataclass whose hash is computed once (plans are cache keys of deep trees)."""
    cls = dataclass(frozen=True)(cls)
    cls.__hash__ = _hash_once
    return cls


@_plan_node
class Leaf:
    """One worker group data-parallel on ``devices`` devices, ``batch`` items per call."""

    stage: Stage
    devices: int
    batch: int

    @property
    def name(self) -> str:
        return self.stage.members[0]


@_plan_node
class Cycle:
    """A collapsed loop on ``devices`` devices: shared (``split=False``) or evenly split."""

    stage: Stage
    devices: int
    split: bool
    micro_batches: int

    def member_devices(self) -> tuple[int, ...]:
        """Devices per member (split) or the shared count repeated."""
        k = len(self.stage.members)
        return even_split(self.devices, k) if self.split else (self.devices,) * k


@_plan_node
class Temporal:
    """``left`` then ``right`` on the same devices; ``offload`` swaps them in and out."""

    left: Plan
    right: Plan
    offload: bool

    @property
    def devices(self) -> int:
        return self.left.devices


@_plan_node
class Spatial:
    """``left`` and ``right`` on disjoint devices, data streamed in ``chunks`` chunks."""

    left: Plan
    right: Plan
    chunks: int

    @property
    def devices(self) -> int:
        return self.left.devices + self.right.devices


Plan = Union[Leaf, Cycle, Temporal, Spatial]
Segments = tuple[tuple[int, float], ...]
"""Per-device memory as runs ``(device count, bytes per device)`` in device order."""


def even_split(total: int, parts: int) -> tuple[int, ...]:
    """``total`` split into ``parts`` integers differing by at most one, larger ones first."""
    q, r = divmod(total, parts)
    return tuple(q + 1 if i < r else q for i in range(parts))


def components_of(plan: Plan) -> list[str]:
    """Worker group names in the plan, left to right."""
    if isinstance(plan, Leaf):
        return [plan.name]
    if isinstance(plan, Cycle):
        return list(plan.stage.members)
    return components_of(plan.left) + components_of(plan.right)


def spatial_stages(plan: Spatial) -> list[Plan]:
    """Pipeline stages of a spatial plan; nested spatial plans with equal chunks flatten."""
    out: list[Plan] = []
    for side in (plan.left, plan.right):
        if isinstance(side, Spatial) and side.chunks == plan.chunks:
            out.extend(spatial_stages(side))
        else:
            out.append(side)
    return out


def first_stage(plan: Plan) -> Stage:
    """The graph stage where data enters ``plan``."""
    while isinstance(plan, (Temporal, Spatial)):
        plan = plan.left
    return plan.stage


def assign_devices(plan: Plan, start: int = 0) -> dict[str, tuple[int, int]]:
    """Worker group -> (first, last) global device id, contiguous ranges from ``start``."""
    if isinstance(plan, Leaf):
        return {plan.name: (start, start + plan.devices - 1)}
    if isinstance(plan, Cycle):
        out, lo = {}, start
        for member, d in zip(plan.stage.members, plan.member_devices()):
            out[member] = (lo, lo + d - 1)
            lo += d if plan.split else 0
        return out
    if isinstance(plan, Temporal):
        return {**assign_devices(plan.left, start), **assign_devices(plan.right, start)}
    return {
        **assign_devices(plan.left, start),
        **assign_devices(plan.right, start + plan.left.devices),
    }


def plan_mode(plan: Plan) -> str:
    """``temporal`` (every group on the same devices), ``spatial`` (pairwise disjoint) or
    ``hybrid``; a single group is ``temporal``."""
    ranges = list(assign_devices(plan).values())
    if len(set(ranges)) == 1:
        return "temporal"
    disjoint = all(
        a[1] < b[0] or b[1] < a[0] for i, a in enumerate(ranges) for b in ranges[i + 1 :]
    )
    return "spatial" if disjoint else "hybrid"


def _ceil(x: float) -> int:
    return int(math.ceil(x - 1e-9))


def _mix(items: float, fn) -> float:
    """Mean of ``fn`` over the integer shares of a fractional item count: a chunk of ``x``
    items is ``floor(x)`` or ``ceil(x)`` items in the proportion that averages to ``x``."""
    lo = int(math.floor(items + 1e-9))
    p = items - lo
    if p < 1e-9:
        return fn(lo)
    return (1 - p) * fn(lo) + p * fn(lo + 1)


def _zip(a: Segments, b: Segments, op) -> Segments:
    """Combine two equally long segment lists device by device."""
    out: list[tuple[int, float]] = []
    ia = ib = 0
    ra, rb = a[0][0], b[0][0]
    while ia < len(a):
        n = min(ra, rb)
        v = op(a[ia][1], b[ib][1])
        if out and out[-1][1] == v:
            out[-1] = (out[-1][0] + n, v)
        else:
            out.append((n, v))
        ra, rb = ra - n, rb - n
        if ra == 0:
            ia += 1
            ra = a[ia][0] if ia < len(a) else 0
        if rb == 0:
            ib += 1
            rb = b[ib][0] if ib < len(b) else 0
    return tuple(out)


class CostModel:
    """Predicted time and memory of plans under one :class:`WorkflowProfile`.

    Args:
        profile: Component profiles and hardware facts.

    Results are memoised per (plan, fraction); the model is cheap to keep for a whole search.
    """

    def __init__(self, profile: WorkflowProfile):
        self.profile = profile
        self._time: dict[tuple[Plan, float], float] = {}
        self._calls: dict[tuple, float] = {}
        self._memory: dict[Plan, Segments] = {}

    # ---------------------------------------------------------------------------- time
    def iteration_time(self, plan: Plan) -> float:
        """Predicted seconds per training iteration (root pass plus one weight sync)."""
        return self.time(plan, 1.0) + self.profile.weight_sync_s

    def time(self, plan: Plan, frac: float = 1.0) -> float:
        """Seconds for ``plan`` to process ``frac`` of one iteration's data."""
        key = (plan, frac)
        hit = self._time.get(key)
        if hit is None:
            hit = self._time[key] = self._compute(plan, frac)
        return hit

    def _compute(self, plan: Plan, frac: float) -> float:
        if isinstance(plan, Leaf):
            per_round = _mix(
                plan.stage.items * frac,
                lambda n: self.call_time(plan.name, n, plan.devices, plan.batch),
            )
            return plan.stage.rounds * (per_round + self.profile[plan.name].loop_time(plan.devices))
        if isinstance(plan, Cycle):
            return self._cycle_time(plan, frac)
        if isinstance(plan, Temporal):
            t = self.time(plan.left, frac) + self.time(plan.right, frac)
            t += self.handoff_time(plan.right, frac, apart=False, devices=plan.devices)
            return t + (self.swap_time(plan) if plan.offload else 0.0)
        stages = spatial_stages(plan)
        sub = frac / plan.chunks
        c = [self.time(s, sub) for s in stages]
        for i, s in enumerate(stages[1:], 1):
            c[i] += self.handoff_time(s, sub, apart=True, devices=plan.devices)
        steady = max(c)
        cores = self.profile.cpu_cores
        if cores > 0 and plan.chunks > 1:
            use = [min(self.plan_demand(s), cores) / cores for s in stages]
            steady = max(steady, sum(ci * u for ci, u in zip(c, use)))
        return sum(c) + (plan.chunks - 1) * steady

    def plan_demand(self, plan: Plan) -> float:
        """Largest CPU demand (busy threads) of one worker group of ``plan`` on its devices."""
        ranges = assign_devices(plan)
        return max(self.profile[n].demand(hi - lo + 1) for n, (lo, hi) in ranges.items())

    def handoff_time(self, plan: Plan, frac: float, apart: bool, devices: int) -> float:
        """Seconds of the channel message carrying ``frac`` of the data entering ``plan`` from
        earlier stages (e.g. the trajectories the actor trains on)."""
        st = first_stage(plan)
        nbytes = st.in_bytes * frac
        return self.profile.message_s(nbytes, apart, devices, st.in_tensors) if nbytes > 0 else 0.0

    def call_time(self, name: str, items: float, devices: int, batch: int) -> float:
        """Seconds for ``devices`` data-parallel devices to process ``items`` in calls of at
        most ``batch`` items per device (one round)."""
        per = _ceil(items / devices)
        key = (name, per, devices, batch)
        hit = self._calls.get(key)
        if hit is None:
            prof = self.profile[name]
            full, rest = divmod(max(per, 0), batch)
            hit = (full * prof.time(batch) + prof.time(rest)) * prof.scale(devices)
            self._calls[key] = hit
        return hit

    def member_times(self, plan: Cycle, micro_batch: int,
                     concurrent: bool | None = None) -> list[float]:
        """Seconds each cycle member needs for one micro-batch of ``micro_batch`` envs
        (incl. the channel message bringing its ring input: the observations for the rollout,
        the action chunks for the env; the real loop's ``loop_s``; and, when the members
        alternate on shared CPU cores, ``min(ring_s, call time)``). ``concurrent`` says whether
        the members compute at the same time (default: a split ring of several micro-batches)."""
        out = []
        ring = plan.stage.ring_bytes
        tensors = plan.stage.ring_tensors or (1,) * len(ring)
        if concurrent is None:
            concurrent = plan.split and min(plan.micro_batches, plan.stage.items) > 1
        alternate = self.profile.cpu_cores > 0 and not concurrent
        for i, (member, d) in enumerate(zip(plan.stage.members, plan.member_devices())):
            prof = self.profile[member]
            t = self.call_time(member, micro_batch, d, max(1, _ceil(micro_batch / d)))
            if alternate:
                t += min(prof.ring_s, t)
            t += prof.loop_s
            t += self.profile.message_s(ring[i - 1] * micro_batch, plan.split, plan.devices,
                                        tensors[i - 1])
            out.append(t)
        return out


    def _cycle_time(self, plan: Cycle, frac: float) -> float:
        return _mix(plan.stage.items * frac, lambda n: self._cycle_items(plan, n))

    def _cycle_items(self, plan: Cycle, items: int) -> float:
        """Ring time for an integer number of envs: ``r`` micro-batches of ``q + 1`` and
        ``m - r`` of ``q`` (the simulator's split), each member's busy time per round summed
        over them."""
        T, m = plan.stage.rounds, min(plan.micro_batches, max(items, 1))
        q, r = divmod(items, m)
        par = plan.split and m > 1
        big = self.member_times(plan, q + 1 if r else q, par)
        small = self.member_times(plan, q, par) if q else [0.0] * len(big)
        busy = [r * b + (m - r) * s for b, s in zip(big, small)]
        if not plan.split:
            return T * sum(busy)
        if m == 1:
            return T * sum(big)
        i = max(range(len(busy)), key=busy.__getitem__)
        steady = busy[i]
        cores = self.profile.cpu_cores
        if cores > 0:  # the members share the node's cores: core-seconds bound the pipeline
            use = [min(self.profile[mb].demand(d), cores) / cores
                   for mb, d in zip(plan.stage.members, plan.member_devices())]
            steady = max(steady, sum(b * u for b, u in zip(busy, use)))
        return max(T * steady + sum(big) - big[i], T * sum(big))

    def swap_time(self, plan: Plan) -> float:
        """Offload + onload seconds of every component of ``plan`` (one switch each way)."""
        return sum(
            self.profile[c].offload_s + self.profile[c].onload_s for c in components_of(plan)
        )

    # ---------------------------------------------------------------------------- memory
    def memory(self, plan: Plan) -> Segments:
        """Peak bytes per device of ``plan``, as runs in device order."""
        hit = self._memory.get(plan)
        if hit is None:
            hit = self._memory[plan] = self._compute_memory(plan)
        return hit

    def _compute_memory(self, plan: Plan) -> Segments:
        if isinstance(plan, Leaf):
            prof = self.profile[plan.name]
            hosted = _ceil(plan.stage.items / plan.devices)
            return ((plan.devices, prof.memory(min(plan.batch, hosted), plan.devices, hosted)),)
        if isinstance(plan, Cycle):
            mb = plan.stage.items / plan.micro_batches
            per = [
                (d, self.profile[m].memory(_ceil(mb / d), d, _ceil(plan.stage.items / d)))
                for m, d in zip(plan.stage.members, plan.member_devices())
                if d > 0
            ]
            if plan.split:
                return tuple(per)
            return ((plan.devices, sum(v for _, v in per)),)
        if isinstance(plan, Temporal):
            op = max if plan.offload else (lambda x, y: x + y)
            return _zip(self.memory(plan.left), self.memory(plan.right), op)
        return self.memory(plan.left) + self.memory(plan.right)

    def peak_memory(self, plan: Plan) -> float:
        """Largest per-device peak of ``plan`` in bytes."""
        return max(v for _, v in self.memory(plan))

    def infeasible_reason(self, plan: Plan) -> str | None:
        """None when ``plan`` fits in device memory, else a sentence naming the overflow."""
        limit = self.profile.device_memory_bytes
        peak = self.peak_memory(plan)
        if peak <= limit:
            return None
        ranges = assign_devices(plan)
        return (
            f"needs {peak / GiB:.2f} GiB on a device > {limit / GiB:.2f} GiB available "
            f"({describe(plan, ranges)}); use more devices, smaller micro-batches or offload"
        )


def _fmt_range(lo: int, hi: int) -> str:
    return str(lo) if lo == hi else f"{lo}-{hi}"


def describe(plan: Plan, ranges: dict[str, tuple[int, int]] | None = None) -> str:
    """One line: groups with device ranges, e.g. ``env@0-3 rollout@4-7 actor@0-7``."""
    ranges = ranges or assign_devices(plan)
    return " ".join(f"{n}@{_fmt_range(*ranges[n])}" for n in components_of(plan))
