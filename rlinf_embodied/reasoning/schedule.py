"""The reasoning workflow for the scheduler: graph, analytic profile, profiling, plan.

The graph is a chain ``rollout -> reward -> actor`` (plus the actor -> rollout weight sync):
the rollout generates ``P * G`` responses per step, the reward worker verifies them, the actor
trains on them ``update_epochs`` times (RLinf paper section 2.1, the reasoning workflow). Items
are responses. ``placement: auto`` profiles the three groups alone on device 0 (rollout
``profile_generate``, reward ``profile_score``, actor ``profile_train``) and plans; the reward
group lands in the placement's ``env`` slot (see :mod:`rlinf_embodied.reasoning.launch`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rlinf_embodied.scheduler.graph import Edge, Node, WorkflowGraph
from rlinf_embodied.scheduler.planner import (PlannerOptions, PlanResult, granularity, report_text,
                                              search)
from rlinf_embodied.scheduler.profiles import GiB, WorkflowProfile, affine_profile

__all__ = ["reasoning_graph", "reasoning_analytic_profile", "reasoning_profile_for_config",
           "plan_reasoning_config", "reasoning_plan_for_placement", "auto_plan_reasoning"]


def reasoning_graph(cfg: Any) -> WorkflowGraph:
    """Graph of one GRPO step of a ``ReasoningJobConfig`` (items = responses)."""
    n = cfg.rollout.prompts_per_step * cfg.algorithm.group_size
    seq_bytes = 8.0 * (64 + cfg.rollout.max_new_tokens)  # token ids + log-probs, 64-token prompt guess
    return WorkflowGraph(
        nodes=(Node("rollout", n), Node("reward", n), Node("actor", n * cfg.trainer.update_epochs)),
        edges=(Edge("rollout", "reward", seq_bytes), Edge("reward", "actor", seq_bytes),
               Edge("actor", "rollout", 0.0, kind="weights")),
    )


def _num_params(cfg: Any) -> float:
    """Parameter count of the model (from its config.json; tiny model: ~0.5 M)."""
    if cfg.model.path:
        import json

        c = json.loads((Path(cfg.model.path) / "config.json").read_text())
        h, L, v = c.get("hidden_size", 896), c.get("num_hidden_layers", 24), c.get("vocab_size", 151936)
        return 12.0 * L * h * h + v * h
    return 0.5e6


def reasoning_analytic_profile(cfg: Any) -> WorkflowProfile:
    """Documented, unmeasured per-response costs, scaled by parameter count P (order-of-
    magnitude guesses for an 80 GiB accelerator, NOT measurements): generation 2 P flops per
    token at 30 TFLOP/s effective decode batch efficiency, training 6 P flops per token at
    100 TFLOP/s, verification 1 ms per response on a CPU; weights 2 bytes per parameter for the
    rollout, 16 for the actor (fp32 master + Adam), sharded."""
    P, R = _num_params(cfg), cfg.rollout.max_new_tokens
    tok = 64 + R
    gen = affine_profile("rollout", 0.05, 2 * P * R / 30e12, 2 * P, 2 * P * tok / 1e3,
                         onload_s=2 * P / 10e9, offload_s=2 * P / 10e9)
    rew = affine_profile("reward", 1e-3, 1e-3, 0.0, 0.0)
    act = affine_profile("actor", 0.05, 6 * P * tok / 100e12, 16 * P, 4 * P * tok / 1e3,
                         shard_static=True, onload_s=16 * P / 10e9, offload_s=16 * P / 10e9,
                         dp_efficiency=0.97)
    return WorkflowProfile(
        components={"rollout": gen, "reward": rew, "actor": act}, device_memory_bytes=80 * GiB,
        weight_sync_s=2 * P / 10e9 + 0.01, link_bandwidth_Bps=25e9, link_latency_s=1e-4,
        hardware="analytic 80 GiB accelerator",
        source=f"analytic default (reasoning, {P / 1e6:.1f} M parameters; not measured)")


def _profile_key(cfg: Any) -> str:
    from rlinf_embodied.config import as_dict
    from rlinf_embodied.scheduler.profiler import cache_key

    d = as_dict(cfg)
    return cache_key({k: d[k] for k in ("model", "rollout", "task")} | {"workflow": "reasoning"})


def reasoning_profile_for_config(cfg: Any, run_dir: str | Path | None) -> WorkflowProfile:
    """The cached measured profile of this config and hardware, else the analytic default."""
    from rlinf_embodied.scheduler.profiler import load_profile

    if run_dir is not None:
        cached = load_profile(run_dir, _profile_key(cfg))
        if cached is not None:
            return cached
    return reasoning_analytic_profile(cfg)


def plan_reasoning_config(cfg: Any, devices: int, profile: WorkflowProfile,
                          options: PlannerOptions = PlannerOptions()) -> PlanResult:
    """Search plans of the reasoning graph on ``devices`` devices."""
    return search(reasoning_graph(cfg), profile, devices, options)


def reasoning_plan_for_placement(cfg: Any, placement: Any, num_devices: int):
    """The plan tree the runtime executes for a fixed placement of a reasoning job.

    Rollout, reward (the placement's ``env`` slot) and actor are leaves, each data-parallel
    over its ranks with ``ceil(P * G / ranks)`` responses per call. Consecutive groups whose
    devices overlap run one after the other on the same devices (``Temporal``, offloaded when
    the placement context-switches), others side by side (``Spatial``, one chunk: the reward
    and the actor start on a step's responses once they are generated; elastic pipelining of
    uneven lengths is not modelled).

    Args:
        cfg: a ``ReasoningJobConfig``.
        placement: a runtime ``PlacementPlan`` (groups ``rollout``, ``env``, ``actor``).
        num_devices: devices of the cluster.

    Returns:
        A :data:`~rlinf_embodied.scheduler.cost_model.Plan` for the cost model.
    """
    import math

    from rlinf_embodied.scheduler.cost_model import Leaf, Spatial, Temporal

    stages = dict(zip(("rollout", "reward", "actor"), reasoning_graph(cfg).stages()))
    slot = {"rollout": "rollout", "reward": "env", "actor": "actor"}
    ids = {g: set(placement.device_ids(slot[g], num_devices)) for g in stages}
    leaves = {}
    for g, st in stages.items():
        ranks = len(ids[g]) * placement.group(slot[g]).procs_per_device
        leaves[g] = Leaf(st, len(ids[g]), math.ceil(st.items / ranks))
    plan, used = leaves["rollout"], set(ids["rollout"])
    for g in ("reward", "actor"):
        if used & ids[g]:
            plan = Temporal(plan, leaves[g], bool(placement.context_switch))
        else:
            plan = Spatial(plan, leaves[g], 1)
        used |= ids[g]
    return plan


def _to_runtime_slots(placement: dict) -> dict:
    groups = dict(placement["groups"])
    groups["env"] = groups.pop("reward")
    return {**placement, "groups": groups}


def auto_plan_reasoning(cfg: Any, cluster: Any, run_dir: str | Path, run_id: str,
                        launch: Any) -> dict:
    """Profile rollout / reward / actor alone on device 0 (unless cached), plan, and return the
    placement dict for :class:`~rlinf_embodied.runtime.PlacementPlan` (reward in ``env``).

    ``launch(cfg, run_dir, run_id, plan=PlacementPlan)`` starts the workflow's groups
    (:func:`~rlinf_embodied.reasoning.launch.launch_reasoning_groups`; passed in so that this
    module and the launcher do not import each other)."""
    import dataclasses

    from rlinf_embodied.runtime import PlacementPlan
    from rlinf_embodied.scheduler.auto import PROFILING_PLACEMENT, default_device_memory
    from rlinf_embodied.scheduler.profiler import WorkerGroupComponent, profile_workflow, save_profile

    devices = int(cluster.num_devices)
    profile = reasoning_profile_for_config(cfg, run_dir)
    if profile.source.startswith("analytic"):
        print("placement=auto: profiling rollout, reward and actor on device 0 ...")
        probe = dataclasses.replace(cfg, placement="<profiling>")
        g = launch(probe, Path(run_dir), run_id + "-profile",
                   plan=PlacementPlan.from_dict(PROFILING_PLACEMENT))
        try:
            n = cfg.rollout.prompts_per_step * cfg.algorithm.group_size
            sizes = sorted({max(1, n // 4), n})
            versions = iter(range(1, 1 << 30))
            profile = profile_workflow(
                [WorkerGroupComponent("rollout", g.rollout, "profile_generate", include_dispatch=True),
                 WorkerGroupComponent("reward", g.reward, "profile_score", include_dispatch=True),
                 WorkerGroupComponent("actor", g.actor, "profile_train")],
                {"rollout": sizes, "reward": sizes, "actor": sizes}, default_device_memory(),
                weight_sync=lambda: g.sync.push(next(versions)), repeats=1)
            save_profile(run_dir, _profile_key(cfg), profile)
        finally:
            g.shutdown(keep_cluster=True)
    result = plan_reasoning_config(cfg, devices, profile)
    print(report_text(result, [f"Reasoning plan ({profile.source})"]))
    planned = granularity(result.best.plan)["micro_batch"].get("actor")
    if planned is not None and planned != cfg.trainer.micro_batch_size:
        # the reasoning trainer's micro-batch is always set (no null "take the plan's")
        print(f"placement=auto: keeping trainer.micro_batch_size={cfg.trainer.micro_batch_size} "
              f"(the plan's: {planned}; set trainer.micro_batch_size={planned} to run the plan's).")
    return _to_runtime_slots(result.placement())
