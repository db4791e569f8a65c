"""Typed configuration of the SFT -> RL pipeline (``rlinf-embodied demos | sft | sft-rl``).

One YAML (e.g. ``configs/sft/maniskill_pushcube_sft_rl_mlp.yaml``) describes the whole pipeline:
the env the demonstrations are recorded in and the policy is evaluated on (``env``), the policy
to behaviour-clone (``policy``), where the demonstrations come from (``demos``), the BC
optimisation (``bc``), the evaluation on held-out seeds (``eval``, ManiSkill's fair protocol)
and the RL stage (``rl``: a normal training job YAML that starts from the SFT checkpoint).
It is parsed by :func:`rlinf_embodied.config.load_config` with ``schema=SFTJobConfig``, so it
is as strict as every other job file (unknown keys name the closest valid one).
"""

from __future__ import annotations

import dataclasses

from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from rlinf_embodied.config import ConfigError, EnvConfig, PolicyConfig, RunConfig, config_class

__all__ = ["BCConfig", "DemoConfig", "RLStageConfig", "SFTEvalConfig", "SFTJobConfig", "VLA_TYPES",
           "is_sft_pipeline", "check_no_rl_stage_keys", "check_rl_config_found", "check_rl_family",
           "rl_config_policy_type", "rl_configs_of"]

VLA_TYPES = ("openvla", "openvla_oft", "pi0", "pi05")
"""Policy types trained on a language-conditioned suite's RGB demonstrations and saved in their
published layout (OpenVLA / OFT: Prismatic shards + ``dataset_statistics.json``; π0 / π0.5:
LeRobot's ``model.safetensors`` + ``policy_preprocessor.json`` statistics)."""


@dataclass
class DemoConfig:
    """Demonstrations: ManiSkill's motion-planning solutions, stored as ManiSkill trajectories."""

    dir: str = "data/demos"
    """Directory of the trajectory files (``<dir>/<env_id>/motionplanning/``)."""
    num_trajectories: int = 50
    """Successful demonstrations to record, per task for a suite (failed plans are retried
    with the next seed); SFT trains on the first this many."""
    seed: int = 0
    """First reset seed; demo k uses the k-th seed from here that gives a successful plan.
    The fair evaluation protocol uses seeds from 1_000_000, so demos below it are disjoint."""
    max_attempts_factor: int = 3
    """Give up after ``num_trajectories * max_attempts_factor`` planning attempts."""
    processes: int = 2
    """A suite's tasks are planned and converted in this many processes at once."""
    stride: int = 1
    """Suite demos: keep every ``stride``-th planned joint target before converting to the
    policy's controller (2: half the steps, twice the motion per step; sft/vla_demos.py)."""
    trim_idle_start: bool = True
    """Suite demos: drop the steps at an episode's start in which the arm barely moves (the
    planner closes the gripper first in PushCube / PullCube, then accelerates slowly): below
    10% of the episode's largest arm action. A policy cloned on them outputs no motion in the
    initial state, which then never changes (measured: 0 of 30 trials moved); OpenVLA's LIBERO
    data drops no-op steps likewise."""

    def __post_init__(self):
        if self.num_trajectories < 1:
            raise ConfigError(f"demos.num_trajectories must be >= 1 (got {self.num_trajectories}).")
        if self.stride < 1:
            raise ConfigError(f"demos.stride must be >= 1 (got {self.stride}).")
        if not 0 <= self.seed < 1_000_000:
            raise ConfigError(
                f"demos.seed must be in [0, 1_000_000) (got {self.seed}): evaluation uses "
                "seeds from 1_000_000 (maniskill_fair_v1), demonstrations must not."
            )


