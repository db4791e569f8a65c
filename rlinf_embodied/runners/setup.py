"""Launching a training job's worker groups where its placement puts them."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Optional

from rlinf_embodied.config import ConfigError, JobConfig

__all__ = ["Groups", "launch_groups", "resolve_placement", "check_divisibility"]

CONFIG_ROOT = Path(__file__).resolve().parents[2] / "configs"


def resolve_placement(name: str) -> Path:
    """Path of placement ``name``: a file path, or ``configs/placement/<name>.yaml``.

    Raises:
        ConfigError: when no such file exists (lists the shipped placements).
    """
    p = Path(name)
    if p.suffix in (".yaml", ".yml") and p.exists():
        return p
    for root in (Path.cwd() / "configs", CONFIG_ROOT):
        cand = root / "placement" / f"{name}.yaml"
        if cand.exists():
            return cand
    shipped = sorted(x.stem for x in (CONFIG_ROOT / "placement").glob("*.yaml"))
    raise ConfigError(f"placement {name!r} not found; use a YAML path or one of {shipped} (or auto).")


def check_divisibility(cfg: JobConfig, env_ranks: int) -> None:
    """Env sharding must be even: N = ranks x stages x n, with n a multiple of the GRPO group.

    Raises:
        ConfigError: naming the values and the fix.
    """
    n, s, g = cfg.env.num_envs, cfg.trainer.pipeline_stages, max(1, cfg.algorithm.group_size)
    if n % (env_ranks * s) or (n // (env_ranks * s)) % g:
        raise ConfigError(
            f"Set env.num_envs to a multiple of env ranks x trainer.pipeline_stages x "
            f"algorithm.group_size = {env_ranks} x {s} x {g} = {env_ranks * s * g} (got {n})."
        )


@dataclasses.dataclass
class Groups:
    """The live worker groups of a run and the counts the runner needs."""

    cfg: JobConfig
    """The config the groups run (``placement=auto`` may have changed the granularity)."""
    cluster: object
    env: object
    rollout: object
    actor: object
    sync: object
    requests_per_rank: list
    eval_requests_per_rank: list
    plan: object

    def shutdown(self) -> None:
        """Close envs, stop every worker, release the cluster."""
        try:
            self.env.close().wait(60)
        except Exception:  # noqa: BLE001 - best effort: the actors are killed next anyway
            pass
        for grp in (self.env, self.rollout, self.actor):
            grp.shutdown()
        self.cluster.shutdown()


def launch_groups(cfg: JobConfig, run_dir: Path, run_id: str, checkpoint: Optional[Path]) -> Groups:
    """Start the cluster, the channels and the env / rollout / actor groups of ``cfg``."""
    from rlinf_embodied.runtime import Channel, Cluster, PlacementPlan, WorkerGroup
    from rlinf_embodied.weight_sync import WeightSync
    from rlinf_embodied.workers.actor_worker import ActorWorker
    from rlinf_embodied.workers.env_worker import ChannelNames, EnvWorker, stream_assignment
    from rlinf_embodied.workers.rollout_worker import RolloutWorker

    cluster = Cluster(cfg.cluster.address, num_cpus=cfg.cluster.num_cpus,
                      num_cpu_devices=cfg.cluster.num_cpu_devices)
    if cfg.placement == "auto":
        from rlinf_embodied.scheduler.auto import auto_plan

        placement, report = auto_plan(cfg, cluster, run_dir)
        print(report["text"])
        plan = PlacementPlan.from_dict(placement)
        stages = int(report["granularity"].get("pipeline_stages", cfg.trainer.pipeline_stages))
        cfg = dataclasses.replace(cfg, trainer=dataclasses.replace(cfg.trainer, pipeline_stages=stages))
    else:
        plan = PlacementPlan.from_yaml(resolve_placement(cfg.placement))
    plan.validate(cluster.num_devices)
    print(plan.describe(cluster.num_devices))
    nd = cluster.num_devices
    ranks = {k: len(plan.device_ids(k, nd)) * plan.group(k).procs_per_device for k in ("env", "rollout", "actor")}
    check_divisibility(cfg, ranks["env"])
    names = ChannelNames(f"{run_id}/obs", f"{run_id}/actions", f"{run_id}/trajectories")
    for n in (names.obs, names.actions, names.trajectories):
        Channel.create(n)
    env = WorkerGroup.from_plan(cluster, plan, "env", EnvWorker, init_args=(
        cfg, names, ranks["rollout"], ranks["actor"], str(run_dir / "videos")))
    spec = env.on([0]).space_spec().wait()[0]
    rollout = WorkerGroup.from_plan(cluster, plan, "rollout", RolloutWorker, init_args=(cfg, spec, names))
    streams = [sum(1 for r in range(ranks["env"]) if r % ranks["actor"] == a) for a in range(ranks["actor"])]
    actor = WorkerGroup.from_plan(cluster, plan, "actor", ActorWorker, init_args=(cfg, spec, names, 0))
    for a in range(ranks["actor"]):
        actor.on([a]).set_num_streams(streams[a]).wait()
    actor.init_process_group()
    actor.setup(str(checkpoint) if checkpoint else None).wait()
    assign = stream_assignment(ranks["env"], cfg.trainer.pipeline_stages, ranks["rollout"])
    T = cfg.trainer.rollout_steps
    requests = [len(assign[k]) * (T + 1) for k in range(ranks["rollout"])]
    eval_queries = _eval_queries(cfg, env)
    eval_req = [sum(eval_queries for (r, s) in assign[k] if s == 0) for k in range(ranks["rollout"])]
    lora = bool(getattr(cfg.policy, "lora_rank", 0))
    return Groups(cfg, cluster, env, rollout, actor, WeightSync(actor, rollout, trainable_only=lora),
                  requests, eval_req, plan)


def _eval_queries(cfg: JobConfig, env_group) -> int:
    steps = env_group.on([0]).max_episode_steps().wait()[0] or cfg.trainer.rollout_steps
    k = max(1, cfg.policy.action_chunk)
    return -(-steps // k)
