"""Shared actor-critic machinery of the ``mlp`` and ``cnn`` policies.

``encoder (forward_inputs -> features (N, F)) -> trunk(s) -> action head + value head``.
Subclasses only supply the encoder and the observation keys it reads.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping
from typing import Any

import torch
from rlinf_embodied.policies.base import (
    ActionOutput,
    Evaluation,
    Policy,
    SpaceSpec,
    check_mode,
)
from rlinf_embodied.policies.heads import layer_init, make_action_head, make_mlp
from rlinf_embodied.policies.normalization import ObsNormalizer
from torch import nn

from rlinf_embodied.policies.configuration_actor_critic import ActorCriticPolicyConfig

__all__ = ["ACTION_SAMPLES", "ActorCriticPolicy"]

ACTION_SAMPLES = "action_samples"
"""``forward_inputs`` key of the head's own samples (pre-clip/pre-squash, or indices)."""


class ActorCriticPolicy(Policy):
    """Encoder, actor trunk + action head, optional critic trunk + value head.

    With ``config.shared_critic`` the value head sits on the actor trunk; otherwise the critic
    has its own trunk of the same widths on the same encoder features. Without
    ``config.critic`` there is no value head and ``values`` is None. With
    ``config.normalize_obs`` the ``states`` input (N, S) passes through a running
    :class:`~rlinf_embodied.policies.normalization.ObsNormalizer` (``obs_norm``) before the
    encoder.
    """

    config_class = ActorCriticPolicyConfig

    def __init__(
        self, config: ActorCriticPolicyConfig, spec: SpaceSpec, encoder: nn.Module, feature_dim: int
    ):
        super().__init__(config, spec)
        self.obs_norm = (ObsNormalizer(spec.state_dim)
                         if config.normalize_obs and spec.state_dim > 0 else None)
        self.encoder = encoder
        self.actor_trunk, out_dim = make_mlp(feature_dim, config.hidden_sizes, config.activation)
        self.action_head = make_action_head(out_dim, spec, config)
        self.critic_trunk: nn.Module | None = None
        self.value_head: nn.Module | None = None
        if config.critic:
            if not config.shared_critic:
                self.critic_trunk, _ = make_mlp(feature_dim, config.hidden_sizes, config.activation)
            self.value_head = layer_init(nn.Linear(out_dim, 1), gain=1.0)

    def critic_parameters(self) -> list[nn.Parameter]:
        """See :meth:`Policy.critic_parameters`: the value head's, plus the critic trunk's
        unless ``config.shared_critic`` (then the trunk is the actor's)."""
        return [p for m in (self.critic_trunk, self.value_head) if m is not None
                for p in m.parameters()]

    def log_std_parameters(self) -> list[nn.Parameter]:
        """See :meth:`Policy.log_std_parameters`: the Gaussian head's (K * A,) log-std; []
        with a categorical head."""
        log_std = getattr(self.action_head, "log_std", None)
        return [log_std] if isinstance(log_std, nn.Parameter) else []

    @abc.abstractmethod
    def inputs_from_obs(self, obs: Mapping[str, Any]) -> dict[str, torch.Tensor]:
        """The observation tensors the encoder reads, on the policy's device.

        Raises:
            ValueError: if the observation lacks a key or has the wrong shape.
        """

    def _features(
        self, inputs: Mapping[str, torch.Tensor]
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        if self.obs_norm is not None and "states" in inputs:
            inputs = {**inputs, "states": self.obs_norm(inputs["states"])}
        enc = self.encoder(inputs)
        actor = self.actor_trunk(enc)
        if self.value_head is None:
            return actor, None
        critic = actor if self.critic_trunk is None else self.critic_trunk(enc)
        return actor, self.value_head(critic).squeeze(-1)

    @torch.no_grad()
    def act(self, obs: Mapping[str, Any], mode: str = "sample") -> ActionOutput:
        """See :meth:`Policy.act`. ``forward_inputs`` holds the encoder inputs and
        ``action_samples`` (N, K, A)."""
        greedy = check_mode(mode)
        inputs = self.inputs_from_obs(obs)
        features, values = self._features(inputs)
        actions, samples, logp = self.action_head.sample(features, greedy)
        inputs[ACTION_SAMPLES] = samples
        return ActionOutput(actions, self.to_granularity(logp), values, inputs)

    def evaluate(
        self, forward_inputs: Mapping[str, torch.Tensor], actions: torch.Tensor | None = None
    ) -> Evaluation:
        """See :meth:`Policy.evaluate`.

        Raises:
            ValueError: if neither ``forward_inputs["action_samples"]`` nor ``actions`` is given.
        """
        features, values = self._features(forward_inputs)
        samples = forward_inputs.get(ACTION_SAMPLES)
        if samples is None:
            if actions is None:
                raise ValueError(
                    "evaluate needs forward_inputs['action_samples'] (kept by act) or the "
                    "env-unit actions; pass the rollout's actions."
                )
            samples = self.action_head.samples_from_actions(actions.to(features.device))
        logp, entropy = self.action_head.log_prob(features, samples)
        return Evaluation(self.to_granularity(logp), self.to_granularity(entropy), values)

    def update_obs_stats(self, forward_inputs: Mapping[str, torch.Tensor],
                         valid: torch.Tensor | None = None) -> None:
        """See :meth:`Policy.update_obs_stats`: merges ``forward_inputs["states"]`` (B, S)
        (the rows where ``valid``) into ``obs_norm``."""
        if self.obs_norm is None or "states" not in forward_inputs:
            return
        states = forward_inputs["states"]
        if valid is not None:
            states = states[valid.to(states.device).bool()]
        self.obs_norm.update(states)

    @torch.no_grad()
    def predict_values(self, obs: Mapping[str, Any]) -> torch.Tensor:
        """See :meth:`Policy.predict_values`."""
        if self.value_head is None:
            return super().predict_values(obs)
        return self._features(self.inputs_from_obs(obs))[1]
