"""From a job config to a plan: workflow graph, profile lookup, search, placement.

This is the API ``train ... placement=auto`` and ``plan`` use:

* :func:`graph_from_config` - the embodied workflow graph of a :class:`JobConfig`.
* :func:`profile_for_config` - the cached profile for (config, hardware) in the run directory,
  else the documented analytic default (:func:`~.profiles.analytic_default_profile`).
* :func:`plan_config` - search over plans for a device count.
* :func:`plan_for_placement` - the plan tree of a fixed placement (a ``configs/placement`` YAML),
  so that a configured run can be predicted and compared with its measurement.
* :func:`measure_profile` - profile a job's real workers (env, rollout, actor, weight sync) and
  its channel messages (:func:`~.profiler.profile_messages` at :func:`message_sizes`). The
  workflow hands it a :class:`GroupLauncher` that starts its worker groups: the scheduler never
  imports a runner, a worker role or a workflow (``runners.setup.EmbodiedLauncher`` is the
  embodied workflow's).
* :func:`auto_plan` - profile (when components are given), cache, plan; returns the placement
  dict in the runtime's YAML shape and a report.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

from rlinf_embodied.scheduler.cost_model import Cycle, Leaf, Plan, Spatial, Temporal
from rlinf_embodied.scheduler.graph import WorkflowGraph, embodied_graph
from rlinf_embodied.scheduler.planner import (
    PlannerOptions,
    PlanResult,
    granularity,
    report_json,
    report_text,
    search,
)
from rlinf_embodied.scheduler.profiler import (
    Component,
    cache_key,
    hardware_fingerprint,
    load_profile,
    profile_messages,
    profile_workflow,
    save_profile,
)
from rlinf_embodied.scheduler.profiles import WorkflowProfile, analytic_default_profile

__all__ = [
    "PROFILING_PLACEMENT",
    "GroupLauncher",
    "auto_plan",
    "default_device_memory",
    "cpu_cores",
    "default_batch_sizes",
    "graph_from_config",
    "measure_loop",
    "measure_profile",
    "message_sizes",
    "plan_config",
    "plan_for_placement",
    "profile_config_key",
    "profile_for_config",
    "with_cpu_terms",
]


PROFILING_PLACEMENT = {"context_switch": True, "groups": {
    g: {"devices": "0"} for g in ("env", "rollout", "actor")}}
"""Where ``placement=auto`` profiles the components: one rank each, taking turns on device 0
(a workflow whose roles have other names maps them onto these slots)."""


class GroupLauncher(Protocol):
    """How a workflow starts its worker groups for profiling (given to :func:`measure_profile`).

    The scheduler calls these and the worker methods ``profile_step`` / ``profile_act`` /
    ``profile_train``, ``space_spec``, ``profile_close``, ``serve``, ``rollout``, ``train`` by
    name; it never imports the roles.
    """

    def launch(self, cfg: Any, run_dir: Path, run_id: str, placement: dict) -> Any:
        """Start the env, rollout and actor groups of ``cfg`` placed by ``placement`` (a dict
        in the placement YAML's shape) on the running cluster; returns an object with ``env``,
        ``rollout``, ``actor`` worker groups, ``sync`` (``push(version)``) and
        ``shutdown(keep_cluster)``."""

    def actor_group(self, cfg: Any, cluster: Any, spec: dict, run_id: str, ranks: int,
                    spread: bool) -> tuple[Any, Any]:
        """Start ``ranks`` actor ranks (one per device when ``spread``, else all on device 0)
        with their process group set up; returns ``(group, cleanup)``, ``cleanup()`` stops
        the group and frees its channels."""


def _obs_bytes(env_cfg: Any) -> float:
    """Approximate bytes of one observation: images when rendered, else a small state."""
    if getattr(env_cfg, "obs_mode", "state") == "rgb":
        side = getattr(env_cfg, "sensor_size", None) or getattr(env_cfg, "image_size", 128)
        cams = 2 if getattr(env_cfg, "type", "") == "libero" else 1
        return float(cams * side * side * 3)
    return 4.0 * 64


def _obs_tensors(env_cfg: Any) -> int:
    """Tensors of one observation: the state, plus the camera images when rendered."""
    if getattr(env_cfg, "obs_mode", "state") == "rgb":
        return 3 if getattr(env_cfg, "type", "") == "libero" else 2
    return 1


def _message_tensors(cfg: Any) -> tuple[int, int, int]:
    """Tensors per (observation request, action-chunk reply, trajectory message): the reply
    holds actions, log-probs, values and the forward inputs (the observation's tensors); the
    trajectory holds actions, log-probs, values, rewards, termination, truncation, valid and
    success flags, group ids and the forward inputs."""
    obs = _obs_tensors(cfg.env)
    return obs, 3 + obs, 9 + obs


def _message_bytes(cfg: Any) -> tuple[float, float, float]:
    """Per-env bytes of (observation request, action-chunk reply, trajectory sample).

    The reply carries the actions (K x A float32, A = 8 assumed), their log-probs (as many), a
    value and the policy's forward inputs (the observation again); a training sample is the
    observation plus actions, log-probs and six scalars (reward, done flags, value, success).
    """
    obs = _obs_bytes(cfg.env)
    action = 4.0 * 8 * max(1, cfg.policy.action_chunk)
    return obs, obs + 2 * action + 4.0, obs + 2 * action + 24.0


def graph_from_config(cfg: Any) -> WorkflowGraph:
    """The embodied workflow graph of a job config (N, T, update epochs, data volumes).

    Args:
        cfg: A ``JobConfig`` (``env.num_envs``, ``trainer.rollout_steps``,
            ``trainer.update_epochs``, ``trainer.num_minibatches``, ``policy.action_chunk``).
    """
    obs, reply, sample = _message_bytes(cfg)
    obs_t, reply_t, sample_t = _message_tensors(cfg)
    return embodied_graph(
        num_envs=cfg.env.num_envs,
        rollout_steps=cfg.trainer.rollout_steps,
        update_epochs=cfg.trainer.update_epochs,
        num_minibatches=cfg.trainer.num_minibatches,
        obs_bytes=obs,
        action_bytes=reply,
        sample_bytes=sample,
        obs_tensors=obs_t,
        action_tensors=reply_t,
        sample_tensors=sample_t,
        shards=_shards(cfg),
    )


def _shards(cfg: Any) -> int | None:
    """What the runtime splits evenly over env and actor ranks: the GRPO groups of the job's
    envs (its envs without groups); None when the groups do not divide the envs (the job's
    own check refuses that config)."""
    g = max(1, int(getattr(getattr(cfg, "algorithm", None), "group_size", 1) or 1))
    n = int(cfg.env.num_envs)
    return n // g if n % g == 0 else None


def message_sizes(cfg: Any, micro_batch_options: Sequence[int] | None = None) -> list[float]:
    """Payload bytes of the messages the job sends, for :func:`~.profiler.profile_messages`.

    Observation requests and action-chunk replies of one stream of ``N / m`` envs for every
    micro-batch count ``m`` (default: those the planner tries), and the trajectory of all N envs
    x T steps.
    """
    obs, reply, sample = _message_bytes(cfg)
    n = cfg.env.num_envs
    out = {n * cfg.trainer.rollout_steps * sample}
    for m in micro_batch_options or PlannerOptions().micro_batch_options:
        per = max(1, n // m)
        out |= {per * obs, per * reply}
    return sorted(out)


def profile_config_key(cfg: Any, hardware: str | None = None) -> str:
    """Cache key of the profile: what changes per-call costs (env and policy sections)."""
    from rlinf_embodied.config import as_dict

    d = as_dict(cfg)
    relevant = {k: d[k] for k in ("env", "policy") if k in d}
    relevant["micro_batch_size"] = d.get("trainer", {}).get("micro_batch_size")
    return cache_key(relevant, hardware)


def profile_for_config(cfg: Any, run_dir: str | Path | None,
                       policy_params: float | None = None) -> WorkflowProfile:
    """The cached profile of this config on this hardware, else the analytic default (its VLA
    memory scaled to ``policy_params`` parameters when given: ``policies.size.parameter_count``).

    ``profile.source`` tells which one was used (``cached (...)`` or ``analytic default ...``).
    """
    if run_dir is not None:
        cached = load_profile(run_dir, profile_config_key(cfg))
        if cached is not None:
            return cached
    import torch

    return analytic_default_profile(cfg.env.type, cfg.policy.type,
                                    accelerator=torch.cuda.device_count() > 0,
                                    policy_params=policy_params,
                                    lora_rank=int(getattr(cfg.policy, "lora_rank", 0) or 0))


def plan_config(
    cfg: Any,
    devices: int,
    profile: WorkflowProfile,
    options: PlannerOptions = PlannerOptions(),
) -> PlanResult:
    """Search plans for ``cfg`` on ``devices`` devices under ``profile``."""
    return search(graph_from_config(cfg), profile, devices, options)


def plan_for_placement(cfg: Any, placement: Any, num_devices: int) -> Plan:
    """The plan tree that the runtime executes for a fixed placement.

    Env and rollout form the interaction cycle: shared (same devices, context switched) when
    their devices overlap, else split over their devices; ``trainer.pipeline_stages`` is the
    cycle's micro-batch count. Only as many devices as there are streams do cycle work (a
    stream is served by one rollout rank), so a split cycle counts ``min(devices, streams)``
    per member. The actor is data-parallel over its ranks with the micro-batch of
    ``trainer.micro_batch_size`` (else one minibatch per rank), after the cycle on shared
    devices (temporal; offloaded when the placement context-switches) or on its own devices
    (spatial, one chunk: it trains once the rollout is complete). Shared devices pay the
    offload/onload of every switch unless the placement says ``offload: false``.

    Args:
        cfg: The ``JobConfig``.
        placement: A runtime ``PlacementPlan``.
        num_devices: Devices of the cluster.
    """
    cycle, actor = graph_from_config(cfg).stages()
    ids = {g: placement.device_ids(g, num_devices) for g in ("env", "rollout", "actor")}
    ranks = {g: len(ids[g]) * placement.group(g).procs_per_device for g in ids}
    m = cfg.trainer.pipeline_stages
    streams = ranks["env"] * m
    split = not set(ids["env"]) & set(ids["rollout"])
    env_d = min(len(ids["env"]), streams)
    if split:
        cyc = Cycle(cycle, env_d + min(len(ids["rollout"]), streams), True, m)
    else:
        cyc = Cycle(cycle, env_d, False, m)
    t = cfg.trainer
    per_rank = cfg.env.num_envs * t.rollout_steps // ranks["actor"]
    batch = t.micro_batch_size or max(1, per_rank // max(1, t.num_minibatches))
    leaf = Leaf(actor, ranks["actor"], batch)
    if set(ids["actor"]) & (set(ids["env"]) | set(ids["rollout"])):
        return Temporal(cyc, leaf, bool(placement.context_switch and placement.offload))
    return Spatial(cyc, leaf, 1)


def measure_profile(cfg: Any, cluster: Any, run_dir: str | Path, launcher: GroupLauncher,
                    run_id: str = "profile",
                    repeats: int = 3, message_repeats: int = 10,
                    dp_ranks: int = 2, warmup: int = 3,
                    loop_iterations: int = 0, loop_warmup: int = 2) -> WorkflowProfile:
    """Profile the job's real workers alone and its channel messages; cache and return it.

    Launches the env, rollout and actor groups with one rank each on device 0 (taking turns),
    profiles ``profile_step`` / ``profile_act`` (timed inside the workers: the channel messages
    that carry their inputs are measured separately) and ``profile_train`` at
    :func:`default_batch_sizes` for one device, times the weight sync, then measures channel messages with
    :func:`~.profiler.profile_messages` at :func:`message_sizes`. With ``dp_ranks`` > 1 it also
    trains on ``dp_ranks`` actor ranks at once (devices 0.. when the cluster has that many, else
    that many processes on device 0: CPU device slots share the node's cores) and sets the
    actor's ``dp_efficiency`` from the measured slow-down, so data-parallel plans pay for the
    collectives and shared cores they really meet. The profile is saved under
    :func:`profile_config_key` in ``run_dir``.

    Args:
        cfg: The ``JobConfig``.
        cluster: A started runtime ``Cluster``.
        run_dir: Where the profile is cached.
        launcher: The workflow's :class:`GroupLauncher`.
        run_id: Prefix of the profiling run's channel names.
        repeats: Timed calls per component batch size (the median is kept).
        message_repeats: Round trips per message size.
        dp_ranks: Actor ranks of the data-parallel measurement (1: keep ``dp_efficiency`` 1).
        warmup: Untimed calls per batch size first (a freshly built env pool runs its first
            steps slower).
        loop_iterations: Iterations of the real loop timed on the profiling groups, and again
            with ``dp_ranks`` actor ranks on devices 0.. when the cluster has that many (a CPU
            cluster always: its device slots share the same cores) (:func:`measure_loop`; its costs beyond the profiled
            calls become ``ring_s`` / ``loop_s`` / ``loop_dp_s``, see :func:`with_cpu_terms`);
            0 (default, what ``placement=auto`` uses: the loop takes about a minute on 2 cores)
            skips it.
        loop_warmup: Untimed loop iterations first (fresh processes run their first
            iterations slower).
    """
    from rlinf_embodied.scheduler.profiler import WorkerGroupComponent

    probe = dataclasses.replace(cfg, placement="<profiling>", trainer=dataclasses.replace(
        cfg.trainer, pipeline_stages=1))
    groups = launcher.launch(probe, Path(run_dir), run_id + "-profile", PROFILING_PLACEMENT)
    try:
        components = [
            WorkerGroupComponent("env", groups.env, "profile_step"),
            WorkerGroupComponent("rollout", groups.rollout, "profile_act"),
            WorkerGroupComponent("actor", groups.actor, "profile_train"),
        ]
        versions = iter(range(1, 1 << 30))
        sizes = default_batch_sizes(cfg, 1)  # up to every env on one device
        profile = profile_workflow(
            components, sizes, default_device_memory(),
            weight_sync=lambda: groups.sync.push(next(versions)), repeats=repeats,
            warmup=warmup,
        )
        spec = groups.env.on([0]).space_spec().wait()[0]
        groups.env.profile_close().wait()
        loop = (measure_loop(groups, versions, loop_iterations, loop_warmup)
                if loop_iterations else None)
    finally:
        groups.shutdown(keep_cluster=True)
    actor = profile["actor"]
    if dp_ranks > 1:
        batch = max(1, sizes["actor"][-1] // dp_ranks)
        t_dp = _data_parallel_train_s(cfg, cluster, spec, run_id, dp_ranks, batch, repeats,
                                      launcher)
        eff = min(1.0, max(1e-3, (actor.time(batch) / t_dp) ** (1.0 / math.log2(dp_ranks))))
        profile = dataclasses.replace(profile, components={
            **profile.components, "actor": dataclasses.replace(actor, dp_efficiency=eff)})
    loop_dp = None
    if loop_iterations and dp_ranks > 1 and (dp_ranks <= int(cluster.num_devices)
                                             or cpu_cores(cluster) > 0):
        # the real update on dp_ranks actor ranks, one per device slot (ranks of one group on
        # one slot would each wait for the slot's device lock that the other holds); CPU
        # device slots are shares of the same cores, so a CPU cluster can always declare them
        dp_plan = {"context_switch": True, "groups": {
            "env": {"devices": "0"}, "rollout": {"devices": "0"},
            "actor": {"devices": f"0-{dp_ranks - 1}"}}}
        wide = dataclasses.replace(probe, cluster=dataclasses.replace(
            probe.cluster, num_cpu_devices=max(dp_ranks, probe.cluster.num_cpu_devices)))
        groups = launcher.launch(wide, Path(run_dir), run_id + "-loop-dp", dp_plan)
        try:
            loop_dp = measure_loop(groups, iter(range(1, 1 << 30)), loop_iterations, loop_warmup)
        finally:
            groups.shutdown(keep_cluster=True)
    messages = profile_messages(cluster, message_sizes(cfg), repeats=message_repeats)
    profile = dataclasses.replace(profile, messages=messages)
    profile = with_cpu_terms(profile, cfg, cpu_cores(cluster), loop, loop_dp, dp_ranks)
    save_profile(run_dir, profile_config_key(cfg), profile)
    return profile


def cpu_cores(cluster: Any) -> int:
    """Physical CPU cores the device slots of device 0's node share, or 0 on accelerators.

    CPU device slots (``cluster.num_cpu_devices``) are shares of one node's cores: Ray's CPU
    count of that node, at most the cores this process may run on (``os.sched_getaffinity``).
    """
    import os

    from rlinf_embodied.runtime.device import CPU

    dev0 = cluster.device(0)
    if dev0.kind != CPU:
        return 0
    return max(1, min(int(cluster.node_cpus(dev0.node_id)), len(os.sched_getaffinity(0))))


def measure_loop(groups: Any, versions: Any, iterations: int = 2, warmup: int = 1) -> dict:
    """Run the real training loop (weight sync, rollout, update) on launched ``groups``.

    Returns the medians over ``iterations`` iterations after ``warmup`` of: ``rollout_s`` (the
    driver's wall time of the env and rollout calls), ``train_s`` (the actor's update, incl.
    receiving the trajectories), ``env_s`` (the env's own stepping time), ``forward_s`` (the
    rollout's forwards) and ``requests`` (policy queries answered).

    Args:
        groups: Launched groups of one rank each (what :meth:`GroupLauncher.launch` returns).
        versions: Iterator of fresh weight versions (the weight sync needs a new one each time).
        iterations: Iterations timed.
        warmup: Iterations run first and not timed.
    """
    import statistics
    import time

    from rlinf_embodied.runtime import wait_all

    rows = []
    for i in range(warmup + iterations):
        v = next(versions)
        groups.sync.push(v)
        t0 = time.perf_counter()
        serve = groups.rollout.serve(v)
        env = groups.env.rollout(v)
        env_stats, serve_stats = wait_all(env, serve)
        t1 = time.perf_counter()
        groups.actor.train(v).wait()
        t2 = time.perf_counter()
        if i >= warmup:
            rows.append({"rollout_s": t1 - t0, "train_s": t2 - t1,
                         "env_s": max(s["env_time_s"] for s in env_stats),
                         "forward_s": max(s["forward_s"] for s in serve_stats),
                         "requests": max(s["requests"] for s in serve_stats)})
    return {k: statistics.median(r[k] for r in rows) for k in rows[0]}


def with_cpu_terms(profile: WorkflowProfile, cfg: Any, cores: int, loop: dict | None,
                   loop_dp: dict | None = None, dp_ranks: int = 2) -> WorkflowProfile:
    """``profile`` with the CPU facts and the real loop's costs (see :func:`measure_loop`).

    * ``cpu_cores`` = ``cores`` (0 on accelerators: no CPU terms); ``cpu_threads``: the env's
      pool processes per rank (one thread when it steps in-process), the policy workers' torch
      threads (the node's cores; the runtime divides them among a group's ranks).
    * With ``loop`` (one rank each, taking turns on one device slot): env ``ring_s`` = its step
      in the loop / T minus its profiled step of N envs, rollout ``ring_s`` = forward per request
      in the loop minus its profiled forward (on CPU; 0 on accelerators, where what the loop adds
      goes to ``loop_s``); env ``loop_s`` = what is left of the rollout per round after both
      members' calls and the two ring messages (bookkeeping, resets); actor ``loop_s`` = the
      update minus the trajectory message and the profiled forward + backward of its calls, per
      optimizer step (the optimizer update, clipping, advantages).
    * With ``loop_dp`` (the same loop with ``dp_ranks`` actor ranks): actor ``loop_dp_s`` = its
      per-step ``loop_s`` there (against the data-parallel forward + backward of its share)
      minus the single-rank ``loop_s``, per doubling of ranks; when that is negative (the
      forward + backward probe of ``dp_efficiency`` was slower than the real loop's steps),
      ``dp_efficiency`` is set so that the loop's steps are what the model predicts.
    """
    from rlinf_embodied.scheduler.cost_model import CostModel

    procs = int(getattr(cfg.env, "num_processes", 0) or 0)
    comps = dict(profile.components)
    comps["env"] = dataclasses.replace(comps["env"], cpu_threads=float(max(1, procs)))
    for name in ("rollout", "actor"):
        comps[name] = dataclasses.replace(comps[name], cpu_threads=float(max(1, cores)),
                                          cpu_threads_per_rank=False)
    if loop:
        cycle, actor = graph_from_config(cfg).stages()
        n, T = cycle.items, cycle.rounds
        env_ring = loop["env_s"] / T
        roll_ring = loop["forward_s"] / max(1, loop["requests"])
        ring_env = max(0.0, env_ring - comps["env"].time(n)) if cores else 0.0
        ring_roll = max(0.0, roll_ring - comps["rollout"].time(n)) if cores else 0.0
        msgs = sum(profile.message_s(b * n, False, 1, k)
                   for b, k in zip(cycle.ring_bytes, cycle.ring_tensors or (1, 1)))
        calls = comps["env"].time(n) + ring_env + comps["rollout"].time(n) + ring_roll + msgs
        comps["env"] = dataclasses.replace(comps["env"], ring_s=ring_env,
                                           loop_s=max(0.0, loop["rollout_s"] / T - calls))
        comps["rollout"] = dataclasses.replace(comps["rollout"], ring_s=ring_roll)
        t = cfg.trainer
        batch = t.micro_batch_size or actor.items
        cm = CostModel(dataclasses.replace(profile, components=comps))
        step = cm.call_time("actor", actor.items, 1, batch)
        handoff = profile.message_s(actor.in_bytes, False, 1, actor.in_tensors)
        loop_1 = max(0.0, (loop["train_s"] - handoff) / actor.rounds - step)
        comps["actor"] = dataclasses.replace(comps["actor"], loop_s=loop_1)
        if loop_dp:
            share = -(-actor.items // dp_ranks)
            step_dp = cm.call_time("actor", actor.items, dp_ranks, t.micro_batch_size or share)
            per_round = (loop_dp["train_s"] - handoff / dp_ranks) / actor.rounds
            growth = (per_round - step_dp - loop_1) / math.log2(dp_ranks)
            a = comps["actor"]
            if growth >= 0:
                comps["actor"] = dataclasses.replace(a, loop_dp_s=growth)
            else:  # the probe's slow-down exceeds the real loop's: the loop's step wins
                plain = step_dp / a.scale(dp_ranks)
                need = max(per_round - loop_1, 1e-9)
                eff = min(1.0, max(1e-3, (plain / need) ** (1.0 / math.log2(dp_ranks))))
                comps["actor"] = dataclasses.replace(a, dp_efficiency=eff)
    return dataclasses.replace(profile, components=comps, cpu_cores=int(cores))


def _data_parallel_train_s(cfg: Any, cluster: Any, spec: dict, run_id: str, ranks: int,
                           batch: int, repeats: int, launcher: GroupLauncher) -> float:
    """Median seconds of ``profile_train(batch)`` on ``ranks`` FSDP actor ranks at once."""
    from rlinf_embodied.scheduler.profiler import WorkerGroupComponent, profile_component

    spread = int(cluster.num_devices) >= ranks
    group, cleanup = launcher.actor_group(cfg, cluster, spec, run_id + "-dp", ranks, spread)
    try:
        prof = profile_component(WorkerGroupComponent("actor", group, "profile_train"), [batch],
                                 repeats=repeats)
        return prof.time_s[0]
    finally:
        cleanup()


def default_batch_sizes(cfg: Any, devices: int) -> dict:
    """Batch sizes to profile per group: powers of two up to the per-device maximum."""

    def ladder(n: int) -> list:
        out, b = [], 1
        while b < n:
            out.append(b)
            b *= 4
        return out + [n]

    n_env = max(1, -(-cfg.env.num_envs // max(1, devices)))
    samples = cfg.env.num_envs * cfg.trainer.rollout_steps
    n_actor = cfg.trainer.micro_batch_size or max(1, samples // max(1, cfg.trainer.num_minibatches))
    return {"env": ladder(n_env), "rollout": ladder(n_env), "actor": ladder(min(n_actor, samples))}


def auto_plan(
    job_cfg: Any,
    cluster: Any,
    run_dir: str | Path,
    components: Sequence[Component] | None = None,
    device_memory_bytes: float | None = None,
    weight_sync: Any = None,
) -> tuple[dict, dict]:
    """Profile (if needed), plan, and return the placement for ``train ... placement=auto``.

    Order of profile sources: the cache in ``run_dir`` for (config, hardware); else measure
    ``components`` (one per worker group, each on one device; see ``profiler``) and, when
    ``cluster`` is a ``Cluster``, the channel messages, and cache the result; else the analytic
    default profile (the report says so).

    Args:
        job_cfg: The ``JobConfig``.
        cluster: A runtime ``Cluster`` (only ``num_devices`` is used) or an int device count.
        run_dir: Run directory for the profile cache.
        components: Components to measure when nothing is cached.
        device_memory_bytes: Device memory for a measured profile; None reads it from the
            first CUDA device, or uses 16 GiB on CPU.
        weight_sync: Callable doing one weight sync, timed with the components.

    Returns:
        ``(placement, report)``: ``placement`` is ``{context_switch, groups: {name: {devices}}}``
        (``PlacementPlan.from_dict`` accepts it); ``report`` has ``granularity``
        (``pipeline_stages``, ``chunks``, per-group ``micro_batch``), ``predicted_iteration_s``,
        ``mode``, ``profile`` (its source), ``text`` (the ``plan`` report) and ``json``.

    Raises:
        ValueError: when no plan fits in device memory (with the reason per mode).
    """
    devices = cluster if isinstance(cluster, int) else int(cluster.num_devices)
    profile = profile_for_config(job_cfg, run_dir)
    if profile.source.startswith("analytic") and components:
        messages = None
        if not isinstance(cluster, int):
            messages = profile_messages(cluster, message_sizes(job_cfg))
        profile = profile_workflow(
            components,
            default_batch_sizes(job_cfg, devices),
            device_memory_bytes or default_device_memory(),
            weight_sync=weight_sync,
            messages=messages,
        )
        save_profile(run_dir, profile_config_key(job_cfg), profile)
    result = plan_config(job_cfg, devices, profile)
    report = {
        "mode": result.best.mode,
        "predicted_iteration_s": result.best.time_s,
        "granularity": granularity(result.best.plan),
        "profile": profile.source,
        "hardware": hardware_fingerprint(),
        "text": report_text(result),
        "json": report_json(result),
    }
    return result.placement(), report


def default_device_memory() -> float:
    """Memory of the first CUDA device, else 16 GiB (the CPU stand-in), in bytes."""
    try:
        import torch

        if torch.cuda.is_available():
            return float(torch.cuda.get_device_properties(0).total_memory)
    except ImportError:  # pragma: no cover
        pass
    return 16.0 * (1 << 30)
