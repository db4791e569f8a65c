"""Typed configuration: one dataclass per component, YAML files plus Hydra-style overrides.

Every job is a YAML file whose top level matches :class:`JobConfig`. Sections that come in
variants (``env``, ``policy``) carry a ``type`` key that selects the dataclass registered for it in
:mod:`rlinf_embodied.components` (or ``package.module:Class`` for a user's own component); each
variant subclasses the section's base class (:class:`EnvConfig`, :class:`PolicyConfig`) and lives
beside its implementation (``envs/configuration_*.py``, ``policies/configuration_*.py``).

Parsing is strict: an unknown key is a :class:`ConfigError` naming the key and the closest valid
one, a value of the wrong type names key, expected type and value, a missing file names the path.
Overrides use the dotted ``key=value`` syntax users know from Hydra
(``env.num_envs=16 algorithm.gamma=0.9``); values are parsed as YAML scalars.

Nothing past the CLI sees a dict: :func:`load_config` returns dataclass instances.
"""

from __future__ import annotations

import collections.abc
import dataclasses
import difflib
import itertools
import os
import typing
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional

from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import ConfigKeyError, OmegaConfBaseException, ValidationError

from rlinf_embodied.elastic.config import ElasticConfig

__all__ = [
    "ConfigError",
    "ConfigWarning",
    "check_registered_env_id",
    "peek_top_level",
    "config_class",
    "config_types",
    "shipped_config",
    "suggest",
    "load_config",
    "to_yaml",
    "save_config",
    "RunConfig",
    "ClusterConfig",
    "EnvConfig",
    "PolicyConfig",
    "AlgorithmConfig",
    "TrainerConfig",
    "EvalConfig",
    "LoggingConfig",
    "JobConfig",
]


class ConfigError(ValueError):
    """A configuration file or override is invalid; the message says what and how to fix it."""


class ConfigWarning(UserWarning):
    """A valid configuration with a setting that likely does not do what was meant (the
    message says why and what to change); the CLI prints it as one ``warning:`` line."""


# --------------------------------------------------------------------------------------------
# Variants (``type`` keys) are registered in rlinf_embodied/components.py
# --------------------------------------------------------------------------------------------
def config_class(section: str, type_name: str) -> type:
    """The config dataclass of variant ``type_name`` of ``section`` (``env`` / ``policy``).

    Raises:
        ConfigError: for an unknown type, listing the valid ones.
    """
    from rlinf_embodied import components

    return components.config_class(section, type_name)


def config_types(section: str) -> List[str]:
    """Names of the registered variants of ``section`` (e.g. ``config_types("env")``)."""
    from rlinf_embodied import components

    return components.type_names(section)


def suggest(word: str, candidates) -> str:
    """The " Did you mean ...?" hint for the closest of ``candidates``, or an empty string."""
    close = difflib.get_close_matches(str(word), list(candidates), n=1, cutoff=0.5)
    return f". Did you mean {close[0]!r}?" if close else ""


# --------------------------------------------------------------------------------------------
# Sections
# --------------------------------------------------------------------------------------------
@dataclass
class RunConfig:
    """Where and how a run is recorded."""

    name: str = "run"
    """Run name; the run directory is ``{output_dir}/{name}`` unless ``dir`` is set."""
    output_dir: str = "runs"
    """Parent directory of run directories (relative to the working directory)."""
    dir: Optional[str] = None
    """Explicit run directory; overrides ``output_dir``/``name``."""
    seed: int = 0
    """Global seed: torch, numpy and env seeds of every worker derive from it."""

    def run_dir(self) -> Path:
        """The run directory as a path (not created)."""
        return Path(self.dir) if self.dir else Path(self.output_dir) / self.name

    def __post_init__(self):
        if not self.name or self.name in (".", "..") or "/" in self.name or "\\" in self.name:
            raise ConfigError(
                f"run.name must be one directory name without '/' or '..' (got {self.name!r}); "
                f"the run directory is run.output_dir/run.name. Set run.dir for another place."
            )
        if not 0 <= self.seed < 1000:
            raise ConfigError(
                f"run.seed must be in [0, 1000) (got {self.seed}): env seeds are derived as "
                f"run.seed * 10**6 + ..., which keeps training and evaluation seeds disjoint."
            )


@dataclass
class ClusterConfig:
    """The Ray cluster the runtime uses."""

    address: Optional[str] = None
    """Ray address to attach to (``auto`` or ``host:port``); None starts an embedded local Ray."""
    num_cpus: Optional[int] = None
    """CPUs for the embedded Ray; None uses the machine's CPU count."""
    num_cpu_devices: int = 1
    """Device slots per GPU-less node, so placement behaves the same on a laptop as on GPUs."""

    def __post_init__(self):
        if self.num_cpus is not None and self.num_cpus < 1:
            raise ConfigError(f"cluster.num_cpus must be >= 1 or null (got {self.num_cpus}).")
        if self.num_cpu_devices < 1:
            raise ConfigError(f"cluster.num_cpu_devices must be >= 1 (got {self.num_cpu_devices}).")


