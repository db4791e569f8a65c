"""The whole job: :class:`JobConfig`, the top level of every YAML in ``configs/``.

It holds one instance of each section (:mod:`rlinf_embodied.config.sections`, the variant of
``env`` / ``policy`` chosen by ``type`` through :mod:`rlinf_embodied.config.components`, and
:class:`~rlinf_embodied.config.elastic.ElasticConfig`) and runs the checks that span sections
(fixed-length env fractions, success holds, critic settings), raising
:class:`~rlinf_embodied.config.errors.ConfigError` or warning with
:class:`~rlinf_embodied.config.errors.ConfigWarning`.
"""

from __future__ import annotations

import itertools
import warnings
from dataclasses import dataclass, field
from typing import Optional

from rlinf_embodied.config.components import config_class
from rlinf_embodied.config.elastic import ElasticConfig
from rlinf_embodied.config.errors import ConfigError, ConfigWarning
from rlinf_embodied.config.sections import (
    AlgorithmConfig,
    ClusterConfig,
    EnvConfig,
    EvalConfig,
    LoggingConfig,
    PolicyConfig,
    RunConfig,
    TrainerConfig,
)

__all__ = ["CRITIC_FREE_ADVANTAGES", "JobConfig", "RESUME_SAFE_KEYS"]

CRITIC_FREE_ADVANTAGES = ("grpo", "reinforce_pp")
"""Built-in advantage estimators that ignore the critic's values
(``rlinf_embodied.algorithms.advantages``)."""

RESUME_SAFE_KEYS = ("trainer.iterations", "trainer.max_time_s", "trainer.eval_every",
                    "trainer.save_every", "trainer.keep_checkpoints", "trainer.max_restarts",
                    "trainer.restart_wait_s", "logging.", "eval.num_videos")
"""Dotted config keys (prefixes) that may change when a run is resumed (``train --resume``,
``finetune --resume``) without changing what the uninterrupted run would have done."""


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
    """Elastic, preemptible rollout workers (rlinf_embodied/config/elastic.py)."""

    def __post_init__(self):
        self.check_fixed_length_envs()
        self._check_whole_episodes()
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

    def _check_whole_episodes(self) -> None:
        """GRPO over fixed-length episodes (``env.ignore_terminations``) compares each group's
        episode returns, so every env's rollout must be exactly one episode:
        ``trainer.rollout_steps`` x ``policy.action_chunk`` = ``env.max_episode_steps``
        (shorter, the return is cut; longer, a second, cut episode is added to it).

        Raises:
            ConfigError: the rollout is not one whole episode (the message names the setting).
        """
        e, t = self.env, self.trainer
        steps = getattr(e, "max_episode_steps", None)
        if self.algorithm.advantage != "grpo" or not getattr(e, "ignore_terminations", False) \
                or steps is None:
            return
        k = getattr(self.policy, "action_chunk", None) or 1
        if t.rollout_steps * k == steps:
            return
        fix = (f"set trainer.rollout_steps={steps // k}" if steps % k == 0 else
               f"set env.max_episode_steps to a multiple of {k} (e.g. {-(-steps // k) * k}, "
               f"with trainer.rollout_steps={-(-steps // k)})")
        raise ConfigError(
            f"trainer.rollout_steps={t.rollout_steps} x policy.action_chunk={k} = "
            f"{t.rollout_steps * k} env steps per rollout, but env.max_episode_steps={steps} with "
            f"env.ignore_terminations: GRPO compares the returns of whole episodes; {fix}.")

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

