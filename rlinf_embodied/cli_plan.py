"""``rlinf-embodied plan CONFIG.yaml [--devices N] [--json]``: the text the command prints.

It sits beside the CLI, above the workflows: it reads a job (embodied or reasoning), asks that
workflow for its graph and plan tree, and the scheduler for the search and the report.
"""

from __future__ import annotations

from rlinf_embodied.scheduler.auto import (
    graph_from_config,
    plan_config,
    plan_for_placement,
    profile_for_config,
)
from rlinf_embodied.scheduler.cost_model import CostModel, Temporal, describe
from rlinf_embodied.scheduler.planner import granularity, report_json, report_text

__all__ = ["capacity", "plan_command", "reasoning_plan_command", "shared_cores_note"]


def _default_devices(cfg) -> int:
    try:
        import torch

        if torch.cuda.is_available():
            return torch.cuda.device_count()
    except ImportError:  # pragma: no cover
        pass
    return max(1, cfg.cluster.num_cpu_devices)


def shared_cores_note(devices: int) -> str | None:
    """A line for the text report when ``devices`` CPU devices (no CUDA device here) outnumber
    this machine's cores: the cost model runs every device at its own profiled speed, so plans
    that spread over more devices than cores predict a speed-up the cores cannot give."""
    import os

    try:
        import torch

        if torch.cuda.is_available():
            return None
    except ImportError:  # pragma: no cover
        pass
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    if devices <= cores:
        return None
    return (f"Note: {devices} CPU devices on a {cores}-core machine share its cores; the predictions "
            f"assume each device runs at its profiled speed, so those of plans over more than "
            f"{cores} devices are optimistic here (plan for --devices {cores}).")


def plan_command(
    config_path: str, devices: int | None, as_json: bool, overrides: list[str]
) -> str:
    """Plan a job and return the report to print.

    The profile is the one cached in the job's run directory for this config and hardware
    (written by ``train ... placement=auto`` or ``benchmarks/bench_scheduler.py``), else the
    documented analytic default profile; the report names which. Besides the best plan it
    predicts the job as configured (its ``placement`` YAML, ``pipeline_stages`` and actor
    micro-batch) when that placement fits the device count.

    Args:
        config_path: Job YAML.
        devices: Devices to plan for; None uses this machine's (CUDA devices, else
            ``cluster.num_cpu_devices``).
        as_json: Return canonical JSON instead of text.
        overrides: Dotted ``key=value`` overrides.

    Returns:
        The report; byte-identical for the same config, devices and profile.

    Raises:
        ConfigError: for an invalid config.
        ValueError: if ``devices`` < 1 or no plan fits in memory.
    """
    from rlinf_embodied.config import load_config
    from rlinf_embodied.reasoning.config import is_reasoning_job

    if is_reasoning_job(config_path):
        return reasoning_plan_command(config_path, devices, as_json, overrides)
    cfg = load_config(config_path, overrides)
    nodes, reserved = capacity(cfg)
    n = devices if devices is not None else (reserved or _default_devices(cfg))
    from rlinf_embodied.policies.size import parameter_count

    profile = profile_for_config(cfg, cfg.run.run_dir(), parameter_count(cfg.policy))
    result = plan_config(cfg, n, profile)
    g = graph_from_config(cfg)
    workload = {
        "num_envs": cfg.env.num_envs,
        "rollout_steps": cfg.trainer.rollout_steps,
        "actor_samples": g.node("actor").items * g.node("actor").rounds,
        "update_epochs": cfg.trainer.update_epochs,
    }
    configured = _configured(cfg, n, profile)
    if as_json:
        extra = {"config": str(config_path), "workload": workload, "configured": configured,
                 "nodes": nodes}
        return report_json(result, extra) + "\n"
    header = [
        f"Plan for {config_path}",
        f"Workload per iteration: N={workload['num_envs']} envs x T={workload['rollout_steps']} "
        f"steps, actor trains on {workload['num_envs'] * workload['rollout_steps']} samples x "
        f"{workload['update_epochs']} epochs",
    ]
    if configured is not None:
        header.append(
            f"Configured: placement={configured['placement']} {configured['predicted_iteration_s']:.4f} s "
            f"per iteration ({configured['plan']}, pipeline_stages={cfg.trainer.pipeline_stages}"
            + "".join(f", micro_batch[{k}={v}]" for k, v in sorted(configured["micro_batch"].items()))
            + (", offload at every switch)" if configured["offload"] else ")")
            + (f"; train refuses it here: {configured['refused']}" if configured["refused"] else "")
            + _over_memory(configured)
        )
    header += [line["text"] for line in nodes]
    note = shared_cores_note(n)
    if note:
        header.append(note)
    return report_text(result, header)