@dataclass
class EnvConfig:
    """Common fields of every environment variant (select one with ``type``)."""

    type: str = "maniskill"
    """Adapter: ``maniskill``, ``libero`` or ``gym`` (``rlinf-embodied envs list``)."""
    num_envs: int = 8
    """N, parallel environments per env worker group (split across its ranks)."""
    max_episode_steps: Optional[int] = None
    """Truncate episodes after this many env steps; None keeps the env's own limit."""
    ignore_terminations: bool = False
    """Run fixed-length episodes (GRPO and fair evaluation): terminations do not end them."""
    ignore_terminations_fraction: float = 0.0
    """Fraction of each env worker's envs (its first ``round(f * N)``) that run fixed-length
    episodes while the others end at termination; 0 keeps ``ignore_terminations`` for all.
    Training on a mix shows the policy what follows a success (which the fixed-length
    evaluation scores with ``success_at_end``) while most episodes still end at success; with
    ``algorithm.bootstrap_terminations`` both kinds estimate the same values. Measured on
    PushCube: docs/results.md."""
    success_hold_steps: int = 1
    """A termination that comes with ``success`` ends the episode only once ``success`` has
    held for this many consecutive steps (1: at the first success, the env's own rule). More
    than 1 trains on what follows a success (the policy must keep the object at the goal),
    which the fixed-length evaluation scores with ``success_at_end``; terminations without
    success still end the episode at once. Any env that reports ``success`` (ManiSkill,
    LIBERO, gymnasium). Training only: evaluation runs fixed-length; refused with
    ``ignore_terminations=true``, where it does nothing. Measured on PushCube:
    docs/results.md."""
    success_hold_ramp: Optional[List[int]] = None
    """``[a, b]``, training iterations as the log numbers them (from 1), a < b: the hold is 1
    up to iteration a (episodes end at their first success, which learns fastest),
    ``success_hold_steps`` from iteration b on, and grows linearly (rounded) in between
    (:meth:`hold_steps_at`; logged as ``rollout/success_hold_steps``). None: the full hold
    from the start. Needs ``success_hold_steps`` above 1. Measured on PushCube:
    docs/results.md."""
    seed: Optional[int] = None
    """Base seed of env resets; None derives it from ``run.seed``."""
    num_processes: int = 1
    """Subprocesses of the env pool per env worker (CPU simulators); 0 runs in-process."""
    step_timeout_s: float = 60.0
    """Seconds a pool worker may take for one step of its envs; past it the worker is killed and
    restarted and its envs' episodes end as truncated with ``info["env_error"]``."""
    reset_timeout_s: float = 120.0
    """Seconds a pool worker may take to reset its envs (LIBERO hard resets take 0.5-5 s each on
    a CPU core); a failed reset is retried once on a restarted worker, then raises."""
    startup_timeout_s: float = 300.0
    """Seconds a pool worker may take to build its envs (LIBERO: 3-12 s per env)."""
    start_method: str = "forkserver"
    """Pool start method, ``forkserver`` or ``spawn`` (``fork`` deadlocks ManiSkill workers)."""
    threads_per_process: int = 1
    """torch intra-op threads in each pool worker (1 = one core per env process)."""
    autoreset_mode: str = "next_step"
    """When finished envs restart: ``next_step`` (gymnasium >= 1.0 default: the next step resets
    them), ``same_step`` (reset within the finishing step, final obs in ``info["final_obs"]``) or
    ``disabled`` (the caller resets them; evaluation)."""
    video: bool = False
    """Write one MP4 per episode (off in training, on in evaluation); needs image observations."""
    video_dir: str = "videos"
    """Directory of the episode videos (the runner points it into the run directory)."""

    def check_available(self) -> None:
        """Checks that import the simulator (``train`` and ``config show`` run them before
        anything starts; field checks stay in ``__post_init__``, which loads no simulator).

        Raises:
            ConfigError: naming the problem and the fix.
        """

    def hold_steps_at(self, iteration: int) -> int:
        """The success hold (``success_hold_steps`` under ``success_hold_ramp``) of the
        rollout of training iteration ``iteration`` (0-based, as the runner counts; the log's
        iteration ``iteration + 1``)."""
        if self.success_hold_ramp is None:
            return self.success_hold_steps
        a, b = self.success_hold_ramp
        i = iteration + 1
        if i <= a:
            return 1
        if i >= b:
            return self.success_hold_steps
        return 1 + int(round((self.success_hold_steps - 1) * (i - a) / (b - a)))

    def num_fixed_length(self, n: int) -> int:
        """How many of a batch of ``n`` envs run fixed-length episodes under
        ``ignore_terminations_fraction`` (the first ``round(f * n)``; ``envs.vector`` masks them,
        :meth:`JobConfig.check_fixed_length_envs` refuses a fraction that gives 0)."""
        return int(round(self.ignore_terminations_fraction * n))

    def __post_init__(self):
        if self.num_envs < 1:
            raise ConfigError(f"env.num_envs must be >= 1 (got {self.num_envs}).")
        if not 0.0 <= self.ignore_terminations_fraction <= 1.0:
            raise ConfigError(
                f"env.ignore_terminations_fraction must be in [0, 1] "
                f"(got {self.ignore_terminations_fraction})."
            )
        if self.success_hold_steps < 1:
            raise ConfigError(
                f"env.success_hold_steps must be >= 1 (got {self.success_hold_steps}); 1 ends an "
                f"episode at its first success."
            )
        if self.success_hold_ramp is not None:
            ramp = list(self.success_hold_ramp)
            if len(ramp) != 2 or not 1 <= ramp[0] < ramp[1]:
                raise ConfigError(
                    f"env.success_hold_ramp must be [a, b] with 1 <= a < b, training iterations "
                    f"as the log numbers them (got {ramp}); null applies env.success_hold_steps "
                    f"from the start."
                )
            if self.success_hold_steps < 2:
                raise ConfigError(
                    f"env.success_hold_ramp={ramp} ramps the hold up to env.success_hold_steps, "
                    f"which is {self.success_hold_steps}; set env.success_hold_steps above 1 or "
                    f"the ramp to null."
                )
        if self.num_processes < 0:
            raise ConfigError(f"env.num_processes must be >= 0 (got {self.num_processes}).")
        if self.autoreset_mode not in ("next_step", "same_step", "disabled"):
            raise ConfigError(
                f"env.autoreset_mode must be next_step, same_step or disabled "
                f"(got {self.autoreset_mode!r})."
            )
        if self.start_method not in ("forkserver", "spawn"):
            raise ConfigError(
                f"env.start_method must be forkserver or spawn (got {self.start_method!r}); "
                f"fork deadlocks ManiSkill workers."
            )
        for key in ("step_timeout_s", "reset_timeout_s", "startup_timeout_s"):
            if not getattr(self, key) > 0:
                raise ConfigError(f"env.{key} must be > 0 seconds (got {getattr(self, key)}).")
        if self.threads_per_process < 1:
            raise ConfigError(
                f"env.threads_per_process must be >= 1 (got {self.threads_per_process})."
            )
        if self.seed is not None and not 0 <= self.seed < 10**9:
            raise ConfigError(
                f"env.seed must be in [0, 10**9) or null (got {self.seed}): evaluation uses "
                f"seeds from eval.seed_offset (>= 10**9) up."
            )
        if self.max_episode_steps is not None and self.max_episode_steps < 1:
            raise ConfigError(
                f"env.max_episode_steps must be >= 1 or null (got {self.max_episode_steps})."
            )


