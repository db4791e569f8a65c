"""OpenVLA behind the policy contract: autoregressive action tokens from a Prismatic VLM.

OpenVLA (Kim et al. 2024) reads one image and the prompt
``"In: What action should the robot take to {instruction}?\\nOut:"`` and emits A = 7 action
tokens one at a time (K = 1 per query in the paper; K > 1 decodes K x A tokens in a row). Each
token is one of the last 256 vocabulary ids, decoded to a bin centre in [-1, 1] and
un-normalised with the checkpoint's q01/q99 statistics
(:mod:`rlinf_embodied.policies.action_tokenizer`).

``act`` decodes with a KV cache (one prefill, then one token per step); ``evaluate`` scores the
stored tokens with one teacher-forced pass over the same padded sequence. Both give the same
log-probs up to float rounding of the cached vs. uncached attention (about 1e-6 in float32;
tested), and exactly the same tokens.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from rlinf_embodied.policies.base import ActionOutput, Evaluation, SFTLoss, SpaceSpec, check_mode
from rlinf_embodied.policies.prismatic_model import attention_bias, causal_allowed
from rlinf_embodied.policies.vla import VLAPolicyBase

from rlinf_embodied.policies.configuration_openvla import OpenVLAPolicyConfig

__all__ = ["OpenVLAPolicy"]


class OpenVLAPolicy(VLAPolicyBase):
    """OpenVLA with token sampling, token log-probs and an optional value head.

    Observation keys: ``main_images`` (N, H, W, 3) uint8 and ``task_descriptions``.

    Args:
        config: :class:`~rlinf_embodied.policies.configuration_openvla.OpenVLAPolicyConfig`.
        spec: the env's spaces (A must match the checkpoint's statistics).
    """

    config_class = OpenVLAPolicyConfig

    def __init__(self, config: OpenVLAPolicyConfig, spec: SpaceSpec):
        super().__init__(config, spec)

    @property
    def num_action_tokens(self) -> int:
        """K x A tokens decoded per query."""
        return self.action_chunk * self.spec.action_dim

    @torch.no_grad()
    def act(self, obs: Mapping[str, Any], mode: str = "sample") -> ActionOutput:
        """Decode K x A action tokens per env.

        Args:
            obs: ``main_images`` (N, H, W, 3) uint8, ``task_descriptions`` (N strings).
            mode: ``sample`` (temperature ``policy.temperature``) or ``greedy`` (argmax).

        Returns:
            :class:`ActionOutput` with actions (N, K, A) float32 in env units, log-probs at
            the configured granularity, values (N,) or None, and forward_inputs (see
            :mod:`rlinf_embodied.policies.vla`).

        Raises:
            ValueError: unknown mode, missing observation keys, or a prompt longer than
                ``policy.max_prompt_tokens``.
        """
        greedy = check_mode(mode)
        fi = self.encode_obs(obs)
        embeds, valid = self.prefix(fi)
        dtype = embeds.dtype
        pos = self.positions(valid)
        hidden, cache = self.vlm.decode(
            embeds, attention_bias(causal_allowed(valid), dtype), pos, use_cache=True
        )
        h = hidden[:, -1:]
        values = self.values_from(h[:, 0])
        next_pos = pos[:, -1:] + 1
        bins, logps = [], []
        for j in range(self.num_action_tokens):
            logp = self.token_logprobs(h)[:, 0]  # (N, 256)
            b = self.choose(logp, greedy)
            bins.append(b)
            logps.append(logp.gather(-1, b[:, None])[:, 0])
            if j + 1 == self.num_action_tokens:
                break
            valid = torch.cat([valid, torch.ones_like(valid[:, :1])], dim=1)
            tok = self.vlm.embed_tokens(self.tokenizer.bins_to_tokens(b)[:, None])
            h, cache = self.vlm.decode(
                tok, attention_bias(valid[:, None, :], dtype), next_pos + j, cache, use_cache=True
            )
        bins_t = self.reshape_chunk(torch.stack(bins, dim=1))
        logp_t = self.reshape_chunk(torch.stack(logps, dim=1))
        fi["action_samples"] = bins_t
        actions = self.to_env(self.tokenizer.decode_bins(bins_t))
        return ActionOutput(actions, self.to_granularity(logp_t), values, fi)

    def _teacher_forced(self, forward_inputs: Mapping[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """One causal pass over prompt + stored tokens: ((N, K*A) bins, (N, K*A, D) readouts)."""
        bins = self.require_samples(forward_inputs).reshape(-1, self.num_action_tokens)
        embeds, valid = self.prefix(forward_inputs)
        start = embeds.shape[1] - 1  # readout of the first action token: the last prompt token
        fed = self.vlm.embed_tokens(self.tokenizer.bins_to_tokens(bins[:, :-1]))
        embeds = torch.cat([embeds, fed], dim=1)
        valid = torch.cat([valid, torch.ones_like(bins[:, :-1], dtype=torch.bool)], dim=1)
        hidden, _ = self.vlm.decode(
            embeds, attention_bias(causal_allowed(valid), embeds.dtype), self.positions(valid)
        )
        return bins, hidden[:, start : start + self.num_action_tokens]

    def sft_loss(self, forward_inputs: Mapping[str, torch.Tensor]):
        """See :meth:`VLAPolicyBase.sft_loss`: next-token cross-entropy of the action tokens."""
        bins, readout = self._teacher_forced(forward_inputs)
        loss, metrics = self.token_sft_loss(readout, bins)
        return SFTLoss(loss, self.values_from(readout[:, 0].detach()), metrics)

    def evaluate(
        self, forward_inputs: Mapping[str, torch.Tensor], actions: torch.Tensor | None = None
    ) -> Evaluation:
        """Teacher-forced log-probs, entropies and values of the stored action tokens.

        Args:
            forward_inputs: from :meth:`act` (possibly re-batched to B rows).
            actions: unused (tokens come from ``forward_inputs['action_samples']``).

        Returns:
            :class:`Evaluation` with log-probs and entropies at the configured granularity
            (with gradient) and values (B,) or None.

        Raises:
            ValueError: if ``action_samples`` is missing.
        """
        bins, readout = self._teacher_forced(forward_inputs)
        logp, ent = self.score(self.token_logprobs(readout), bins)
        values = self.values_from(readout[:, 0])
        return self.finish(self.reshape_chunk(logp), self.reshape_chunk(ent), values)

    @torch.no_grad()
    def predict_values(self, obs: Mapping[str, Any]) -> torch.Tensor:
        """(N,) values of an observation batch (prefill only).

        Raises:
            NotImplementedError: without ``policy.critic``.
        """
        if self.value_head is None:
            return super().predict_values(obs)
        embeds, valid = self.prefix(self.encode_obs(obs))
        hidden, _ = self.vlm.decode(
            embeds, attention_bias(causal_allowed(valid), embeds.dtype), self.positions(valid)
        )
        return self.values_from(hidden[:, -1])