@dataclass
class BCConfig:
    """Behaviour cloning: maximise the policy's log-likelihood of the demonstrated actions."""

    steps: int = 3000
    """Optimizer steps."""
    batch_size: int = 256
    """Demonstration steps per optimizer step (sampled with replacement)."""
    lr: float = 1e-3
    """AdamW learning rate, cosine-annealed to 0 over ``steps``."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    max_grad_norm: float = 1.0
    """Gradient-norm clip."""
    fit_log_std: bool = True
    """After BC, set a Gaussian head's log-std to its maximum-likelihood value given the fitted
    mean (log RMS residual per action dim, normalised units). The log-std's gradient steps move
    it by about ``lr`` per step, so 2000 steps leave it near its initial -0.5 .. -1.5, an action
    noise larger than most demonstrated joint deltas: the sampled actions the RL stage's
    rollouts take then never succeed although the greedy ones do."""
    min_log_std: float | None = -1.5
    """After BC (and the fit), raise a Gaussian head's log-std to at least this (normalised
    action units), so that RL fine-tuning still explores; None keeps the fitted value."""
    max_log_std: float | None = None
    """Then lower it to at most this; None: no upper bound."""
    seed: int = 0
    """Torch seed of initialisation and minibatch order."""

    def __post_init__(self):
        for key, ok, need in (("steps", self.steps >= 1, ">= 1"),
                              ("batch_size", self.batch_size >= 1, ">= 1"),
                              ("lr", self.lr > 0, "> 0"),
                              ("weight_decay", self.weight_decay >= 0, ">= 0"),
                              ("max_grad_norm", self.max_grad_norm > 0, "> 0"),
                              ("image_shift", self.image_shift >= 0, ">= 0")):
            if not ok:
                raise ConfigError(f"bc.{key} must be {need} (got {getattr(self, key)}).")
        if (self.min_log_std is not None and self.max_log_std is not None
                and self.min_log_std > self.max_log_std):
            raise ConfigError(
                f"bc.min_log_std ({self.min_log_std}) must be <= bc.max_log_std "
                f"({self.max_log_std})."
            )
    image_shift: int = 0
    """Random-shift augmentation of VLA images (pixels of edge padding, then a random crop back
    to the image size); 0: none. State policies ignore it."""
    value_gamma: float | None = 0.8
    """Also fit the critic (if the policy has one) to the demos' discounted returns with this
    discount (the RL stage's ``algorithm.gamma``), so RL fine-tuning does not start from a
    random critic whose advantages would first undo the cloned behaviour; None skips it."""


@dataclass
class SFTEvalConfig:
    """Held-out evaluation of checkpoints (``rlinf_embodied.eval``, fair ManiSkill protocol)."""

    episodes: int = 100
    """Trials 0..episodes-1 of the protocol (seeds ``env_seed + i``)."""
    num_envs: int = 8
    """Envs evaluated in parallel (every trial runs once whatever the number)."""
    num_processes: int = 2
    """Env pool processes of the evaluation (CPU physics)."""
    protocol: str = "maniskill_fair_v1"
    """Evaluation protocol (``rlinf-embodied eval protocols`` lists them)."""
    gate_episodes: int = 20
    """The RL stage's step-0 gate re-evaluates the SFT checkpoint on the first this many
    trials and compares with the SFT stage's result on the same trials."""
    gate_tolerance: float = 0.25
    """Refuse to start RL when the re-evaluated success rate is more than this below the
    recorded one on the same trials (SimpleVLA-RL users reported SFT checkpoints that score 0
    under the RL setup throughout training)."""
    rl_checkpoint: str = "latest"
    """The RL run's checkpoint that the final evaluation compares with SFT: ``latest`` (the end
    of training) or ``best`` (the highest in-training evaluation; that evaluation's few trials
    make the pick noisy, and a pick on noise biases the comparison: measured on the OFT suite
    run, best = iteration 10 of 20 scored 0.487 on the protocol, latest 0.513)."""

    def __post_init__(self):
        if self.rl_checkpoint not in ("latest", "best"):
            raise ConfigError(f"eval.rl_checkpoint must be latest or best (got {self.rl_checkpoint!r}).")
        if self.episodes < 1 or self.gate_episodes < 1:
            raise ConfigError(f"eval.episodes and eval.gate_episodes must be >= 1 (got "
                              f"{self.episodes} and {self.gate_episodes}).")
        if not 0.0 <= self.gate_tolerance <= 1.0:
            raise ConfigError(f"eval.gate_tolerance is a success-rate difference in [0, 1] "
                              f"(got {self.gate_tolerance}).")
        if self.gate_episodes > self.episodes:
            raise ConfigError(
                f"eval.gate_episodes={self.gate_episodes} exceeds eval.episodes={self.episodes}: "
                "the gate re-runs trials of the SFT evaluation; set eval.gate_episodes <= "
                f"{self.episodes}.")


@dataclass
class RLStageConfig:
    """The RL fine-tuning stage: a training job YAML started from the SFT checkpoint."""

    config: str = "maniskill_pushcube_grpo_mlp_finetune"
    """Job YAML of the RL run (its env must match ``env``; its ``policy.checkpoint`` is set to
    the SFT checkpoint)."""
    reward_mode: Optional[str] = None
    """The RL run's ``env.reward_mode``; None: the pipeline's ``env.reward_mode`` (the demos'
    and evaluations' reward; evaluations count success whatever the reward)."""
    task_ids: Optional[list[int]] = None
    """Suite tasks the RL stage trains on, a subset of the pipeline's ``env.task_ids``; None:
    all of them. The SFT and final evaluations run every pipeline task either way (a task
    left out is still compared, trial by trial). A task the SFT never solves gives GRPO
    groups whose rewards are all 0, hence no signal: leaving it out spends the rollouts on
    tasks that have one (docs/vla_suite.md, "Measured")."""
    overrides: list[str] = field(default_factory=list)
    """``key=value`` overrides of that job (they come last, after the settings the pipeline
    passes on). Given on the command line, ``rl.overrides=[...]`` adds to the file's list
    (after it) rather than replacing it (:func:`~rlinf_embodied.sft.pipeline.load_sft_config`)."""


@dataclass
class SFTJobConfig:
    """A whole SFT -> RL pipeline (top level of ``configs/sft/*.yaml``)."""

    run: RunConfig = field(default_factory=RunConfig)
    env: EnvConfig = field(default_factory=lambda: config_class("env", "maniskill")())
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    demos: DemoConfig = field(default_factory=DemoConfig)
    bc: BCConfig = field(default_factory=BCConfig)
    eval: SFTEvalConfig = field(default_factory=SFTEvalConfig)
    rl: RLStageConfig = field(default_factory=RLStageConfig)

    def __post_init__(self):
        from rlinf_embodied.sft.demos import MP_SOLUTIONS

        if getattr(self.env, "type", None) != "maniskill":
            raise ConfigError(
                f"The SFT pipeline records ManiSkill motion-planning demonstrations; env.type "
                f"must be maniskill (got {self.env.type!r})."
            )
        ids = self.env.env_ids() if hasattr(self.env, "env_ids") else [self.env.env_id]
        for env_id in ids:
            if env_id not in MP_SOLUTIONS:
                raise ConfigError(
                    f"env task {env_id} has no ManiSkill motion-planning solution, so no "
                    f"demonstrations can be recorded for it; use tasks among {', '.join(MP_SOLUTIONS)}.")
        if self.rl.task_ids is not None:
            if getattr(self.env, "suite", None) is None:
                raise ConfigError("rl.task_ids selects tasks of a suite; set env.suite, or drop "
                                  "rl.task_ids (a single-task pipeline trains RL on its task).")
            have = list(self.env.suite_task_ids())
            extra = [t for t in self.rl.task_ids if t not in have]
            if extra or not self.rl.task_ids:
                raise ConfigError(
                    f"rl.task_ids={list(self.rl.task_ids)} must be a non-empty subset of the "
                    f"pipeline's tasks {have} (env.task_ids); drop {extra or 'the empty list'} or "
                    "set rl.task_ids=null to train on all of them.")
        self._check_protocol()
        if self.policy.type in VLA_TYPES and getattr(self.env, "suite", None) is None:
            raise ConfigError(
                f"policy.type={self.policy.type} learns from a language-conditioned suite's RGB "
                "demos; set env.suite (e.g. maniskill_lang3) and env.obs_mode=rgb.")

    def _check_protocol(self) -> None:
        """``eval.protocol`` must be a ManiSkill protocol that covers the pipeline's suite (or
        task), or the SFT evaluation would fail after training."""
        from rlinf_embodied.eval.protocols import ProtocolError, get_protocol

        suite = self.env.suite_spec() if getattr(self.env, "suite", None) else None
        try:
            get_protocol(self.eval.protocol, "maniskill").max_steps_for(
                suite.name if suite else self.env.env_id)
        except ProtocolError as e:
            # the protocol's message ends with the `eval` command's fix (--max-steps); a
            # pipeline's fix is the suite's protocol
            why = str(e).split("; pick one of those")[0].rstrip(".")
            fix = (f"; set eval.protocol={suite.protocol} (the suite's)" if suite
                   else "; set eval.protocol to a ManiSkill protocol for it")
            raise ConfigError(f"eval.protocol={self.eval.protocol}: {why}{fix}.") from None

    def run_dir(self) -> Path:
        """The pipeline's directory (``sft/``, ``rl/`` and the reports go under it)."""
        return self.run.run_dir()


def is_sft_pipeline(raw) -> bool:
    """Whether a job file's raw top-level mapping (:func:`~rlinf_embodied.config.peek_top_level`)
    is an SFT pipeline's: it has a ``demos`` or ``bc`` section (configs/sft/)."""
    return "demos" in raw or "bc" in raw


def check_no_rl_stage_keys(overrides: list, sections: set) -> None:
    """Refuse a pipeline override that sets a key of the RL stage's job config.

    Args:
        overrides: the pipeline's ``key=value`` overrides.
        sections: the pipeline schema's top-level sections (a key under one of them is its own).

    Raises:
        rlinf_embodied.config.ConfigError: naming the ``rl.overrides=[...]`` spelling.
    """
    from rlinf_embodied.config import JobConfig

    rl_only = {f.name for f in dataclasses.fields(JobConfig)} - set(sections)  # the RL stage's
    for item in overrides:
        head = item.partition("=")[0].strip().split(".")[0]
        if "=" in item and head in rl_only:
            raise ConfigError(f"{item} sets the RL stage's job config, which an SFT pipeline "
                              f"takes through rl.overrides: pass 'rl.overrides=[\"{item}\"]' "
                              "(it adds to the pipeline's own).")


def rl_configs_of(policy_type: str) -> list[str]:
    """Names of the shipped RL fine-tuning configs (``configs/*finetune*.yaml``) whose
    ``policy.type`` is ``policy_type``, for error messages."""
    from rlinf_embodied.configs import ROOT

    return sorted(p.stem for p in Path(ROOT).glob("*finetune*.yaml")
                  if rl_config_policy_type(p) == policy_type)


def rl_config_policy_type(rl_config: str | Path) -> Optional[str]:
    """``policy.type`` of an RL job YAML (a path or a shipped config's name) read without
    validating it, or None when it cannot be read or names none."""
    from omegaconf import DictConfig

    from rlinf_embodied.config.loading import peek_top_level

    raw = peek_top_level(rl_config)
    policy = raw.get("policy") if raw is not None else None
    return policy.get("type") if isinstance(policy, DictConfig) else None


def check_rl_config_found(cfg: "SFTJobConfig") -> None:
    """``rl.config`` names a file or a shipped config (the loader's did-you-mean ranks every
    config by spelling, so it may suggest another family's).

    Raises:
        ConfigError: naming the shipped RL configs of the pipeline's family.
    """
    from rlinf_embodied.config.loading import shipped_config

    if Path(cfg.rl.config).is_file() or shipped_config(cfg.rl.config) is not None:
        return
    raise ConfigError(
        f"rl.config {cfg.rl.config} is neither a file nor a shipped config; the shipped RL "
        f"configs of {cfg.policy.type}: "
        f"{', '.join(rl_configs_of(cfg.policy.type)) or 'none (write one: docs/sft.md)'}.")


def check_rl_family(cfg: "SFTJobConfig", rl_type: Optional[str]) -> None:
    """The RL stage must train the SFT stage's family: ``rl_type`` (the RL config's
    ``policy.type``; None: unknown, nothing checked) equals ``cfg.policy.type``.

    Raises:
        ConfigError: naming both types and the shipped RL configs of the SFT's family.
    """
    if rl_type is None or rl_type == cfg.policy.type:
        return
    raise ConfigError(
        f"policy.type is {cfg.policy.type!r} in the SFT config but {rl_type!r} in the RL config "
        f"{cfg.rl.config}: RL would start from an SFT checkpoint of another family; set "
        f"rl.config to an RL config of {cfg.policy.type} ("
        f"{', '.join(rl_configs_of(cfg.policy.type)) or 'none shipped'}).")


def override_value(value) -> str:
    """``value`` as an override writes it (``true``, ``null``, ``[1,2]``)."""
    import json

    return json.dumps(value, separators=(",", ":")) if isinstance(value, (bool, list, type(None))) else str(value)


def note_policy_fields_not_in_rl(cfg: "SFTJobConfig", file_cfg: "SFTJobConfig",
                                 overrides: list, rl_job_config) -> None:
    """Say on stderr which ``policy.*`` overrides of the pipeline stop at the SFT stage: a
    field the RL stage takes from ``rl.config`` (``train_expert_only``, ``critic``, ``dtype``
    ...) keeps that config's value, where the sampling fields and the fields RL must share with
    SFT reach it. ``rl_job_config(cfg)`` builds the RL stage's job
    (:func:`rlinf_embodied.sft.pipeline.rl_job_config`)."""
    import sys

    from rlinf_embodied.config.overrides import override_key

    named = {override_key(o).partition(".")[2] for o in overrides
             if o.lstrip("+").startswith("policy.")}
    changed = [f.name for f in dataclasses.fields(cfg.policy)
               if f.name in named or getattr(cfg.policy, f.name) != getattr(file_cfg.policy, f.name, None)]
    if not changed:
        return
    try:
        job = rl_job_config(cfg)
    except (ConfigError, OSError):  # validate_rl_stage words the RL stage's own errors
        return
    for name in changed:
        ours, theirs = getattr(cfg.policy, name), getattr(job.policy, name, None)
        if hasattr(job.policy, name) and ours != theirs:
            print(f"note: policy.{name}={override_value(ours)} applies to the SFT stage only; the RL stage "
                  f"keeps {cfg.rl.config}'s policy.{name}={override_value(theirs)} (pass "
                  f"'rl.overrides=[\"policy.{name}={override_value(ours)}\"]' to set it there too).",
                  file=sys.stderr)