@dataclass
class PolicyConfig:
    """Common fields of every policy variant (select one with ``type``)."""

    type: str = "mlp"
    """``mlp``, ``cnn``, ``openvla``, ``openvla_oft`` (see policies/)."""
    checkpoint: Optional[str] = None
    """Directory to load weights from; None initialises from config."""
    action_chunk: int = 1
    """K, actions per query executed open loop."""
    logprob_granularity: str = "action"
    """Log-probs per ``token`` (N, K, A), ``action`` (N, K) or ``chunk`` (N,)."""

    def __post_init__(self):
        if self.action_chunk < 1:
            raise ConfigError(f"policy.action_chunk must be >= 1 (got {self.action_chunk}).")
        if self.logprob_granularity not in ("token", "action", "chunk"):
            raise ConfigError(
                f"policy.logprob_granularity must be token, action or chunk "
                f"(got {self.logprob_granularity!r})."
            )


@dataclass
class AlgorithmConfig:
    """RL algorithm: advantage estimator and losses (names from the algorithm registry).

    The loss hyperparameters keep the keyword names of
    :func:`rlinf_embodied.algorithms.losses.ppo_loss`.
    """

    advantage: str = "gae"
    """``gae``, ``grpo`` or ``reinforce_pp``."""
    loss: str = "ppo"
    """Policy loss name (``ppo``; critic-free methods use it without values)."""
    gamma: float = 0.8
    """Discount (ManiSkill PPO baseline: 0.8)."""
    gae_lambda: float = 0.9
    """GAE lambda (ManiSkill PPO baseline: 0.9)."""
    clip_ratio_low: float = 0.2
    """PPO clip epsilon below 1 (Schulman et al. 2017: 0.2)."""
    clip_ratio_high: float = 0.2
    """Clip-higher (DAPO / SimpleVLA-RL use 0.28)."""
    dual_clip: Optional[float] = None
    """Dual-clip constant c > 1 for negative advantages; None disables."""
    ratio_level: Optional[str] = None
    """Importance ratio per ``token``, ``action`` or ``chunk``; None uses
    ``policy.logprob_granularity`` (must not be finer than it)."""
    value_clip: Optional[float] = None
    """Clip the value update to +-this around the rollout-time value; None disables."""
    entropy_coef: float = 0.0
    """Weight of the entropy bonus (ManiSkill PPO baseline: 0)."""
    value_coef: float = 0.5
    """Weight of the value loss (CleanRL: 0.5)."""
    kl_coef: float = 0.0
    """Coefficient of the KL penalty to the reference policy (losses take ``ref_logprobs``);
    training jobs keep no reference policy, so :func:`~rlinf_embodied.runners.setup.validate_job`
    requires 0."""
    target_kl: Optional[float] = None
    """Stop the update epochs early when the approximate KL exceeds this."""
    normalize_advantages: bool = True
    """Normalise advantages per minibatch (GAE); GRPO/REINFORCE++ already normalise."""
    bootstrap_terminations: bool = False
    """GAE bootstraps from the final observation's value on terminations too (treats them as
    truncations). ManiSkill's PPO baselines do this: their tasks terminate on success, and with
    a short horizon (gamma 0.8) a terminal success is otherwise worth less than hovering next
    to the goal, so the policy learns to avoid succeeding."""
    log_std_anneal_to: Optional[float] = None
    """Cap the Gaussian policy's log-std (each action dim) by a ceiling lowered linearly from
    ``policy.init_log_std`` to this value over ``trainer.iterations``: after the update of
    iteration i (0-based) every log-std above ``init + (to - init) * (i + 1) / iterations`` is
    set to it (a projection; below the ceiling the log-std is learned as before). Exploration
    then shrinks on a schedule instead of by the policy gradient alone, which on PushCube
    barely moves it (docs/results.md). None: no cap."""
    group_size: int = 1
    """G, rollouts per initial state (GRPO)."""
    grpo_std_normalize: bool = True
    """Divide group-centred scores by the group's standard deviation (off = Dr. GRPO)."""
    filter_low: Optional[float] = None
    """GRPO dynamic sampling: drop groups whose success rate is below this; None = 0."""
    filter_high: Optional[float] = None
    """GRPO dynamic sampling: drop groups whose success rate is outside [low, high]."""

    def __post_init__(self):
        if self.clip_ratio_low < 0 or self.clip_ratio_high < 0:
            raise ConfigError(
                "algorithm.clip_ratio_low and clip_ratio_high must be >= 0 "
                f"(got {self.clip_ratio_low} and {self.clip_ratio_high})."
            )
        if self.dual_clip is not None and self.dual_clip <= 1.0:
            raise ConfigError(
                f"algorithm.dual_clip must be > 1 (got {self.dual_clip}); use 3.0 or null."
            )
        for key in ("gamma", "gae_lambda"):
            if not 0.0 <= getattr(self, key) <= 1.0:
                raise ConfigError(f"algorithm.{key} must be in [0, 1] (got {getattr(self, key)}).")
        for key in ("entropy_coef", "value_coef", "clip_ratio_low", "clip_ratio_high"):
            if not 0 <= getattr(self, key) < float("inf"):
                raise ConfigError(f"algorithm.{key} must be a number >= 0 (got {getattr(self, key)}).")
        if self.kl_coef < 0:
            raise ConfigError(f"algorithm.kl_coef must be >= 0 (got {self.kl_coef}).")
        if self.target_kl is not None and self.target_kl <= 0:
            raise ConfigError(f"algorithm.target_kl must be > 0 or null (got {self.target_kl}).")
        if self.value_clip is not None and self.value_clip <= 0:
            raise ConfigError(f"algorithm.value_clip must be > 0 or null (got {self.value_clip}).")
        for key in ("filter_low", "filter_high"):
            v = getattr(self, key)
            if v is not None and not 0.0 <= v <= 1.0:
                raise ConfigError(f"algorithm.{key} must be in [0, 1] or null (got {v}).")
        if self.ratio_level not in (None, "token", "action", "chunk"):
            raise ConfigError(
                f"algorithm.ratio_level must be token, action, chunk or null "
                f"(got {self.ratio_level!r})."
            )
        if self.group_size < 1:
            raise ConfigError(f"algorithm.group_size must be >= 1 (got {self.group_size}).")
        low = 0.0 if self.filter_low is None else self.filter_low
        high = 1.0 if self.filter_high is None else self.filter_high
        if low > high:
            raise ConfigError(
                f"algorithm.filter_low ({self.filter_low}) must be <= algorithm.filter_high "
                f"({self.filter_high})."
            )


