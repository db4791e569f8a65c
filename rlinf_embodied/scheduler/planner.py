"""Recursive search for the fastest feasible execution plan (paper section 3.4).

For the stages ``i..j`` of the collapsed graph on ``d`` devices the planner considers

* one stage: a data-parallel :class:`Leaf` (the fastest micro-batch size that fits), or for a
  cycle a shared :class:`Cycle` and an evenly split one, for each micro-batch count;
* every cut ``c`` of ``i..j`` into ``i..c`` and ``c+1..j``: **temporal** - both sides on all
  ``d`` devices one after the other (co-resident when both fit, else with offload), or
  **spatial** - ``d_left + d_right = d`` for every split, for every chunk count.

Sub-problems ``(i, j, d)`` are memoised and keep their best plan per mode (temporal, spatial,
hybrid, single group), so the best plan of each mode is reported next to the winner. A plan whose
per-device memory exceeds the device is rejected and the reason is kept. The search is
``O(stages^3 * devices * chunk options)`` up to ``exhaustive_devices`` (128) devices per cut
and coarse-to-fine beyond, so three stages on 1024 devices take well under a second.
Sub-plans are chosen by their own time on the whole iteration, a heuristic for the pipelined
case (the paper's policy is the same recursive comparison).
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from rlinf_embodied.scheduler.cost_model import (
    CostModel,
    Cycle,
    Leaf,
    Plan,
    Spatial,
    Temporal,
    assign_devices,
    components_of,
    describe,
    plan_mode,
)
from rlinf_embodied.scheduler.graph import Stage, WorkflowGraph
from rlinf_embodied.scheduler.profiles import GiB, WorkflowProfile

__all__ = [
    "Candidate",
    "PlanResult",
    "PlannerOptions",
    "granularity",
    "placement_dict",
    "search",
]

MODES = ("temporal", "spatial", "hybrid")


@dataclass(frozen=True)
class PlannerOptions:
    """Knobs of the search.

    Attributes:
        micro_batch_options: Micro-batch counts tried for a cycle (``trainer.pipeline_stages``).
        chunk_options: Chunk counts tried for a spatial pipeline.
        exhaustive_devices: Spatial cuts of up to this many devices try every split; larger
            ones search coarse to fine (see :func:`_split_candidates`).
    """

    micro_batch_options: tuple[int, ...] = (1, 2, 4, 8)
    chunk_options: tuple[int, ...] = (1, 2, 4, 8)
    exhaustive_devices: int = 128


@dataclass(frozen=True)
class Candidate:
    """A feasible plan and its prediction.

    Attributes:
        plan: The plan tree.
        time_s: Predicted seconds per iteration.
        mode: ``temporal``, ``spatial`` or ``hybrid`` (of the whole plan).
        peak_bytes: Largest per-device memory of the plan.
    """

    plan: Plan
    time_s: float
    mode: str
    peak_bytes: float


@dataclass
class PlanResult:
    """The search outcome.

    Attributes:
        devices: Devices planned for.
        best: The fastest feasible plan.
        by_mode: Fastest feasible plan of each mode found.
        alternatives: Root candidates sorted by time (best first, up to 8).
        rejected: Mode -> why no feasible plan of that mode exists (modes with none).
        search_s: Seconds the search took.
        profile_source: ``WorkflowProfile.source`` of the profile used.
        notes: Sentences for the report (e.g. that the plan leaves devices idle).
    """

    devices: int
    best: Candidate
    by_mode: dict[str, Candidate]
    alternatives: list[Candidate]
    rejected: dict[str, str]
    search_s: float
    profile_source: str
    notes: list[str] = field(default_factory=list)

    def placement(self) -> dict:
        """The chosen plan in the runtime's placement YAML shape."""
        return placement_dict(self.best.plan)

    def runner_ups(self, n: int = 4) -> list[Candidate]:
        """Best plan of each other mode, then the next alternatives, up to ``n``; a plan
        described like one already listed (e.g. another nesting of the same temporal chain)
        is skipped."""
        out = [c for m, c in sorted(self.by_mode.items()) if c is not self.best]
        out.sort(key=lambda c: c.time_s)
        shown = {describe(c.plan) for c in [self.best, *out]}
        for c in self.alternatives[1:]:
            if len(out) >= n:
                break
            if describe(c.plan) not in shown:
                shown.add(describe(c.plan))
                out.append(c)
        return sorted(out[:n], key=lambda c: (c.time_s, describe(c.plan)))