def capacity(cfg) -> tuple[list[dict], int | None]:
    """Which nodes are reserved (placed groups, device ids) and which preemptible (only
    elastic workers): with ``cfg.cluster.address`` the attached cluster's nodes
    (:class:`~rlinf_embodied.runtime.Cluster`), else this machine.

    Returns:
        ``([{"kind", "text", ...}], reserved devices or None without a cluster)``.
    """
    e = cfg.elastic
    res = e.preemptible_resource
    elastic = ([{"kind": "elastic", "text": (
        f"Elastic rollout: {e.reserved_workers} reserved worker(s) on the driver's node, "
        f"{e.preemptible_workers} preemptible on nodes advertising {res!r}"
        if res else f"Elastic rollout: {e.reserved_workers} reserved and {e.preemptible_workers} "
        f"preemptible worker(s), all on the driver's node (elastic.preemptible_resource is empty)")}]
        if e.enabled else [])
    if cfg.cluster.address is None:
        return [{"kind": "reserved", "text": "Nodes: this machine (reserved: every placed group "
                 "runs on it; pass cluster.address=... to list a cluster's nodes)"}] + elastic, None
    from rlinf_embodied.runtime import Cluster

    cluster = Cluster(cfg.cluster.address, num_cpu_devices=cfg.cluster.num_cpu_devices,
                      log_to_driver=False, preemptible_resource=res)
    try:
        lines = cluster.describe().splitlines()
        nodes = [{"kind": "cluster", "text": f"Nodes ({cfg.cluster.address}): " + lines[0].removeprefix("cluster: ")}]
        nodes += [{"kind": ln.split()[0], "text": "  " + ln.strip()} for ln in lines[1:]]
        return nodes + elastic, cluster.num_devices
    finally:
        cluster.shutdown()


def _over_memory(configured: dict) -> str:
    """The Configured line's note when the job's own plan exceeds device memory (so the search,
    which keeps only plans that fit, chose another, maybe slower one), else ''."""
    why = configured.get("over_memory")
    return f"; over the profile's device memory, so not searched: {why}" if why else ""


def _refusal(cfg, placement, devices: int) -> str | None:
    """Why ``train`` would refuse the embodied job's ``placement`` on ``devices`` devices (its
    envs do not split evenly over the env or actor ranks), or None."""
    from rlinf_embodied.config import ConfigError
    from rlinf_embodied.runners.setup import check_divisibility, group_ranks

    ranks = group_ranks(placement, devices)
    try:
        check_divisibility(cfg, ranks["env"], ranks["actor"])
    except ConfigError as e:
        return str(e)
    return None


def _configured(cfg, devices: int, profile, plan_fn=plan_for_placement,
                refusal=_refusal) -> dict | None:
    """Prediction of the job's own placement on ``devices`` devices (None for ``auto`` or a
    placement that does not fit); ``plan_fn(cfg, placement, devices)`` builds the workflow's
    plan tree (the reasoning workflow passes its own), ``refusal(cfg, placement, devices)``
    says why ``train`` would refuse it (``refused`` in the result; None: it runs)."""
    from rlinf_embodied.runtime.placement import PlacementError, PlacementPlan

    if cfg.placement == "auto":
        return None
    from rlinf_embodied.runners.setup import resolve_placement

    try:
        placement = PlacementPlan.from_yaml(resolve_placement(cfg.placement))
        placement.validate(devices)
    except PlacementError:
        return None
    plan = plan_fn(cfg, placement, devices)
    cost = CostModel(profile)
    return {
        "placement": cfg.placement,
        "plan": describe(plan),
        "micro_batch": granularity(plan)["micro_batch"],
        "offload": isinstance(plan, Temporal) and plan.offload,
        "predicted_iteration_s": round(cost.iteration_time(plan), 9),
        "refused": refusal(cfg, placement, devices) if refusal else None,
        # the planner searches only plans that fit: why a faster Configured line is not Chosen
        "over_memory": cost.infeasible_reason(plan),
    }


def reasoning_plan_command(config_path: str, devices: int | None, as_json: bool,
                           overrides: list[str]) -> str:
    """``rlinf-embodied plan`` for a reasoning job: the report to print."""
    from rlinf_embodied.config import load_config
    from rlinf_embodied.reasoning.config import ReasoningJobConfig
    from rlinf_embodied.reasoning.schedule import (
        plan_reasoning_config,
        reasoning_graph,
        reasoning_plan_for_placement,
        reasoning_profile_for_config,
    )

    cfg = load_config(config_path, overrides, schema=ReasoningJobConfig)
    n = devices if devices is not None else _default_devices(cfg)
    profile = reasoning_profile_for_config(cfg, cfg.run.run_dir())
    result = plan_reasoning_config(cfg, n, profile)
    g = reasoning_graph(cfg)
    workload = {"workflow": "reasoning", "responses": g.node("rollout").items,
                "max_new_tokens": cfg.rollout.max_new_tokens, "actor_samples": g.node("actor").items}
    configured = _configured(cfg, n, profile, reasoning_plan_for_placement, refusal=None)
    if as_json:
        return report_json(result, {"config": str(config_path), "workload": workload,
                                    "configured": configured}) + "\n"
    header = [f"Plan for {config_path}",
              f"Workload per step: {cfg.rollout.prompts_per_step} prompts x G="
              f"{cfg.algorithm.group_size} = {workload['responses']} responses of up to "
              f"{workload['max_new_tokens']} tokens (reward in the placement's env slot)"]
    if configured is not None:
        header.append(f"Configured: placement={configured['placement']} "
                      f"{configured['predicted_iteration_s']:.4f} s per step ({configured['plan']})"
                      + _over_memory(configured))
    note = shared_cores_note(n)
    if note:
        header.append(note)
    return report_text(result, header)