@dataclass
class TrainerConfig:
    """The training loop."""

    iterations: int = 100
    """Training iterations (one rollout and one update each); ``linear`` / ``cosine``
    ``lr_schedule`` and ``algorithm.log_std_anneal_to`` anneal over all of them."""
    rollout_steps: int = 50
    """T, env steps (policy queries) per env per iteration."""
    update_epochs: int = 4
    """Passes over each iteration's rollout (PPO epochs)."""
    num_minibatches: int = 4
    """Minibatches per epoch: the iteration's ``env.num_envs x rollout_steps`` samples split
    evenly, so ``update_epochs x num_minibatches`` optimizer steps per iteration."""
    micro_batch_size: Optional[int] = None
    """Gradient accumulation micro-batch; None = whole minibatch."""
    lr: float = 3e-4
    """Adam learning rate of the policy (and of the critic unless ``critic_lr`` is set)."""
    lr_schedule: str = "constant"
    """``constant``, ``linear`` or ``cosine``."""
    max_grad_norm: float = 0.5
    """Gradient-norm clip of each optimizer step."""
    critic_lr: Optional[float] = None
    """Learning rate of the critic's parameters (value head, critic trunk); None uses
    ``lr``. Fine-tuning a policy with a small action std needs a small ``lr`` (one Adam step
    moves every weight by about ``lr``, and the KL of a mean shift grows as (shift / std)^2)
    while the critic still has to fit the RL returns."""
    critic_warmup_iterations: int = 0
    """The first this many iterations update only the critic (value head / critic trunk); the
    policy is frozen, so that fine-tuning a pretrained policy (SFT -> RL) computes its first
    advantages with a critic fitted to the RL returns instead of an untrained one."""
    pipeline_stages: int = 1
    """Env micro-batches pipelined against generation (paper section 3.3)."""
    join_forwards: bool = False
    """Rollout workers answer greedy and value-only requests that arrive together with one
    forward. Fewer, larger forwards, but a joined float32 forward differs from separate ones in
    the last bits and what arrives together depends on timing: runs stop being bitwise
    reproducible. Sampling requests are always answered alone under their own seed."""
    eval_every: int = 10
    """Evaluate (``eval.num_episodes`` held-out episodes) every this many iterations and at
    the end; 0 never evaluates (and the run has no ``best`` checkpoint)."""
    save_every: int = 10
    """Checkpoint every this many iterations and at the end; 0 saves only on Ctrl-C."""
    keep_checkpoints: int = 3
    """Periodic ``checkpoints/iter_*`` kept: after each save the older ones are deleted
    (``best`` is never); 0 keeps all."""
    offload: bool = False
    """FSDP CPU offload of parameters, gradients and optimizer state."""
    max_time_s: Optional[float] = None
    """Stop (and checkpoint) after this wall time."""
    target_success: Optional[float] = None
    """Stop once a periodic evaluation's ``success_once`` reaches this (the task is solved);
    the final checkpoint, evaluation and videos are then of that policy. None trains on."""

    def __post_init__(self):
        for key in ("iterations", "rollout_steps", "update_epochs", "num_minibatches",
                    "pipeline_stages"):
            if getattr(self, key) < 1:
                raise ConfigError(f"Set trainer.{key} to at least 1 (got {getattr(self, key)}).")
        if self.micro_batch_size is not None and self.micro_batch_size < 1:
            raise ConfigError(
                f"trainer.micro_batch_size must be >= 1 or null (got {self.micro_batch_size})."
            )
        if not self.lr > 0 or self.lr != self.lr or self.lr == float("inf"):
            raise ConfigError(f"trainer.lr must be a positive number (got {self.lr}).")
        if not self.max_grad_norm > 0:
            raise ConfigError(f"trainer.max_grad_norm must be > 0 (got {self.max_grad_norm}).")
        if self.critic_lr is not None and not 0 < self.critic_lr < float("inf"):
            raise ConfigError(f"trainer.critic_lr must be a positive number or null (got {self.critic_lr}).")
        if not 0 <= self.critic_warmup_iterations < self.iterations:
            raise ConfigError(
                f"trainer.critic_warmup_iterations must be in [0, trainer.iterations) (got "
                f"{self.critic_warmup_iterations} with {self.iterations} iterations)."
            )
        if self.lr_schedule not in ("constant", "linear", "cosine"):
            raise ConfigError(
                f"trainer.lr_schedule must be constant, linear or cosine (got {self.lr_schedule!r})."
            )
        for key in ("eval_every", "save_every"):
            if getattr(self, key) < 0:
                raise ConfigError(f"trainer.{key} must be >= 0, 0 = never (got {getattr(self, key)}).")
        if self.keep_checkpoints < 0:
            raise ConfigError(f"trainer.keep_checkpoints must be >= 0, 0 = keep all "
                              f"(got {self.keep_checkpoints}).")
        if self.max_time_s is not None and not self.max_time_s > 0:
            raise ConfigError(f"trainer.max_time_s must be > 0 or null (got {self.max_time_s}).")
        if self.target_success is not None and not 0.0 <= self.target_success <= 1.0:
            raise ConfigError(
                f"trainer.target_success must be in [0, 1] or null (got {self.target_success})."
            )


@dataclass
class EvalConfig:
    """Evaluation during training and from the CLI."""

    num_episodes: int = 16
    """Episodes of each evaluation (split across the env ranks)."""
    seed_offset: int = 2_000_000_000
    """Eval env seeds are ``seed_offset + run.seed * 1000 + i``; training resets use seeds
    below 10**9 (``run.seed * 10**6 + ...``), so the two never overlap. Below 2**32 - 10**6."""
    num_videos: int = 2
    """Episodes recorded as video at the final evaluation (needs image observations)."""
    greedy: bool = True
    """Evaluate the distribution's mode (True) or sample actions like the rollout (False)."""

    def __post_init__(self):
        if self.num_episodes < 1:
            raise ConfigError(f"eval.num_episodes must be >= 1 (got {self.num_episodes}).")
        if self.num_videos < 0:
            raise ConfigError(f"eval.num_videos must be >= 0 (got {self.num_videos}).")
        if not 10**9 <= self.seed_offset < 2**32 - 10**6:
            raise ConfigError(
                f"eval.seed_offset must be in [10**9, 2**32 - 10**6) (got {self.seed_offset}): "
                f"below, eval seeds could meet training seeds; above, they overflow uint32."
            )


