"""OpenVLA-OFT behind the policy contract: K x A actions from one parallel forward pass.

OpenVLA-OFT (Kim, Finn, Liang 2025, "Fine-Tuning Vision-Language-Action Models: Optimizing
Speed and Success") keeps OpenVLA's Prismatic VLM and changes decoding. The sequence is::

    <s> | patches(main) | patches(wrist) | proprio | prompt ... ▁ | K*A action slots | </s>

where the action slots carry zero embeddings (the upstream code multiplies their embeddings by
zero) and one pass fills all of them: outputs at the K*A positions *ending* one before the last
slot (the last prompt token, then slots 0..K*A-2, upstream's ``NUM_PATCHES + NUM_PROMPT_TOKENS``
offset) are read out, so the readout for the first action is the last prompt token, as in
OpenVLA. Two heads read them:

* ``discrete``: ``lm_head`` logits over the last 256 vocabulary ids (what RLinf and SimpleVLA-RL
  train with GRPO; log-probs per token);
* ``continuous``: OFT's L1-regression head (an MLP-ResNet on the K x (A * D) readouts, file
  ``action_head--{step}_checkpoint.pt``); for RL a Gaussian with a learnable, state-independent
  log-std around its output gives log-probs.

Attention: the published OFT checkpoints were trained with a transformers fork in which *every*
token attends to every token (openvla-oft issue #27, maintainer's answer); ``attention=full``
reproduces that with a 4-D padding-aware mask, ``attention=action_block`` keeps the prefix causal
and makes only the action slots (and ``</s>``) bidirectional.

Proprio (``states``, 8 dims on LIBERO) is normalised with the checkpoint's q01/q99 proprio
statistics, clipped to [-1, 1] and projected by ``fc1 -> GELU -> fc2`` into one LM token (file
``proprio_projector--{step}_checkpoint.pt``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from rlinf_embodied.policies.action_tokenizer import ActionNormalizer
from rlinf_embodied.policies.base import ActionOutput, Evaluation, SFTLoss, SpaceSpec, check_mode
from rlinf_embodied.policies.prismatic_model import attention_bias, causal_allowed
from rlinf_embodied.policies.vla import VLAPolicyBase, gaussian_logprob_entropy, load_head
from torch import nn

from rlinf_embodied.policies.configuration_openvla import OpenVLAOFTPolicyConfig

__all__ = ["L1RegressionActionHead", "MLPResNet", "OpenVLAOFTPolicy", "ProprioProjector"]


class ProprioProjector(nn.Module):
    """Proprio (N, S) -> one LM token (N, D): ``fc1 -> GELU -> fc2`` (OFT ``ProprioProjector``)."""

    def __init__(self, llm_dim: int, proprio_dim: int):
        super().__init__()
        self.fc1 = nn.Linear(proprio_dim, llm_dim)
        self.fc2 = nn.Linear(llm_dim, llm_dim)

    def forward(self, proprio: torch.Tensor) -> torch.Tensor:
        """(N, S) normalised proprio -> (N, D)."""
        return self.fc2(nn.functional.gelu(self.fc1(proprio.to(self.fc1.weight.dtype))))


class _ResBlock(nn.Module):
    """Pre-norm residual MLP block: ``x + ReLU(Linear(LayerNorm(x)))``."""

    def __init__(self, dim: int):
        super().__init__()
        self.ffn = nn.Sequential(nn.LayerNorm(dim), nn.Linear(dim, dim), nn.ReLU())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.ffn(x)


class MLPResNet(nn.Module):
    """``LN -> fc1 -> ReLU -> blocks -> LN -> fc2`` (parameter names as in OFT's checkpoints)."""

    def __init__(self, num_blocks: int, input_dim: int, hidden_dim: int, output_dim: int):
        super().__init__()
        self.layer_norm1 = nn.LayerNorm(input_dim)
        self.fc1 = nn.Linear(input_dim, hidden_dim)
        self.mlp_resnet_blocks = nn.ModuleList(_ResBlock(hidden_dim) for _ in range(num_blocks))
        self.layer_norm2 = nn.LayerNorm(hidden_dim)
        self.fc2 = nn.Linear(hidden_dim, output_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.fc1(self.layer_norm1(x)))
        for block in self.mlp_resnet_blocks:
            x = block(x)
        return self.fc2(self.layer_norm2(x))


class L1RegressionActionHead(nn.Module):
    """OFT's continuous head: per action, the A readouts' hidden states -> A normalised values.

    Args:
        llm_dim: D (the head's hidden width equals D upstream: 4096 for the 7B model).
        action_dim: A.
    """

    def __init__(self, llm_dim: int, action_dim: int):
        super().__init__()
        self.action_dim = action_dim
        self.model = MLPResNet(2, llm_dim * action_dim, llm_dim, action_dim)

    def forward(self, readout: torch.Tensor, chunk: int) -> torch.Tensor:
        """(N, K*A, D) -> (N, K, A) float32 normalised actions."""
        x = readout.reshape(readout.shape[0], chunk, -1).to(self.model.fc1.weight.dtype)
        return self.model(x).float()


class OpenVLAOFTPolicy(VLAPolicyBase):
    """OpenVLA-OFT with parallel decoding, action chunks, wrist image and proprio.

    Observation keys: ``main_images``, ``task_descriptions``; ``wrist_images`` if
    ``policy.use_wrist_image``; ``states`` (N, proprio_dim) if ``policy.use_proprio``.

    Args:
        config: :class:`~rlinf_embodied.policies.configuration_openvla.OpenVLAOFTPolicyConfig`.
        spec: the env's spaces.

    Raises:
        ValueError: the env lacks an input the config asks for, or its state width differs
            from ``policy.proprio_dim``.
        FileNotFoundError: a pretrained directory lacks a head file the config needs.
    """

    config_class = OpenVLAOFTPolicyConfig

    def __init__(self, config: OpenVLAOFTPolicyConfig, spec: SpaceSpec):
        if config.use_proprio and spec.state_dim != config.proprio_dim:
            raise ValueError(
                f"policy.use_proprio needs states of width policy.proprio_dim={config.proprio_dim} "
                f"but the env gives S={spec.state_dim}; set policy.proprio_dim or use_proprio=false."
            )
        if config.use_wrist_image and spec.wrist_image_shape is None:
            raise ValueError(
                "policy.use_wrist_image is true but the env has no wrist camera; set "
                "policy.use_wrist_image=false."
            )
        super().__init__(config, spec, proprio_dim=config.proprio_dim if config.use_proprio else None)
        d, a = self.vlm.llm_dim, spec.action_dim
        dtype = next(self.vlm.parameters()).dtype
        self.proprio_projector = ProprioProjector(d, config.proprio_dim).to(dtype) if config.use_proprio else None
        self.proprio_norm = None
        if config.use_proprio:
            if "proprio" not in self.dataset_stats:
                raise ValueError(
                    f"policy.use_proprio is true but the statistics of {self.unnorm_key!r} have no "
                    f"'proprio' entry (have {sorted(self.dataset_stats)}); raw proprio would be fed "
                    "unnormalised. Use a checkpoint with proprio statistics or set "
                    "policy.use_proprio=false."
                )
            self.proprio_norm = ActionNormalizer.from_stats(self.dataset_stats["proprio"])
            if self.proprio_norm.dim != config.proprio_dim:
                raise ValueError(
                    f"The proprio statistics of {self.unnorm_key!r} have {self.proprio_norm.dim} "
                    f"dims but policy.proprio_dim={config.proprio_dim}; set policy.proprio_dim."
                )
        continuous = config.action_head == "continuous"
        self.head_type = "l1_regression" if continuous else "parallel_tokens"
        self.action_head = L1RegressionActionHead(d, a).to(dtype) if continuous else None
        self.action_log_std = (
            nn.Parameter(torch.full((a,), float(config.init_log_std))) if continuous else None
        )
        if config.pretrained:
            if self.proprio_projector is not None:
                load_head(config.pretrained, "proprio_projector", self.proprio_projector)
            if self.action_head is not None:
                load_head(config.pretrained, "action_head", self.action_head)

    @property
    def num_action_tokens(self) -> int:
        """K x A action slots per query."""
        return self.action_chunk * self.spec.action_dim

    def extra_heads(self) -> dict[str, nn.Module]:
        heads = {"proprio_projector": self.proprio_projector, "action_head": self.action_head}
        return {**{k: v for k, v in heads.items() if v is not None}, **super().extra_heads()}

    # ------------------------------------------------------------------ the parallel pass
    def _allowed(self, valid: torch.Tensor, block_start: int) -> torch.Tensor:
        """(N, L, L) attention pattern (see the module docstring)."""
        if self.config.attention == "full":
            return valid[:, None, :].expand(-1, valid.shape[1], -1)
        allowed = causal_allowed(valid)
        idx = torch.arange(valid.shape[1], device=valid.device)
        block = (idx[:, None] >= block_start) & (idx[None, :] >= block_start)
        return allowed | block[None]

    def _readout(self, fi: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """One forward pass; (N, K*A, D) hidden states at the action readout positions."""
        extra = None
        if self.proprio_projector is not None:
            extra = self.proprio_projector(self.proprio_norm.normalize(fi["states"]))[:, None]
        prefix, valid = self.prefix(fi, extra)
        n, l0, d = prefix.shape
        slots = torch.zeros(n, self.num_action_tokens, d, dtype=prefix.dtype, device=prefix.device)
        stop = self.vlm.embed_tokens(torch.full((n, 1), self.prompts.eos_id, device=prefix.device))
        embeds = torch.cat([prefix, slots, stop], dim=1)
        valid = torch.cat([valid, torch.ones(n, self.num_action_tokens + 1, dtype=torch.bool,
                                             device=valid.device)], dim=1)
        mask = attention_bias(self._allowed(valid, l0), embeds.dtype)
        hidden, _ = self.vlm.decode(embeds, mask, self.positions(valid))
        return hidden[:, l0 - 1 : l0 - 1 + self.num_action_tokens]

    def log_std_parameters(self) -> list[nn.Parameter]:
        """See :meth:`Policy.log_std_parameters`: the continuous head's (A,) log-std; [] with
        parallel action tokens."""
        return [] if self.action_log_std is None else [self.action_log_std]

    def _gaussian(self, readout: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        mean = self.action_head(readout, self.action_chunk)  # (N, K, A)
        return mean, self.action_log_std.float().expand_as(mean)

    @property
    def continuous_actions(self) -> bool:
        """True with the continuous (L1-regression) head."""
        return self.action_head is not None

    def set_dataset_statistics(self, norm_stats, unnorm_key: str) -> None:
        """See :meth:`VLAPolicyBase.set_dataset_statistics`; also the proprio statistics.

        Raises:
            ValueError: ``policy.use_proprio`` and the statistics have no matching ``proprio``.
        """
        super().set_dataset_statistics(norm_stats, unnorm_key)
        if self.proprio_projector is not None:
            if "proprio" not in self.dataset_stats:
                raise ValueError(f"Statistics {unnorm_key!r} have no 'proprio' entry but "
                                 "policy.use_proprio is true.")
            self.proprio_norm = ActionNormalizer.from_stats(self.dataset_stats["proprio"])

    def sft_loss(self, forward_inputs: Mapping[str, torch.Tensor]):
        """See :meth:`VLAPolicyBase.sft_loss`: cross-entropy of every action token (discrete
        head) or OFT's L1 regression of the normalised chunk (continuous head), one pass."""
        samples = self.require_samples(forward_inputs)
        readout = self._readout(forward_inputs)
        values = self.values_from(readout[:, 0].detach())
        if self.action_head is None:
            loss, metrics = self.token_sft_loss(readout, samples.reshape(samples.shape[0], -1))
            return SFTLoss(loss, values, metrics)
        mean = self.action_head(readout, self.action_chunk)
        loss = (mean - samples.float()).abs().mean()
        return SFTLoss(loss, values, {"l1": float(loss.detach())})

    # ------------------------------------------------------------------ contract
    @torch.no_grad()
    def act(self, obs: Mapping[str, Any], mode: str = "sample") -> ActionOutput:
        """A chunk of K actions per env from one forward pass.

        Args:
            obs: ``main_images`` (N, H, W, 3) uint8, ``task_descriptions``, and per config
                ``wrist_images`` (N, H', W', 3) uint8 and ``states`` (N, S) float32.
            mode: ``sample`` or ``greedy`` (argmax tokens / Gaussian mean).

        Returns:
            :class:`ActionOutput`: actions (N, K, A) float32 env units, log-probs at the
            configured granularity, values (N,) or None, forward_inputs.

        Raises:
            ValueError: unknown mode or missing observation keys.
        """
        greedy = check_mode(mode)
        fi = self.encode_obs(obs, wrist=self.config.use_wrist_image, states=self.config.use_proprio)
        readout = self._readout(fi)
        if self.action_head is None:
            logp = self.token_logprobs(readout)
            bins = self.choose(logp, greedy)
            lp, _ = self.score(logp, bins)
            fi["action_samples"] = self.reshape_chunk(bins)
            normalized = self.tokenizer.decode_bins(fi["action_samples"])
            lp = self.reshape_chunk(lp)
        else:
            mean, log_std = self._gaussian(readout)
            x = mean if greedy else mean + torch.randn_like(mean) * log_std.exp()
            lp, _ = gaussian_logprob_entropy(x, mean, log_std)
            fi["action_samples"] = x
            normalized = x
        values = self.values_from(readout[:, 0])
        return ActionOutput(self.to_env(normalized), self.to_granularity(lp), values, fi)

    def evaluate(
        self, forward_inputs: Mapping[str, torch.Tensor], actions: torch.Tensor | None = None
    ) -> Evaluation:
        """Log-probs, entropies and values of the stored samples, with gradient.

        Args:
            forward_inputs: from :meth:`act` (possibly re-batched to B rows).
            actions: unused (samples come from ``forward_inputs['action_samples']``).

        Returns:
            :class:`Evaluation` at the configured granularity; identical to the rollout's
            log-probs for unchanged weights (same single forward pass).

        Raises:
            ValueError: if ``action_samples`` is missing.
        """
        samples = self.require_samples(forward_inputs)
        readout = self._readout(forward_inputs)
        if self.action_head is None:
            flat = samples.reshape(samples.shape[0], -1)
            lp, ent = self.score(self.token_logprobs(readout), flat)
            lp, ent = self.reshape_chunk(lp), self.reshape_chunk(ent)
        else:
            mean, log_std = self._gaussian(readout)
            lp, ent = gaussian_logprob_entropy(samples.float(), mean, log_std)
        return self.finish(lp, ent, self.values_from(readout[:, 0]))

    @torch.no_grad()
    def predict_values(self, obs: Mapping[str, Any]) -> torch.Tensor:
        """(N,) values of an observation batch.

        Raises:
            NotImplementedError: without ``policy.critic``.
        """
        if self.value_head is None:
            return super().predict_values(obs)
        fi = self.encode_obs(obs, wrist=self.config.use_wrist_image, states=self.config.use_proprio)
        return self.values_from(self._readout(fi)[:, 0])