def placement_dict(plan: Plan) -> dict:
    """``{context_switch, offload, groups: {name: {devices: "lo-hi"}}}`` for ``plan``.

    ``context_switch`` is true when two groups share a device (temporal or hybrid), so the
    runtime must serialise them with its device lock (section 3.3); ``offload`` is true when
    the plan needs their state moved off the devices at each switch (it does not fit at once).
    """
    ranges = assign_devices(plan)
    groups = {
        name: {"devices": str(lo) if lo == hi else f"{lo}-{hi}"}
        for name, (lo, hi) in ((n, ranges[n]) for n in components_of(plan))
    }
    return {"context_switch": plan_mode(plan) != "spatial", "offload": _offloads(plan), "groups": groups}


def _offloads(plan: Plan) -> bool:
    """Whether any temporal node of ``plan`` moves state off the devices at its switches."""
    if isinstance(plan, Temporal):
        return plan.offload or _offloads(plan.left) or _offloads(plan.right)
    if isinstance(plan, Spatial):
        return _offloads(plan.left) or _offloads(plan.right)
    return False


def granularity(plan: Plan) -> dict:
    """Micro-batch granularity of ``plan``: cycle micro-batches (``pipeline_stages``), spatial
    chunks, and each group's micro-batch size per device call."""
    out: dict = {"micro_batch": {}}
    stack = [plan]
    while stack:
        p = stack.pop()
        if isinstance(p, Leaf):
            out["micro_batch"][p.name] = p.batch
        elif isinstance(p, Cycle):
            out["pipeline_stages"] = p.micro_batches
            out["cycle_split"] = p.split
        else:
            if isinstance(p, Spatial):
                out["chunks"] = max(out.get("chunks", 1), p.chunks)
            stack += [p.right, p.left]
    out.setdefault("chunks", 1)
    return out


# sub-plan modes: "single" (one group) composes like both temporal and spatial
def _compose_mode(kind: str, a: str, b: str) -> str:
    ok = {kind, "single"}
    return kind if a in ok and b in ok else "hybrid"