@dataclass
class LoggingConfig:
    """Metrics and progress output."""

    tensorboard: bool = True
    """Write TensorBoard logs to ``<run dir>/tensorboard/``."""
    wandb: bool = False
    """Also log to Weights & Biases (needs the ``wandb`` package)."""
    wandb_project: str = "rlinf-embodied"
    """W&B project name, with ``wandb: true``."""
    console: bool = True
    """Print one progress line per logged iteration (``metrics.jsonl`` is written either way)."""


CRITIC_FREE_ADVANTAGES = ("grpo", "reinforce_pp")
"""Built-in advantage estimators that ignore the critic's values
(``rlinf_embodied.algorithms.advantages``)."""


@dataclass
class JobConfig:
    """A whole job: the top level of every YAML in ``configs/``."""

    run: RunConfig = field(default_factory=RunConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    placement: str = "collocated"
    """Name of a file in ``configs/placement/`` (``collocated``, ``disaggregated``, ``hybrid``),
    a path to a placement YAML, or ``auto`` (profile and plan)."""
    env: EnvConfig = field(default_factory=lambda: config_class("env", "maniskill")())
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    elastic: ElasticConfig = field(default_factory=ElasticConfig)
    """Elastic, preemptible rollout workers (rlinf_embodied/elastic/config.py)."""

    def __post_init__(self):
        self.check_fixed_length_envs()
        self._warn_unused_critic_settings()
        ramp, last = self.env.success_hold_ramp, self.trainer.iterations
        if ramp is not None and ramp[0] >= last:
            warnings.warn(
                f"env.success_hold_ramp={list(ramp)} starts after the run's last iteration "
                f"(trainer.iterations={last}): every episode ends at its first success (hold "
                f"1); fine for a short trial run, env.success_hold_ramp=null "
                f"env.success_hold_steps=1 says so without this warning.",
                ConfigWarning, stacklevel=2)
        elif ramp is not None and ramp[1] > last:
            warnings.warn(
                f"env.success_hold_ramp={list(ramp)} ends after the run's last iteration "
                f"(trainer.iterations={last}): the hold reaches only "
                f"{self.env.hold_steps_at(last - 1)} of env.success_hold_steps="
                f"{self.env.success_hold_steps}; end the ramp by iteration {last}.",
                ConfigWarning, stacklevel=2)
        if self.trainer.critic_warmup_iterations > 0 and getattr(self.policy, "critic", None) is False:
            raise ConfigError(
                "trainer.critic_warmup_iterations > 0 needs a critic to warm up; set "
                "policy.critic=true or trainer.critic_warmup_iterations=0."
            )
        to = self.algorithm.log_std_anneal_to
        if to is not None:
            init = getattr(self.policy, "init_log_std", None)
            if init is None:
                raise ConfigError(
                    f"algorithm.log_std_anneal_to needs a Gaussian policy with policy.init_log_std "
                    f"({type(self.policy).__name__} has none); set it to null."
                )
            if not to <= init:
                raise ConfigError(
                    f"algorithm.log_std_anneal_to={to} must be <= policy.init_log_std={init} "
                    f"(the ceiling starts there and only goes down)."
                )
        if self.trainer.critic_lr is not None and getattr(self.policy, "critic", None) is False:
            raise ConfigError(
                f"trainer.critic_lr={self.trainer.critic_lr} sets the learning rate of a critic "
                "this policy does not have (policy.critic=false); set trainer.critic_lr=null or "
                "policy.critic=true."
            )

    def _warn_unused_critic_settings(self) -> None:
        """Warn when critic settings cannot change the policy: the critic-free estimators
        (:data:`CRITIC_FREE_ADVANTAGES`) never read the critic's values, yet a policy with
        ``critic: true`` (e.g. loading an SFT checkpoint's critic) still fits its value loss.
        A warning, not an error: the run is valid, the setting only changes the critic's
        weights in the checkpoints (``trainer.critic_lr``) or freezes the policy for the
        warm-up iterations (``trainer.critic_warmup_iterations``)."""
        adv = self.algorithm.advantage
        if adv not in CRITIC_FREE_ADVANTAGES or getattr(self.policy, "critic", None) is not True:
            return
        t = self.trainer
        if t.critic_lr is not None:
            warnings.warn(
                f"trainer.critic_lr={t.critic_lr} only changes how the critic is fitted: "
                f"algorithm.advantage={adv} does not use its values, so the policy's updates do "
                f"not depend on it; drop it or use algorithm.advantage=gae.", ConfigWarning, stacklevel=2)
        if t.critic_warmup_iterations > 0:
            warnings.warn(
                f"trainer.critic_warmup_iterations={t.critic_warmup_iterations} freezes the "
                f"policy to fit a critic that algorithm.advantage={adv} does not use; set it to 0 "
                f"or use algorithm.advantage=gae.", ConfigWarning, stacklevel=2)

    def check_fixed_length_envs(self, env_ranks: Optional[int] = None) -> None:
        """``env.ignore_terminations_fraction`` and ``env.success_hold_steps`` checks, here
        rather than in :class:`EnvConfig`:
        the workers copy the env section with another ``num_envs`` (one env worker's share) or
        ``ignore_terminations=true`` (in-training evaluation), which must stay valid.

        Each env worker's batch of n envs fixes its first ``int(round(f * n))``
        (``rlinf_embodied.envs.vector``): n is ``env.num_envs / (env ranks x
        trainer.pipeline_stages)`` (elastic: the shard size). Loading a config runs this with
        ``env_ranks=None``: the placement's env ranks are unknown, so n is bounded by one env
        rank's share (a fraction that rounds to 0 envs there does so on every env worker);
        callers that know the env ranks pass them for the exact check.

        Args:
            env_ranks: ranks of the env worker group, or None when unknown.

        Raises:
            ConfigError: both ``ignore_terminations`` and a fraction (or a
                ``success_hold_steps`` above 1) are set, a hold above 1 with a fraction of 1
                or longer than ``max_episode_steps``, or the fraction makes no env
                fixed-length.
        """
        e = self.env
        # The fix that works with either setting: the hold and its ramp go together (a ramp
        # needs a hold above 1).
        no_hold = "env.success_hold_steps=1" + (
            " env.success_hold_ramp=null" if e.success_hold_ramp is not None else "")
        if e.success_hold_steps > 1 and e.ignore_terminations:
            raise ConfigError(
                f"env.success_hold_steps={e.success_hold_steps} does nothing with "
                f"env.ignore_terminations=true (episodes never end at success); set "
                f"env.ignore_terminations=false, or {no_hold}."
            )
        if e.success_hold_steps > 1 and e.ignore_terminations_fraction >= 1.0:
            raise ConfigError(
                f"env.success_hold_steps={e.success_hold_steps} does nothing with "
                f"env.ignore_terminations_fraction=1.0 (every env is fixed-length); lower the "
                f"fraction, or set {no_hold}."
            )
        if e.max_episode_steps is not None and e.success_hold_steps > e.max_episode_steps:
            raise ConfigError(
                f"env.success_hold_steps={e.success_hold_steps} is longer than an episode "
                f"(env.max_episode_steps={e.max_episode_steps}), so no episode could end at "
                f"success; use at most env.success_hold_steps={e.max_episode_steps}, or "
                f"env.ignore_terminations=true with {no_hold}."
            )
        f = e.ignore_terminations_fraction
        if f <= 0:
            return
        if e.ignore_terminations:
            raise ConfigError(
                "env.ignore_terminations=true already makes every env fixed-length; drop "
                "env.ignore_terminations_fraction or set env.ignore_terminations=false."
            )
        if self.elastic.enabled:
            shards = self.elastic.num_shards_for(e.num_envs)
            if shards is None:
                return  # the shard size does not divide: the elastic pool refuses it itself
            n = e.num_envs // shards
            per, key, scale = f"the {n} envs of each elastic shard", "elastic.shard_envs", 1
        else:
            ranks, stages = env_ranks or 1, max(1, self.trainer.pipeline_stages)
            scale = ranks * stages
            n = e.num_envs // scale
            per = (f"the {'at most ' if env_ranks is None else ''}{n} envs each env worker "
                   f"steps per pipeline stage (env.num_envs / (env ranks x "
                   f"trainer.pipeline_stages) = {e.num_envs} / ({ranks} x {stages}))")
            key = "env.num_envs"
        if n >= 1 and e.num_fixed_length(n) == 0:
            need = next(k for k in itertools.count(n + 1) if e.num_fixed_length(k) >= 1)
            raise ConfigError(
                f"env.ignore_terminations_fraction={f} fixes round({f} x {n}) = 0 of {per}, so "
                f"it does nothing; raise it above {0.5 / n:.3g}, raise {key} to at least "
                f"{need * scale}, or set it to 0."
            )


# Sections whose dataclass is chosen by their ``type`` key.
_POLYMORPHIC = {"env", "policy"}


# --------------------------------------------------------------------------------------------
# Loading
# --------------------------------------------------------------------------------------------
def shipped_config(name: str | os.PathLike) -> Optional[Path]:
    """The shipped job config ``name`` (``maniskill_pushcube_ppo_mlp``, with or without
    ``.yaml`` or a leading ``configs/``), or None; works from an installed wheel too."""
    from rlinf_embodied.configs import ROOT

    p = Path(name)
    if p.parts[:1] == ("configs",):
        p = Path(*p.parts[1:])
    if not p.name:  # "configs" itself, "", "."
        return None
    cand = ROOT / (p if p.suffix in (".yaml", ".yml") else p.with_suffix(".yaml"))
    return cand if cand.is_file() else None


def peek_top_level(path: str | os.PathLike) -> Optional[DictConfig]:
    """The raw top-level mapping of a job file (a path or a shipped config name), unvalidated,
    to tell which schema it needs; None when it is missing, not YAML or not a mapping (the
    strict loader then reports why)."""
    p = Path(path)
    p = p if p.is_file() else shipped_config(p)
    if p is None:
        return None
    try:
        raw = OmegaConf.load(p)
    except Exception:  # noqa: BLE001 - invalid YAML: the strict loader reports it
        return None
    return raw if isinstance(raw, DictConfig) else None


def _read_yaml(path: str | os.PathLike) -> DictConfig:
    p = Path(path)
    if not p.exists() and shipped_config(p) is not None:
        p = shipped_config(p)
    if not p.exists():
        from rlinf_embodied.configs import ROOT

        names = ", ".join(sorted(x.stem for x in ROOT.glob("*.yaml")))
        raise ConfigError(
            f"Config file not found: {p} (absolute: {p.resolve()}). Shipped configs: {names}."
        )
    if p.is_dir():
        raise ConfigError(f"Config path {p} is a directory; pass a YAML file.")
    try:
        cfg = OmegaConf.load(p)
    except Exception as e:  # yaml.YAMLError and friends
        where = getattr(e, "problem_mark", None)
        at = f" (line {where.line + 1}, column {where.column + 1})" if where is not None else ""
        raise ConfigError(f"Config file {p} is not valid YAML: {_one_line(e)}{at}.") from None
    if not isinstance(cfg, DictConfig):
        raise ConfigError(f"Config file {p} must hold a mapping at the top level.")
    if not cfg:
        raise ConfigError(
            f"Config file {p} is empty; start from a shipped job (e.g. "
            f"configs/maniskill_pushcube_ppo_mlp.yaml) and change what you need."
        )
    return cfg


def check_repeated_overrides(overrides: List[str]) -> None:
    """Refuse a command line that sets one key twice (``trainer.lr=1e-3 ... trainer.lr=3e-4``),
    where the last value would silently win. The CLI checks what the user typed; code that
    composes overrides (``sft-rl``'s RL stage) layers them on purpose and is not checked.

    Raises:
        ConfigError: naming the key and both values.
    """
    seen: Dict[str, str] = {}
    for o in overrides:
        try:  # the parser load_config uses: `trainer={lr: 1e-3}` sets trainer.lr
            parsed = OmegaConf.to_container(OmegaConf.from_dotlist([o.lstrip("+")]))
        except Exception:
            continue  # not key=value, or unparsable: _parse_overrides reports it
        for leaf in flatten_dotted(parsed) or [o.split("=", 1)[0].strip().lstrip("+")]:
            # the same key, or a section and a key inside it (`trainer=5 trainer.lr=1e-3`)
            clash = next((k for k in seen if k == leaf or k.startswith(leaf + ".")
                          or leaf.startswith(k + ".")), None)
            if clash is not None:
                raise ConfigError(f"Override key {leaf} is given twice ({seen[clash]} and {o}); "
                                  f"keep one.")
            seen[leaf] = o


def flatten_dotted(d: Dict[str, Any], prefix: str = "") -> Dict[str, Any]:
    """Nested dicts -> ``{"a.b.c": leaf}`` (an empty dict has no leaves)."""
    out: Dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(flatten_dotted(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def _parse_overrides(overrides: List[str]) -> DictConfig:
    for o in overrides:
        if "=" not in o or o.startswith("="):
            raise ConfigError(f"Override {o!r} is not of the form key=value (e.g. env.num_envs=16).")
    for o in overrides:
        try:
            OmegaConf.from_dotlist([o])
        except Exception as e:  # yaml.YAMLError (unclosed quote or bracket), OmegaConf errors
            raise ConfigError(
                f"Cannot parse override {o!r}: {_one_line(e)}. Values are YAML: quote strings "
                f"with special characters (key='a: b') and close brackets (key=[1, 2])."
            ) from None
    try:
        return OmegaConf.from_dotlist(list(overrides))
    except (OmegaConfBaseException, ValueError) as e:  # `a=1 a.b=2`, `a=[1] a.b=2`
        raise ConfigError(f"Cannot apply overrides {overrides}: {_one_line(e)}") from None


def _one_line(e: Exception) -> str:
    """The gist of an exception on one line (YAML's ``problem``, else the first line)."""
    problem = getattr(e, "problem", None)
    if problem:
        return str(problem)
    text = str(e).strip().splitlines()
    return text[0] if text else type(e).__name__


def _schema_for(schema_cls: type, raw: DictConfig | None) -> Any:
    """Structured schema of ``schema_cls`` with polymorphic sections resolved by their type."""
    base = OmegaConf.structured(schema_cls)
    if not dataclasses.is_dataclass(schema_cls):
        return base
    for f in dataclasses.fields(schema_cls):
        if f.name not in _POLYMORPHIC:
            continue
        node = raw.get(f.name) if raw is not None else None
        explicit = isinstance(node, DictConfig) and "type" in node
        type_name = str(node["type"]) if explicit else OmegaConf.select(base, f"{f.name}.type")
        cls = config_class(f.name, type_name)
        OmegaConf.set_struct(base, False)
        base[f.name] = OmegaConf.structured(cls)
        OmegaConf.set_struct(base, True)
    return base


def _open_free_dicts(node: DictConfig) -> None:
    """Let ``Dict[str, Any]`` fields (e.g. ``env.kwargs``) take any key; dataclass sections
    stay strict."""
    for key in list(node.keys()):
        child = node._get_node(key)
        if isinstance(child, DictConfig):
            if child._metadata.object_type in (dict, None):
                OmegaConf.set_struct(child, False)
            else:
                _open_free_dicts(child)


def _free_dict_overrides(schema: DictConfig, overrides: List[str], parsed: DictConfig) -> Dict[str, Any]:
    """The overrides that give a whole ``Dict[str, Any]`` field (``env.kwargs={size: 16}``,
    ``env.image_keys={}``), by dotted key with their value from ``parsed`` (the parsed
    overrides): they replace the field's mapping from the YAML file and the defaults instead of
    merging into it (``env.kwargs.size=16`` still sets one key)."""
    out: Dict[str, Any] = {}
    for o in overrides:
        key = o.lstrip("+").partition("=")[0].strip()
        node = OmegaConf.select(schema, key, default=None, throw_on_missing=False)
        value = OmegaConf.select(parsed, key, default=None)
        if (isinstance(node, DictConfig) and node._metadata.object_type in (dict, None)
                and isinstance(value, DictConfig)):
            out[key] = OmegaConf.to_container(value)
    return out


def _valid_keys(schema: DictConfig, full_key: str) -> List[str]:
    parent = full_key.rsplit(".", 1)[0] if "." in full_key else ""
    node = OmegaConf.select(schema, parent) if parent else schema
    return list(node.keys()) if isinstance(node, DictConfig) else []


def _translate(e: OmegaConfBaseException, schema: DictConfig, source: str) -> ConfigError:
    key = getattr(e, "full_key", None) or ""
    if isinstance(e, ConfigKeyError) and key:
        valid = _valid_keys(schema, key)
        leaf = key.rsplit(".", 1)[-1]
        section = key.rsplit(".", 1)[0] if "." in key else "top level"
        prefix = f"{section}." if "." in key else ""
        hint = suggest(leaf, valid).replace("'", f"'{prefix}", 1) if suggest(leaf, valid) else ""
        name, colon, _ = leaf.partition(":")
        if colon and name in valid:  # {lr:1e-3}: YAML reads one key "lr:1e-3" without the space
            hint = f" (YAML needs a space after the colon: {{{name}: ...}})."
        return ConfigError(
            f"Unknown config key {key!r} in {source}{hint or '.'} Valid keys of {section}: "
            f"{', '.join(sorted(valid))}."
        )
    if isinstance(e, ValidationError) and key:
        expected = _field_type_name(getattr(e, "object_type", None), getattr(e, "key", None))
        value = getattr(e, "value", None)
        if type(value).__name__ == "AnyNode":  # OmegaConf's untyped node: name what it holds
            value = value._value()
        shown = "null" if value is None else repr(value)
        kind = "" if shown == "null" else f" ({_kind(value)})"
        return ConfigError(
            f"Wrong type for config key {key!r} in {source}: expected {expected}, got {shown}{kind}."
        )
    return ConfigError(f"Invalid config in {source}: {_one_line(e)}")


def _field_type_name(cls: Optional[type], key: Optional[str]) -> str:
    """Readable annotation of dataclass field ``key`` of ``cls`` (e.g. ``int``, ``Optional[int]``)."""
    if cls is None or key is None or not dataclasses.is_dataclass(cls):
        return "a value of the field's type"
    try:
        hint = typing.get_type_hints(cls).get(str(key))
    except Exception:  # noqa: BLE001 - unresolvable annotations
        hint = None
    if hint is None:
        return "a value of the field's type"
    return _readable_type(hint)


def _readable_type(hint: Any) -> str:
    """``Optional[List[int]]`` -> ``a list of int, or null``; ``Dict[str, Any]`` -> ``a mapping``."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is typing.Union:
        names = [_readable_type(a) for a in args if a is not type(None)]
        text = " or ".join(names)
        return f"{text}, or null" if type(None) in args else text
    if origin in (list, tuple, collections.abc.Sequence):
        inner = [a for a in args if a is not Ellipsis]
        return f"a list of {_readable_type(inner[0])}" if inner else "a list"
    if origin in (dict, collections.abc.Mapping):
        return "a mapping"
    if hint is Any:
        return "any value"
    if dataclasses.is_dataclass(hint):
        return "a mapping (a config section)"
    return getattr(hint, "__name__", str(hint).replace("typing.", ""))


def load_config(
    path: str | os.PathLike | None = None,
    overrides: Optional[List[str]] = None,
    schema: type = JobConfig,
) -> Any:
    """Load a YAML job file, apply ``key=value`` overrides, validate, return dataclasses.

    Args:
        path: YAML file; None starts from the schema's defaults.
        overrides: dotted overrides, e.g. ``["env.num_envs=16", "trainer.lr=1e-4"]``.
        schema: top-level dataclass (default :class:`JobConfig`).

    Returns:
        An instance of ``schema`` (nested dataclasses, variants resolved by ``type``).

    Raises:
        ConfigError: missing file, invalid YAML, unknown key (with the closest valid key),
            wrong type (with key, expected type and value), unknown variant type, or a
            cross-field check of a section's ``__post_init__``.
    """
    overrides = list(overrides or [])
    raw = _read_yaml(path) if path is not None else OmegaConf.create({})
    ov = _parse_overrides(overrides)
    source = str(path) if path is not None else "defaults"
    if overrides:
        source += f" + overrides {overrides}"
    try:
        merged_raw = OmegaConf.merge(raw, ov)
        structured = _schema_for(schema, merged_raw)
    except (OmegaConfBaseException, TypeError) as e:  # `env: 3` in the file, `env.num_envs=4`
        raise (_container_mismatch(overrides, ov, raw, schema, source)
               or ConfigError(f"Invalid config in {source}: {_one_line(e)}")) from None
    _open_free_dicts(structured)
    try:
        cfg = OmegaConf.merge(structured, merged_raw)
        for key, value in _free_dict_overrides(structured, overrides, ov).items():
            OmegaConf.update(cfg, key, value, merge=False)
        obj = OmegaConf.to_object(cfg)
    except OmegaConfBaseException as e:
        cause = e
        # to_object wraps __post_init__ errors; surface ours unchanged.
        inner = e.__cause__ or e.__context__
        if isinstance(inner, ConfigError):
            raise inner from None
        raise (_container_mismatch(overrides, ov, raw, schema, source)
               or _translate(cause, structured, source)) from None
    except ConfigError:
        raise
    except TypeError as e:  # e.g. a mapping given for a list field
        raise (_container_mismatch(overrides, ov, raw, schema, source)
               or ConfigError(f"Invalid config in {source}: {_one_line(e)}")) from None
    _reject_nan(obj)
    return obj


def _kind(value: Any) -> str:
    """What a config value is, in words: ``mapping``, ``list`` or its Python type name."""
    if isinstance(value, DictConfig):
        return "mapping"
    return "list" if isinstance(value, ListConfig) else type(value).__name__


def _container_mismatch(overrides: List[str], ov: DictConfig, raw: DictConfig, schema: type,
                        source: str) -> Optional[ConfigError]:
    """The "Wrong type" error for the first override whose value is a mapping or a list where
    the field holds something else, which OmegaConf reports only as
    "Cannot merge incompatible container types"; None when no override is such a one."""

    try:
        structured = _schema_for(schema, raw)
    except Exception:  # noqa: BLE001 - the file itself is malformed: nothing to compare with
        return None
    for o in overrides:
        key = o.lstrip("+").partition("=")[0].strip()
        new = OmegaConf.select(ov, key, default=None)
        old = OmegaConf.select(raw, key, default=None)
        if old is None:
            old = OmegaConf.select(structured, key, default=None, throw_on_missing=False)
        if (new is None or old is None or not isinstance(new, (DictConfig, ListConfig))
                or _kind(new) == _kind(old)):
            continue  # a plain value of the wrong type is reported by _translate
        parent, _, leaf = key.rpartition(".")
        node = OmegaConf.select(structured, parent) if parent else structured
        cls = getattr(getattr(node, "_metadata", None), "object_type", None)
        expected = _field_type_name(cls, leaf)
        shown = o.partition("=")[2].strip()
        return ConfigError(f"Wrong type for config key {key!r} in {source}: expected {expected}, "
                           f"got {shown} ({_kind(new)}).")
    return None


def _reject_nan(obj: Any, prefix: str = "") -> None:
    """NaN passes every range check (all comparisons are False): refuse it in any field."""
    for f in dataclasses.fields(obj):
        v = getattr(obj, f.name)
        if dataclasses.is_dataclass(v):
            _reject_nan(v, f"{prefix}{f.name}.")
        elif isinstance(v, float) and v != v:
            raise ConfigError(f"{prefix}{f.name} is NaN; give a number.")


def to_yaml(cfg: Any) -> str:
    """Resolved YAML text of a config dataclass (what ``config show`` prints)."""
    return OmegaConf.to_yaml(OmegaConf.structured(cfg))


def save_config(cfg: Any, run_dir: str | os.PathLike, name: str = "config.yaml") -> Path:
    """Write the resolved config into ``run_dir`` atomically (temp file, then rename; mode
    0644 like the run's other files)."""
    from rlinf_embodied.checkpoint import atomic_write_text

    return atomic_write_text(Path(run_dir) / name, to_yaml(cfg))


def as_dict(cfg: Any) -> Dict[str, Any]:
    """Plain-dict view of a config dataclass (for logging and hashing only)."""
    out = OmegaConf.to_container(OmegaConf.structured(cfg), resolve=True)
    assert isinstance(out, dict)
    return out


_ = ListConfig  # re-exported type for annotations elsewhere


def check_registered_env_id(env_id: str, family: str, registry_hint: str) -> None:
    """Raise if ``env_id`` is not in gymnasium's registry (after the caller imported the
    simulator that registers its envs), suggesting the closest registered ids.

    Raises:
        ConfigError: for an unregistered id.
    """
    import difflib

    import gymnasium as gym

    if env_id in gym.registry:
        return
    close = difflib.get_close_matches(env_id, list(gym.registry), n=3, cutoff=0.6)
    hint = f" Did you mean {', '.join(map(repr, close))}?" if close else ""
    raise ConfigError(f"env.env_id={env_id!r} is not a registered {family} env.{hint} "
                      f"List them with: {registry_hint}")
