"""Launching a reasoning job's worker groups where its placement puts them.

The placement files are the embodied ones (``configs/placement/*.yaml``): the ``rollout`` and
``actor`` groups keep their names and the ``reward`` workers run where the file puts ``env``
(the role that turns responses into rewards, as env workers turn actions into rewards), so
collocated, disaggregated and hybrid placement mean the same thing for both workflows.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
__all__ = ["ReasoningGroups", "launch_reasoning_groups", "prepare_model_dir", "REWARD_SLOT",
           "resolve_reasoning_placement", "split_evenly"]

REWARD_SLOT = "env"
"""Placement-file group whose devices the reward workers use."""


def prepare_model_dir(cfg, run_dir: Path) -> str:
    """``model.path``, or the tiny model built (once) into ``run_dir/tiny_model`` with a
    tokenizer trained on the task's training prompts and solutions."""
    if cfg.model.path:
        p = Path(cfg.model.path)
        if not (p / "config.json").is_file():
            raise FileNotFoundError(f"model.path={p} is not an HF model directory (no config.json); "
                                    f"point it at a local model or drop it to build the tiny model.")
        return str(p)
    from rlinf_embodied.llm.tasks import corpus_text, load_problems
    from rlinf_embodied.llm.tiny_model import build_tiny_model

    texts = corpus_text(load_problems(cfg.task, "train"), cfg.task.prompt_format)
    return str(build_tiny_model(Path(run_dir) / "tiny_model", texts, seed=cfg.model.tiny_seed,
                                num_layers=cfg.model.tiny_layers))


@dataclasses.dataclass
class ReasoningGroups:
    """The live worker groups of a reasoning run."""

    cfg: object
    cluster: object
    rollout: object
    reward: object
    actor: object
    sync: object
    plan: object
    model_dir: str
    backend: str
    channels: list = dataclasses.field(default_factory=list)
    """The run's channels (responses, scored), deleted at shutdown."""

    def shutdown(self, keep_cluster: bool = False) -> None:
        """Stop every worker, delete the channels, release the cluster (unless
        ``keep_cluster``)."""
        from rlinf_embodied.runtime import delete_channels

        for grp in (self.rollout, self.reward, self.actor):
            grp.shutdown()
        delete_channels(self.channels)
        if not keep_cluster:
            self.cluster.shutdown()


def launch_reasoning_groups(cfg, run_dir: Path, run_id: str, plan=None) -> ReasoningGroups:
    """Start the cluster, the two channels and the rollout / reward / actor groups of ``cfg``
    (placed by ``plan`` when given, else by ``cfg.placement``; ``auto`` profiles and plans).
    A launch that fails part-way stops what it started, deletes the channels and releases the
    cluster before the error propagates (:func:`~rlinf_embodied.runners.setup.release_launch`)."""
    from rlinf_embodied.runners.setup import check_plan_fits, group_ranks, open_cluster, release_launch
    from rlinf_embodied.runtime import Channel, WorkerGroup
    from rlinf_embodied.weight_sync import WeightSync
    from rlinf_embodied.workers.reasoning_actor import ReasoningActorWorker
    from rlinf_embodied.workers.reasoning_rollout import ReasoningRolloutWorker
    from rlinf_embodied.workers.reward_worker import RewardWorker

    model_dir = prepare_model_dir(cfg, run_dir)
    cluster = open_cluster(cfg)
    if plan is None:
        plan = resolve_reasoning_placement(cfg, cluster, run_dir, run_id)
    nd = cluster.num_devices
    check_plan_fits(cluster, plan)
    print(cluster.describe())
    text = re.sub(rf"\b{REWARD_SLOT}\b {{3}}", "reward", plan.describe(nd))  # keep the columns
    print(re.sub(rf"\b{REWARD_SLOT}\b", "reward", text))
    ranks = group_ranks(plan, nd)
    n_roll, n_rew, n_act = ranks["rollout"], ranks[REWARD_SLOT], ranks["actor"]
    responses, scored = f"{run_id}/responses", f"{run_id}/scored"
    # unbounded: a waiting actor never back-pressures the rollout
    channels: list = []
    started: list = []
    try:
        channels += [Channel.create(name) for name in (responses, scored)]
        spec = plan.group(REWARD_SLOT)
        reward = WorkerGroup(cluster, RewardWorker, "reward", spec.devices, spec.procs_per_device,
                             context_switch=plan.shares_devices(REWARD_SLOT, nd), torch_threads=1,
                             init_args=(cfg, model_dir, responses, scored, 0, n_act))
        started.append(reward)
        for j in range(n_rew):  # rollout rank k feeds reward rank k % n_rew
            reward.on([j]).set_num_producers(sum(k % n_rew == j for k in range(n_roll))).wait()
        rollout = WorkerGroup.from_plan(cluster, plan, "rollout", ReasoningRolloutWorker,
                                        init_args=(cfg, model_dir, responses, n_rew))
        started.append(rollout)
        actor = WorkerGroup.from_plan(cluster, plan, "actor", ReasoningActorWorker,
                                      init_args=(cfg, model_dir, scored, n_rew))
        started.append(actor)
        actor.init_process_group()
        actor.setup().wait()
        backend = rollout.on([0]).info().wait()[0]["backend"]
    except BaseException:
        release_launch(started, channels, cluster)
        raise
    return ReasoningGroups(cfg, cluster, rollout, reward, actor, WeightSync(actor, rollout), plan,
                           model_dir, backend, channels)


def resolve_reasoning_placement(cfg, cluster, run_dir: Path, run_id: str):
    """The runtime ``PlacementPlan`` of ``cfg.placement`` on ``cluster``: the named placement
    file, or with ``auto`` the scheduler's plan (profiling the workers unless the run
    directory caches a profile for this config, see
    :func:`~rlinf_embodied.reasoning.schedule.auto_plan_reasoning`)."""
    from rlinf_embodied.runners.setup import resolve_placement
    from rlinf_embodied.runtime import PlacementPlan

    if cfg.placement == "auto":
        from rlinf_embodied.reasoning.schedule import auto_plan_reasoning

        return PlacementPlan.from_dict(auto_plan_reasoning(cfg, cluster, run_dir, run_id,
                                                           launch_reasoning_groups))
    return PlacementPlan.from_yaml(resolve_placement(cfg.placement))


def split_evenly(items: list, parts: int) -> list:
    """``items`` in ``parts`` contiguous chunks whose sizes differ by at most one."""
    q, r = divmod(len(items), parts)
    out, i = [], 0
    for k in range(parts):
        n = q + (k < r)
        out.append(items[i:i + n])
        i += n
    return out

