"""The sections of a job: one dataclass per top-level key of a job YAML except ``elastic``.

:class:`RunConfig` (``run:``), :class:`ClusterConfig` (``cluster:``), :class:`EnvConfig` and
:class:`PolicyConfig` (``env:``, ``policy:``: the common fields of every variant; a variant
subclasses them beside its implementation and is selected by ``type``), :class:`AlgorithmConfig`
(``algorithm:``), :class:`TrainerConfig` (``trainer:``), :class:`EvalConfig` (``eval:``) and
:class:`LoggingConfig` (``logging:``). Each checks its own fields in ``__post_init__``; checks
that span sections live on :class:`~rlinf_embodied.config.job.JobConfig`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional

from rlinf_embodied.config.errors import ConfigError

__all__ = [
    "AlgorithmConfig",
    "ClusterConfig",
    "EnvConfig",
    "EvalConfig",
    "LoggingConfig",
    "PolicyConfig",
    "RunConfig",
    "TrainerConfig",
]


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
        if self.address is not None and self.address != "auto":
            host, _, port = self.address.removeprefix("ray://").rpartition(":")
            if not (host and port.isdigit()):  # Ray's own error: "Invalid address format"
                raise ConfigError(
                    f"cluster.address {self.address!r} is not auto, HOST:PORT or ray://HOST:PORT "
                    "(e.g. cluster.address=10.0.0.1:6379, the port of the head's `ray start "
                    "--head --port`); leave it null for a Ray of this process.")
            if not 1 <= int(port) <= 65535:
                raise ConfigError(
                    f"cluster.address {self.address!r}: port {int(port)} is outside 1-65535; "
                    "give the port of the head's `ray start --head --port` (default 6379).")


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
    max_step_failures: int = 3
    """Failed steps of one pool worker in a row (no successful step between) after which the
    run stops with an error naming the env: its env fails persistently, and every failed step
    ends its envs' episodes as truncated, so training would go on from episodes cut short by
    the error. 1 stops at the first failure; a larger value rides out a flaky simulator."""
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
        if self.max_step_failures < 1:
            raise ConfigError(f"env.max_step_failures must be >= 1 (got {self.max_step_failures}); "
                              "1 stops the run at an env worker's first failed step.")
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
    """``mlp``, ``cnn``, ``openvla``, ``openvla_oft``, ``pi0``, ``pi05`` (see policies/)."""
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
        if self.advantage == "grpo" and self.group_size < 2:
            raise ConfigError(
                f"algorithm.group_size={self.group_size} with GRPO: a group of one rollout has "
                f"advantage 0 (its score minus its own mean); set algorithm.group_size=2 or more "
                f"(and env.num_envs a multiple of it)."
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
    """Wall-time budget in seconds, from the start (or resume) of the run: the run stops (and
    checkpoints, and evaluates when ``eval_every`` > 0) after the iteration past which another
    would end beyond it, the next predicted to take as long as the last one, plus the last
    in-training evaluation's time when one is due first. The final evaluation comes after."""
    max_restarts: int = 3
    """Restarts after a rank of the placed groups (env, rollout, actor) or its node is lost:
    the groups start again on the reserved capacity left (or coming back) and the run goes on
    from the newest complete checkpoint, running the iterations since it again; the next loss
    stops the run with the resume command. 0 stops at the first loss (like Ray Train's
    ``FailureConfig(max_failures)`` and torchrun's ``--max-restarts``)."""
    restart_wait_s: float = 300.0
    """Seconds a restart waits for the reserved devices the placement had (a lost node coming
    back); then it goes on with the devices left if the placement still fits them, else it
    stops with the resume command."""
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
        if self.max_restarts < 0 or not self.restart_wait_s >= 0:
            raise ConfigError(f"trainer.max_restarts and trainer.restart_wait_s must be >= 0 "
                              f"(got {self.max_restarts} and {self.restart_wait_s}).")
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
    batch_invariant: bool = True
    """Rollout workers answer evaluation queries row by row (one forward per env, sampled rows
    seeded per trial and query), so each trial's result does not depend on num_episodes, the
    number of env ranks or its batch neighbours, and equals ``rlinf-embodied eval --policy RUN
    --run-trials`` of the same checkpoint. False: one batched forward per query (faster for
    VLAs; results then depend on the batch in the last bits)."""

    def trial_seed(self, run_seed: int, trial: int = 0) -> int:
        """Reset seed of trial ``trial`` of every in-training evaluation of a run with
        ``run.seed`` ``run_seed``: ``seed_offset + run_seed * 1000 + trial`` (trial j is env
        ``j - rank * n`` of env rank ``rank``, each rank running n = num_episodes / ranks)."""
        return self.seed_offset + int(run_seed) * 1000 + int(trial)

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