class _Search:
    def __init__(self, graph: WorkflowGraph, profile: WorkflowProfile, options: PlannerOptions):
        self.stages: tuple[Stage, ...] = graph.stages()
        self.cost = CostModel(profile)
        self.opts = options
        self.limit = profile.device_memory_bytes
        self.memo: dict[tuple[int, int, int], tuple[dict[str, tuple[float, Plan]], dict[str, str]]] = {}

    def fits(self, plan: Plan) -> bool:
        return self.cost.peak_memory(plan) <= self.limit

    def _offer(self, best: dict[str, tuple[float, Plan]], mode: str, plan: Plan) -> None:
        t = self.cost.time(plan)
        if mode not in best or t < best[mode][0]:
            best[mode] = (t, plan)

    def solve(self, i: int, j: int, d: int, collect: list | None = None):
        """Best plan per mode for stages i..j on d devices, and reasons for missing modes."""
        key = (i, j, d)
        if collect is None and key in self.memo:
            return self.memo[key]
        best: dict[str, tuple[float, Plan]] = {}
        why: dict[str, str] = {}
        if i == j:
            self._single(self.stages[i], d, best, why)
        else:
            for c in range(i, j):
                self._temporal(i, c, j, d, best, why, collect)
                self._spatial(i, c, j, d, best, why, collect)
        result = (best, {m: r for m, r in why.items() if m not in best})
        if collect is None:
            self.memo[key] = result
        return result

    def _single(self, st: Stage, d: int, best, why) -> None:
        if not st.is_cycle:
            reason = _uneven(st, (d,), 1)
            if reason:
                why.setdefault("single", reason)
                return
            n = -(-st.items // d)
            sizes = {b for b in self.cost.profile[st.members[0]].batch_sizes if b < n} | {n}
            for b in sorted(sizes, reverse=True):  # on equal time keep the larger batch
                self._try(Leaf(st, d, b), "single", best, why)
            return
        for m in self.opts.micro_batch_options:
            if m > st.items:
                continue
            self._try(Cycle(st, d, False, m), "temporal", best, why)
            if d >= len(st.members):
                self._try(Cycle(st, d, True, m), "spatial", best, why)
            else:
                why.setdefault(
                    "spatial",
                    f"splitting {st.label} needs {len(st.members)} devices and that stage "
                    f"gets {d}",
                )

    def _try(self, plan: Plan, mode: str, best, why) -> None:
        reason = None
        if isinstance(plan, Cycle):
            reason = _uneven(plan.stage, plan.member_devices(), plan.micro_batches)
        reason = reason or self.cost.infeasible_reason(plan)
        if reason is None:
            self._offer(best, mode, plan)
        else:
            why.setdefault(mode, reason)

    def _temporal(self, i, c, j, d, best, why, collect) -> None:
        lb, lwhy = self.solve(i, c, d)
        rb, rwhy = self.solve(c + 1, j, d)
        for lm, (_, lp) in lb.items():
            for rm, (_, rp) in rb.items():
                mode = _compose_mode("temporal", lm, rm)
                plan = Temporal(lp, rp, offload=False)
                if not self.fits(plan):
                    plan = Temporal(lp, rp, offload=True)
                self._offer(best, mode, plan)
                if collect is not None:
                    collect.append((mode, plan))
        for m, r in list(lwhy.items()) + list(rwhy.items()):
            why.setdefault("temporal" if m in ("temporal", "single") else "hybrid", r)
        if not lb or not rb:
            why.setdefault("temporal", next(iter({**lwhy, **rwhy}.values()), "no feasible sub-plan"))

    def _spatial(self, i, c, j, d, best, why, collect) -> None:
        if d < 2:
            why.setdefault("spatial", f"a spatial plan needs at least 2 devices (got {d})")
            return
        items = min(s.items for s in self.stages[i : j + 1])

        def split(dl: int) -> float:
            """Offer every plan with ``dl`` devices on the left; return the fastest time."""
            lb, lwhy = self.solve(i, c, dl)
            rb, rwhy = self.solve(c + 1, j, d - dl)
            if not lb or not rb:
                why.setdefault("spatial", next(iter({**lwhy, **rwhy}.values()), "infeasible"))
                return float("inf")
            fastest = float("inf")
            for k in (k for k in self.opts.chunk_options if k <= items):
                for lm, (_, lp) in lb.items():
                    for rm, (_, rp) in rb.items():
                        plan = Spatial(lp, rp, k)
                        mode = _compose_mode("spatial", lm, rm)
                        self._offer(best, mode, plan)
                        fastest = min(fastest, self.cost.time(plan))
                        if collect is not None:
                            collect.append((mode, plan))
            return fastest

        for dl in _split_candidates(d, self.opts.exhaustive_devices, split):
            split(dl)


_UNEVEN = "do not split evenly"
"""Words of every :func:`_uneven` reason (the search tries fewer devices only after them)."""


def _uneven(st: Stage, devices: Sequence[int], micro_batches: int) -> str | None:
    """Why the runtime cannot run ``st`` with ``devices`` per member (one rank each) and
    ``micro_batches`` streams per rank: a member's :attr:`~.graph.Node.shards` that does not
    split evenly; None when every member's does."""
    for name, shards, d in zip(st.members, st.shards, devices):
        if shards is not None and shards % (d * micro_batches):
            streams = f"{d} rank(s) x {micro_batches} pipeline stage(s)" if st.is_cycle else f"{d} rank(s)"
            return (f"{name} on {d} device(s): its {shards} shards (env.num_envs / "
                    f"algorithm.group_size) {_UNEVEN} over {streams}")
    return None


def max_useful_devices(graph: WorkflowGraph) -> int:
    """The most devices a plan of ``graph`` can give work to: every stage on its own devices,
    each member on at most as many as it has shards (else items). Plans over more devices
    only leave the extra ones idle (or, with shards, cannot run at all)."""
    total = 0
    for st in graph.stages():
        total += sum(sh if sh is not None else st.items for sh in st.shards or (None,) * len(st.members))
    return max(1, total)


def _split_candidates(d: int, exhaustive: int, evaluate) -> list[int]:
    """Device counts for the left side of a spatial cut of ``d`` devices.

    Every split up to ``exhaustive`` devices; beyond, a coarse grid of about ``exhaustive``
    splits is evaluated first and the neighbourhoods of its two best points are then searched
    exhaustively (the iteration time is close to unimodal in the split, section 3.4).
    """
    if d - 1 <= exhaustive:
        return list(range(1, d))
    step = -(-(d - 1) // exhaustive)
    grid = list(range(1, d, step))
    scored = sorted(grid, key=lambda dl: (evaluate(dl), dl))[:2]
    near = set()
    for dl in scored:
        near.update(range(max(1, dl - step + 1), min(d, dl + step)))
    return sorted(near - set(grid))


def _candidate(cost: CostModel, plan: Plan) -> Candidate:
    return Candidate(plan, cost.iteration_time(plan), plan_mode(plan), cost.peak_memory(plan))


def search(
    graph: WorkflowGraph,
    profile: WorkflowProfile,
    devices: int,
    options: PlannerOptions = PlannerOptions(),
) -> PlanResult:
    """Find the fastest feasible plan of ``graph`` on ``devices`` devices.

    Args:
        graph: The workflow (see :func:`~rlinf_embodied.scheduler.graph.embodied_graph`).
        profile: Profiles of every node of ``graph``.
        devices: Number of devices (global ids ``0..devices-1``).
        options: Micro-batch and chunk counts to try.

    Returns:
        The :class:`PlanResult`.

    Raises:
        ValueError: if ``devices`` < 1, or when no plan fits in memory (the message gives the
            reason per mode and the fix).
        KeyError: if a node has no profile.
    """
    if devices < 1:
        raise ValueError(f"Plan for at least 1 device (got {devices}).")
    for st in graph.stages():
        for m in st.members:
            profile[m]  # raises a KeyError naming the missing profile
    start = time.perf_counter()
    s = _Search(graph, profile, options)
    last = len(s.stages) - 1
    # Plans use every device they are given; beyond what the job can give work to (or where
    # its envs do not split evenly over every device) fewer devices are planned, the rest idle.
    first_why = None
    for used in range(min(devices, max_useful_devices(graph)), 0, -1):
        roots: list = []
        best, why = s.solve(0, last, used, collect=roots if last > 0 else None)
        first_why = first_why or why
        if best or not any(_UNEVEN in r for r in why.values()):
            break  # found; or nothing failed for an uneven split, which fewer devices can fix
    if last == 0:
        roots = [(m, p) for m, (_, p) in best.items()]
    if not best:
        reasons = "; ".join(f"{m}: {r}" for m, r in sorted(first_why.items()))
        fix = (" Raise env.num_envs so that its shards split over the ranks." if any(
            _UNEVEN in r for r in first_why.values()) else "")
        raise ValueError(f"No execution plan fits on {devices} devices ({reasons}).{fix}")
    notes = []
    if used < devices:
        notes.append(f"the plan uses {used} of the {devices} devices (the job cannot give work "
                     f"to more: its envs split evenly over its env and actor ranks); the rest "
                     f"stay idle")
    # Rank root plans by time; ties broken by a canonical description for stable output.
    ranked = sorted(
        {p: s.cost.time(p) for m, p in roots if s.fits(p)}.items(), key=lambda kv: kv[1]
    )
    top: list[Plan] = [p for p, _ in ranked[:8]]
    seen_modes = set()
    for p, _ in ranked:  # plus the fastest of every mode
        mode = plan_mode(p)
        if mode not in seen_modes:
            seen_modes.add(mode)
            if p not in top:
                top.append(p)
        if len(seen_modes) == len(MODES):
            break
    cands = sorted(
        (_candidate(s.cost, p) for p in top), key=lambda c: (round(c.time_s, 12), describe(c.plan))
    )
    by_mode: dict[str, Candidate] = {}
    for c in cands:
        by_mode.setdefault(c.mode, c)
    rejected = {
        m: why.get(m, "not applicable to this graph (no stage can be split or shared)")
        for m in MODES
        if m not in by_mode
    }
    nodes = [n for st in s.stages for n in st.members]
    if "spatial" in rejected and 1 < len(nodes) and used < len(nodes):
        # a split that leaves two nodes on one device is temporal there (a hybrid plan): with
        # fewer devices than nodes that, not a sub-plan's reason, is why no plan is spatial
        rejected["spatial"] = (f"a spatial plan gives each of {', '.join(nodes)} its own "
                               f"devices: at least {len(nodes)} (got {used})")
    return PlanResult(
        devices=devices,
        best=cands[0],
        by_mode=by_mode,
        alternatives=cands,
        rejected=rejected,
        search_s=time.perf_counter() - start,
        profile_source=profile.source,
        notes=notes,
    )


# --------------------------------------------------------------------------------------------
# Report
# --------------------------------------------------------------------------------------------
def _plan_line(c: Candidate) -> str:
    g = granularity(c.plan)
    extra = [f"pipeline_stages={g['pipeline_stages']}"] if "pipeline_stages" in g else []
    extra += [f"chunks={g['chunks']}"] if g["chunks"] > 1 else []
    mb = ",".join(f"{k}={v}" for k, v in sorted(g["micro_batch"].items()))
    extra += [f"micro_batch[{mb}]"] if mb else []
    return f"{c.mode:<8} {c.time_s:10.4f} s  {describe(c.plan)}  {' '.join(extra)}".rstrip()


def report_text(result: PlanResult, header: Sequence[str] = ()) -> str:
    """Human-readable report: chosen plan, runner-ups, rejected modes, and why.

    Deterministic: the same result gives byte-identical text (no timings of the search).
    """
    b = result.best
    lines = list(header)
    lines.append(f"Profile: {result.profile_source}")
    lines.append(f"Devices: {result.devices}")
    lines.extend(f"Note: {n}" for n in result.notes)
    lines.append("")
    lines.append(f"Chosen: {_plan_line(b)}")
    place = result.placement()
    from rlinf_embodied.runtime.placement import PlacementPlan  # the name train prints for it

    name = PlacementPlan.from_dict(place).mode(result.devices)
    mb = granularity(b.plan)["micro_batch"].get("actor")
    resident = place["context_switch"] and not place["offload"]  # the shipped layouts offload
    lines.append(f"  mode as a config: placement={name} (its shipped layout"
                 + (", which offloads at each switch where this plan keeps state resident"
                    if resident else "") + ")"
                 + (f" with trainer.micro_batch_size={mb}" if mb else "")
                 + "; placement=auto plans and runs it" + (" as planned" if resident else ""))
    lines.append(f"  peak memory per device {b.peak_bytes / GiB:.3f} GiB")
    lines.append(f"  context_switch: {str(place['context_switch']).lower()}")
    if place["context_switch"]:
        lines.append(f"  offload: {str(place['offload']).lower()}")
    for name, g in place["groups"].items():
        lines.append(f"  {name}: devices {g['devices']}")
    lines.append("")
    lines.append("Runner-ups:")
    for c in result.runner_ups():
        slower = (c.time_s / b.time_s - 1.0) * 100.0
        lines.append(f"  {_plan_line(c)}  (+{slower:.1f}%)")
    for mode, reason in sorted(result.rejected.items()):
        lines.append(f"  {mode:<8} rejected: {reason}")
    lines.append("")
    lines.append("Why: " + _why(result))
    return "\n".join(lines) + "\n"


def _why(result: PlanResult) -> str:
    b = result.best
    parts = []
    for mode in MODES:
        if mode == b.mode:
            continue
        if mode in result.by_mode:
            c = result.by_mode[mode]
            parts.append(f"the best {mode} plan is {(c.time_s / b.time_s - 1) * 100:.1f}% slower")
        elif result.rejected.get(mode, "").startswith("not applicable"):
            parts.append(f"{mode} does not apply")
        elif mode in result.rejected:
            parts.append(f"no {mode} plan is runnable (rejected above)")
    # "runnable": every plan searched splits the job evenly (the Configured line of `plan`
    # may predict a faster placement that train refuses).
    return f"{b.mode} is the fastest runnable plan; " + ("; ".join(parts) or "no other mode applies") + "."


def report_json(result: PlanResult, extra: dict | None = None) -> str:
    """The report as canonical JSON (sorted keys; deterministic)."""

    def cand(c: Candidate) -> dict:
        return {
            "mode": c.mode,
            "predicted_iteration_s": round(c.time_s, 9),
            "peak_gib_per_device": round(c.peak_bytes / GiB, 6),
            "placement": placement_dict(c.plan),
            "granularity": granularity(c.plan),
        }

    out = {
        "devices": result.devices,
        "profile": result.profile_source,
        "chosen": cand(result.best),
        "runner_ups": [cand(c) for c in result.runner_ups()],
        "rejected": dict(sorted(result.rejected.items())),
        "why": _why(result),
        "notes": list(result.notes),
        **(extra or {}),
    }
    return json.dumps(out, sort_keys=True, indent=2)

