"""Launching a training job's worker groups where its placement puts them."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Optional

from rlinf_embodied.config import ConfigError, JobConfig

__all__ = ["EmbodiedLauncher", "Groups", "check_divisibility", "check_image_policy",
           "check_minibatches", "check_plan_fits", "check_policy_paths", "group_ranks",
           "launch_groups", "open_cluster", "rebase_policy_paths", "resolve_placement",
           "validate_job"]


def check_policy_paths(cfg: JobConfig) -> None:
    """``policy.checkpoint`` / ``policy.pretrained`` name checkpoint directories that are here
    (``train`` and ``config show`` check them before Ray starts; nothing is downloaded, so a
    hub id is no path): a checkpoint's files and saved type as ``load_policy`` checks them, a
    pretrained directory's ``config.json``. Not part of :func:`validate_job`: an SFT pipeline's RL stage names ``sft/vla`` before the
    SFT stage writes it.

    Raises:
        ConfigError: naming the missing path and the fix.
    """
    for key in ("checkpoint", "pretrained"):
        path = getattr(cfg.policy, key, None)
        if path and not Path(path).is_dir():
            what = "is a file, not a directory" if Path(path).is_file() else "does not exist"
            raise ConfigError(
                f"policy.{key}={path} {what}; set it to a checkpoint directory (a run's "
                f"policy/ or an SFT run's sft/vla; published checkpoints are downloaded "
                f"beforehand, nothing is fetched at run time) or drop it to start from config.")
    pretrained = getattr(cfg.policy, "pretrained", None)
    if pretrained and not (Path(pretrained) / "config.json").is_file():  # every published layout
        raise ConfigError(
            f"policy.pretrained={pretrained} has no config.json: it is no checkpoint in a "
            f"published layout (config.json + safetensors weights, e.g. an SFT run's sft/vla); "
            f"point it at one or drop it to start from config.")
    if cfg.policy.checkpoint:
        from rlinf_embodied.policies import PolicyCheckpointError, check_checkpoint

        try:
            check_checkpoint(cfg.policy.checkpoint, cfg.policy.type)
        except PolicyCheckpointError as e:
            raise ConfigError(str(e)) from None


def rebase_policy_paths(cfg: JobConfig, old_root: str | Path, new_root: str | Path) -> JobConfig:
    """``cfg`` with each of ``policy.checkpoint`` / ``pretrained`` / ``tokenizer`` (π0) that lies inside
    ``old_root`` (as written, or with symlinks resolved) moved to the same place inside
    ``new_root``; a path outside ``old_root`` stays as it is.

    A run's stored config names the checkpoints of its run directory it started from by where
    that directory was (e.g. an SFT -> RL pipeline's ``policy.checkpoint=<run dir>/sft/policy``);
    after the directory was copied or moved, this gives the config as if it had started there.
    An absolute path stays absolute (``new_root`` resolved), a relative one relative.
    """
    old, new, moved = Path(old_root), Path(new_root), {}
    for key in ("checkpoint", "pretrained", "tokenizer"):
        value = getattr(cfg.policy, key, None)
        for root in (old, old.resolve()) if value else ():
            if Path(value).is_absolute() != root.is_absolute():
                continue
            try:
                rel = Path(value).relative_to(root)
            except ValueError:
                continue
            moved[key] = str((new.resolve() if root.is_absolute() else new) / rel)
            break
    if not moved:
        return cfg
    return dataclasses.replace(cfg, policy=dataclasses.replace(cfg.policy, **moved))


def resolve_placement(name: str) -> Path:
    """Path of placement ``name``: a file path, or ``configs/placement/<name>.yaml``.

    Raises:
        ConfigError: when no such file exists (lists the shipped placements).
    """
    p = Path(name)
    if p.suffix in (".yaml", ".yml") and p.exists():
        return p
    if p.is_dir():
        raise ConfigError(f"placement {name!r} is a directory; name a placement YAML file in it "
                          "or a shipped placement.")
    if p.is_file():
        raise ConfigError(f"placement {name!r} is a {p.suffix or 'suffix-less'} file, not a "
                          "placement YAML (.yaml); name one or a shipped placement.")
    from rlinf_embodied.configs import ROOT as CONFIG_ROOT

    for root in (Path.cwd() / "configs", CONFIG_ROOT):
        cand = root / "placement" / f"{name}.yaml"
        if cand.exists():
            return cand
    from rlinf_embodied.config.errors import suggest

    shipped = sorted(x.stem for x in (CONFIG_ROOT / "placement").glob("*.yaml"))
    raise ConfigError(f"placement {name!r} not found; use a YAML path or one of {shipped} (or "
                      f"auto){suggest(name, shipped + ['auto']) or '.'}")


def group_ranks(plan, num_devices: int) -> dict:
    """Ranks of the env, rollout and actor groups under ``plan`` on ``num_devices`` devices."""
    return {name: len(plan.device_ids(name, num_devices)) * plan.group(name).procs_per_device
            for name in ("env", "rollout", "actor")}


def validate_job(cfg: JobConfig) -> None:
    """Checks that need no cluster, run before anything is started or written (``train`` and
    ``config show`` both run them): the env exists (``env.check_available()``), the envs form
    whole GRPO groups, ``algorithm.advantage`` / ``algorithm.loss`` are registered names, no
    KL coefficient (there is no reference policy), a ``cnn`` policy's
    conv stack fits the env's images (:func:`check_image_policy`), wandb importable when
    enabled, the placement exists and parses, and the env sharding and the minibatch count fit
    it when every group's devices are explicit.

    Raises:
        ConfigError: naming the problem and the fix.
    """
    cfg.env.check_available()
    n, g = cfg.env.num_envs, max(1, cfg.algorithm.group_size)
    if n % g:  # the rank-free part of check_divisibility, which runs once ranks are placed
        raise ConfigError(
            f"Set env.num_envs to a multiple of algorithm.group_size={g} (got {n}): the envs "
            f"form groups of {g} that share a reset seed."
        )
    if cfg.algorithm.kl_coef != 0.0:
        raise ConfigError(
            f"algorithm.kl_coef={cfg.algorithm.kl_coef}: training keeps no reference policy to "
            f"take a KL penalty to; set algorithm.kl_coef=0 (algorithm.target_kl and the clip "
            f"ratios limit the update)."
        )
    from rlinf_embodied.algorithms import advantage_names, get_advantage, get_loss, loss_names

    for get, name in ((get_advantage, cfg.algorithm.advantage), (get_loss, cfg.algorithm.loss)):
        try:  # the actor looks them up only at its first update, after Ray and a rollout
            get(name)
        except ValueError as e:  # algorithm.loss=grpo: GRPO is an advantage estimator
            msg = str(e)
            if get is get_loss and name in advantage_names():
                msg = (f"algorithm.loss={name} names an advantage estimator, not a loss: set "
                       f"algorithm.advantage={name} and algorithm.loss to one of "
                       f"{', '.join(loss_names())}.")
            elif get is get_advantage and name in loss_names():
                msg = (f"algorithm.advantage={name} names a loss, not an advantage estimator: "
                       f"set algorithm.loss={name} and algorithm.advantage to one of "
                       f"{', '.join(advantage_names())}.")
            raise ConfigError(msg) from None
    check_image_policy(cfg)
    if cfg.logging.wandb:
        import importlib.util

        if importlib.util.find_spec("wandb") is None:
            raise ConfigError(
                "logging.wandb=true but wandb is not installed; `.venv/bin/pip install wandb` "
                "(then `wandb login`), or set logging.wandb=false."
            )
    if cfg.placement == "auto":
        check_minibatches(cfg, 1)
        return
    from rlinf_embodied.runtime.placement import PlacementError, PlacementPlan

    path = resolve_placement(cfg.placement)
    try:
        plan = PlacementPlan.from_yaml(path)
        if cfg.cluster.address is not None:
            check_minibatches(cfg, 1)
            return  # the device count is the remote cluster's
        import torch

        num_devices = torch.cuda.device_count() or cfg.cluster.num_cpu_devices
        plan.validate(num_devices)
        ranks = group_ranks(plan, num_devices)
    except PlacementError as e:
        raise ConfigError(f"placement {cfg.placement!r} ({path}): {e}") from None
    check_divisibility(cfg, ranks["env"], ranks["actor"])
    check_minibatches(cfg, ranks["actor"])


def check_image_policy(cfg: JobConfig) -> None:
    """A policy with an image-size check (``cnn``: ``CNNPolicyConfig.check_image_size``) must
    fit the env's images, where the env config states their size: ``env.sensor_size``
    (ManiSkill) or ``env.image_size`` (LIBERO), with ``env.obs_mode=rgb`` or
    ``env.render_images=true`` (a ManiSkill env with neither gives no images: refused).
    Skipped when the size is unknown (``gym``: the env decides), and then the policy's own
    check raises inside the worker.

    Raises:
        ConfigError: naming the image size, the conv layer where it drops below 1 pixel and
            the fix.
    """
    check = getattr(cfg.policy, "check_image_size", None)
    env = cfg.env
    if check is None:
        return
    if getattr(env, "obs_mode", "rgb") != "rgb" and not getattr(env, "render_images", False):
        if getattr(env, "type", None) == "maniskill":
            raise ConfigError(
                f"policy.type={cfg.policy.type} reads camera images but env.obs_mode="
                f"{env.obs_mode} gives none; set env.obs_mode=rgb (or env.render_images=true for "
                "the human camera), or use a state policy (policy.type=mlp).")
        return
    for key in ("sensor_size", "image_size"):
        size = getattr(env, key, None)
        if size is not None:
            check(int(size), f"env.{key}")
            return


def check_minibatches(cfg: JobConfig, actor_ranks: int) -> None:
    """Every minibatch must hold at least one sample: ``trainer.num_minibatches`` <= the
    T x N / actor-ranks samples an actor rank trains on per iteration.

    Raises:
        ConfigError: naming the sample count and the fix.
    """
    t = cfg.trainer
    samples = t.rollout_steps * max(1, cfg.env.num_envs // max(1, actor_ranks))
    if t.num_minibatches > samples:
        raise ConfigError(
            f"trainer.num_minibatches={t.num_minibatches} is more than the {samples} samples an "
            f"actor rank trains on per iteration (trainer.rollout_steps x env.num_envs / actor "
            f"ranks = {t.rollout_steps} x {cfg.env.num_envs} / {actor_ranks}); set "
            f"trainer.num_minibatches to at most {samples}."
        )


def check_divisibility(cfg: JobConfig, env_ranks: int, actor_ranks: int = 1) -> None:
    """Env sharding must be even: N = env ranks x stages x n with n a multiple of the GRPO
    group G, and every actor rank trains N / actor ranks envs, a multiple of G too.

    Also the exact ``env.ignore_terminations_fraction`` check for ``env_ranks``
    (:meth:`JobConfig.check_fixed_length_envs`).

    Raises:
        ConfigError: naming the values and the fix.
    """
    n, s, g = cfg.env.num_envs, cfg.trainer.pipeline_stages, max(1, cfg.algorithm.group_size)
    if n % (env_ranks * s) or (n // (env_ranks * s)) % g:
        raise ConfigError(
            f"Set env.num_envs to a multiple of env ranks x trainer.pipeline_stages x "
            f"algorithm.group_size = {env_ranks} x {s} x {g} = {env_ranks * s * g} (got {n})."
        )
    if n % (actor_ranks * g):
        raise ConfigError(
            f"Set env.num_envs to a multiple of actor ranks x algorithm.group_size = "
            f"{actor_ranks} x {g} = {actor_ranks * g} (got {n}), or give the actor fewer devices."
        )
    cfg.check_fixed_length_envs(env_ranks)  # exact now that the env ranks are known


@dataclasses.dataclass
class Groups:
    """The live worker groups of a run."""

    cfg: JobConfig
    """The config the groups run (``placement=auto`` may have changed the granularity)."""
    cluster: object
    env: object
    rollout: object
    actor: object
    sync: object
    plan: object
    channels: list = dataclasses.field(default_factory=list)
    """The run's channels (obs, actions, trajectories): their queue actors are deleted at
    shutdown, so that runs on a cluster that outlives them (``cluster.address``, a restart,
    a test session) leave none behind."""

    def shutdown(self, keep_cluster: bool = False, close_timeout: float = 60.0) -> None:
        """Close envs (waiting at most ``close_timeout`` s), stop every worker, delete the
        channels, release the cluster (unless ``keep_cluster``)."""
        try:
            self.env.close().wait(close_timeout)
        except Exception:  # noqa: BLE001 - best effort: the actors are killed next anyway
            pass
        for grp in (self.env, self.rollout, self.actor):
            grp.shutdown()
        from rlinf_embodied.runtime import delete_channels

        delete_channels(self.channels)
        if not keep_cluster:
            self.cluster.shutdown()


def open_cluster(cfg):
    """The job's :class:`~rlinf_embodied.runtime.Cluster`: attached to ``cfg.cluster.address``
    (or an embedded Ray), nodes advertising ``cfg.elastic.preemptible_resource`` left out of the
    placed groups' devices."""
    from rlinf_embodied.runtime import Cluster

    return Cluster(cfg.cluster.address, num_cpus=cfg.cluster.num_cpus,
                   num_cpu_devices=cfg.cluster.num_cpu_devices,
                   preemptible_resource=cfg.elastic.preemptible_resource)


def check_plan_fits(cluster, plan) -> None:
    """Validate ``plan`` on the cluster's reserved devices.

    Raises:
        ConfigError: one line: the placement's problem and which nodes are reserved (with
            their device ids) and which preemptible (the cluster is shut down first).
    """
    from rlinf_embodied.runtime import PlacementError

    try:
        plan.validate(cluster.num_devices)
    except PlacementError as e:
        msg = cluster.placement_error(e)
        cluster.shutdown()
        raise ConfigError(msg) from None


def release_launch(groups: list, channels: list, cluster=None) -> None:
    """Undo a failed launch, best effort: stop ``groups`` (newest first), delete ``channels``
    and shut ``cluster`` down (None: a cluster the caller keeps). Errors while releasing are
    swallowed so that the launch's own error is the one raised."""
    from rlinf_embodied.runtime import delete_channels

    for grp in reversed(groups):
        try:
            grp.shutdown()
        except Exception:  # noqa: BLE001 - Ray going down: the actors go with it
            pass
    delete_channels(channels)
    if cluster is not None:
        try:
            cluster.shutdown()
        except Exception:  # noqa: BLE001
            pass


def launch_groups(cfg: JobConfig, run_dir: Path, run_id: str, checkpoint: Optional[Path],
                  plan=None, actor_cls=None, cluster=None) -> Groups:
    """Start the cluster (or use ``cluster``), the channels and the env / rollout / actor
    groups of ``cfg`` (placed by ``plan`` when given, else by ``cfg.placement``; ``actor_cls``
    replaces ActorWorker, e.g. the elastic runner's subclass).

    A launch that fails part-way (a worker's constructor or setup raises, Ctrl-C) stops the
    groups it started and deletes its channels before the error propagates, so that a cluster
    that outlives the run (``cluster.address``, a restart's relaunch) keeps none of them; a
    cluster opened here is released too."""
    from rlinf_embodied.runtime import Channel, PlacementPlan, WorkerGroup
    from rlinf_embodied.weight_sync import WeightSync
    from rlinf_embodied.workers.actor_worker import ActorWorker
    from rlinf_embodied.workers.env_worker import ChannelNames, EnvWorker, actor_slices
    from rlinf_embodied.workers.rollout_worker import RolloutWorker

    own_cluster = cluster is None
    cluster = cluster or open_cluster(cfg)
    if plan is None and cfg.placement == "auto":
        plan, cfg = _auto_placement(cfg, cluster, run_dir, run_id)
    elif plan is None:
        plan = PlacementPlan.from_yaml(resolve_placement(cfg.placement))
    check_plan_fits(cluster, plan)
    print(cluster.describe())
    print(plan.describe(cluster.num_devices))
    nd = cluster.num_devices
    ranks = group_ranks(plan, nd)
    check_divisibility(cfg, ranks["env"], ranks["actor"])
    check_minibatches(cfg, ranks["actor"])
    names = ChannelNames(f"{run_id}/obs", f"{run_id}/actions", f"{run_id}/trajectories")
    channels: list = []
    started: list = []  # the groups to stop if the launch fails
    try:
        channels += [Channel.create(n) for n in (names.obs, names.actions, names.trajectories)]
        env = WorkerGroup.from_plan(cluster, plan, "env", EnvWorker, init_args=(
            cfg, names, ranks["rollout"], ranks["actor"], str(run_dir / "videos")))
        started.append(env)
        spec = env.on([0]).space_spec().wait()[0]
        rollout = WorkerGroup.from_plan(cluster, plan, "rollout", RolloutWorker,
                                        init_args=(cfg, spec, names, ranks["env"], cfg.trainer.join_forwards))
        started.append(rollout)
        per_env_rank = cfg.env.num_envs // ranks["env"]
        streams = [0] * ranks["actor"]
        for r in range(ranks["env"]):
            for a, _, _ in actor_slices(r * per_env_rank, per_env_rank, cfg.env.num_envs, ranks["actor"]):
                streams[a] += 1
        actor = WorkerGroup.from_plan(cluster, plan, "actor", actor_cls or ActorWorker,
                                      init_args=(cfg, spec, names, 0))
        started.append(actor)
        for a in range(ranks["actor"]):
            actor.on([a]).set_num_streams(streams[a]).wait()
        actor.init_process_group()
        actor.setup(str(checkpoint) if checkpoint else None).wait()
    except BaseException:
        release_launch(started, channels, cluster if own_cluster else None)
        raise
    lora = bool(getattr(cfg.policy, "lora_rank", 0))
    return Groups(cfg, cluster, env, rollout, actor, WeightSync(actor, rollout, trainable_only=lora), plan,
                  channels)


class EmbodiedLauncher:
    """The embodied workflow's :class:`~rlinf_embodied.scheduler.auto.GroupLauncher`: how
    ``placement=auto`` starts its groups for profiling (the scheduler imports no runner)."""

    def launch(self, cfg: JobConfig, run_dir: Path, run_id: str, placement: dict) -> Groups:
        """:func:`launch_groups` of ``cfg`` placed by the ``placement`` dict, no checkpoint."""
        from rlinf_embodied.runtime import PlacementPlan

        return launch_groups(cfg, Path(run_dir), run_id, None,
                             plan=PlacementPlan.from_dict(placement))

    def actor_group(self, cfg: JobConfig, cluster, spec: dict, run_id: str, ranks: int,
                    spread: bool):
        """``ranks`` FSDP actor ranks alone (one per device when ``spread``, else all on device
        0), set up from scratch; returns ``(group, cleanup)``."""
        from rlinf_embodied.runtime import Channel, WorkerGroup
        from rlinf_embodied.workers.actor_worker import ActorWorker
        from rlinf_embodied.workers.env_worker import ChannelNames

        names = ChannelNames(*(f"{run_id}/{k}" for k in ("obs", "actions", "trajectories")))
        channels = [Channel.create(n) for n in (names.obs, names.actions, names.trajectories)]
        group = None

        def cleanup() -> None:
            release_launch([group] if group is not None else [], channels)

        try:
            group = WorkerGroup(cluster, ActorWorker, "actor",
                                devices=list(range(ranks)) if spread else [0],
                                procs_per_device=1 if spread else ranks,
                                init_args=(cfg, spec, names, 1))
            group.init_process_group()
            group.setup(None).wait()
        except BaseException:
            cleanup()
            raise
        return group, cleanup


def _auto_placement(cfg: JobConfig, cluster, run_dir: Path, run_id: str):
    """Profile env / rollout / actor alone at several batch sizes and the channel messages
    (unless a profile of this config and hardware is cached in the run directory), plan, and
    return (plan, cfg) with the planned pipeline granularity."""
    from rlinf_embodied.runtime import PlacementPlan
    from rlinf_embodied.scheduler.auto import auto_plan, measure_profile, profile_for_config

    if profile_for_config(cfg, run_dir).source.startswith("analytic"):
        print("placement=auto: profiling env, rollout, actor and channel messages on device 0 ...")
        measure_profile(cfg, cluster, run_dir, EmbodiedLauncher(), run_id)
    placement, report = auto_plan(cfg, cluster, run_dir)
    print(report["text"])
    stages = int(report["granularity"].get("pipeline_stages", cfg.trainer.pipeline_stages))
    micro = cfg.trainer.micro_batch_size  # the plan's actor micro-batch unless the job sets one
    planned = report["granularity"]["micro_batch"].get("actor")
    if micro is None:
        micro = planned
    elif planned is not None and planned != micro:
        print(f"placement=auto: keeping trainer.micro_batch_size={micro} (the plan's: {planned}; "
              "set trainer.micro_batch_size=null to run the plan's).")
    cfg = dataclasses.replace(cfg, trainer=dataclasses.replace(
        cfg.trainer, pipeline_stages=stages, micro_batch_size=micro))
    return PlacementPlan.from_dict(placement), cfg
