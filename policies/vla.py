"""What OpenVLA and OpenVLA-OFT policies share: building/loading the VLM, observation encoding,
action token sampling and scoring, un-normalisation, LoRA and the value head.

``forward_inputs`` of both VLA policies (leading dim N; what the training loop stores):

* ``input_ids`` (N, 1 + T) int64 and ``text_valid`` (N, 1 + T) bool: the padded prompt
  (:class:`~rlinf_embodied.policies.prismatic_tokenizer.PromptTokenizer`);
* ``main_images`` (N, H, W, 3) uint8 and, for OFT with a wrist camera, ``wrist_images``: raw
  images, re-preprocessed deterministically in ``evaluate`` (4x smaller than pixel values);
* ``states`` (N, S) float32 (OFT with proprio);
* ``action_samples``: (N, K, A) int64 action-token bin indices, or float32 normalised
  pre-clip Gaussian samples for OFT's continuous head.

Log-probs of action tokens are over the 256-id action slice of the vocabulary only (logits of
the other ids are dropped before the softmax, as in RLinf / SimpleVLA-RL), at temperature
``policy.temperature`` in both ``act`` and ``evaluate``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from rlinf_embodied.policies.action_tokenizer import (
    ActionNormalizer,
    ActionTokenizer,
    GripperConvention,
    select_norm_stats,
)
from rlinf_embodied.policies.base import Evaluation, Policy, SFTLoss, SpaceSpec, obs_tensor
from rlinf_embodied.policies.prismatic_checkpoint import (
    identity_norm_stats,
    image_preprocessor,
    load_prismatic,
    save_prismatic,
)
from rlinf_embodied.policies.prismatic_config import (
    PrismaticArchConfig,
    openvla_7b_arch_dict,
    select_device_dtype,
    tiny_arch_dict,
)
from rlinf_embodied.policies.prismatic_model import PrismaticVLM
from rlinf_embodied.policies.prismatic_tokenizer import PromptTokenizer, tiny_tokenizer
from rlinf_embodied.policies.prismatic_training import (
    apply_lora,
    enable_gradient_checkpointing,
    merged_state_dict,
)
from rlinf_embodied.policies.value_head import ValueHead
from torch import nn

from rlinf_embodied.policies.configuration_openvla import VLAPolicyConfig

__all__ = ["VLAPolicyBase", "load_head"]


class VLAPolicyBase(Policy):
    """Base of the OpenVLA policies; subclasses implement ``act`` and ``evaluate``.

    Attributes:
        head_type: how actions are decoded (``autoregressive_tokens``, ``parallel_tokens`` or
            ``l1_regression``), recorded in results headers by :meth:`execution`.
        unnorm_key: the dataset whose statistics un-normalise actions.

    Args:
        config: a :class:`~rlinf_embodied.policies.configuration_openvla.VLAPolicyConfig` subclass.
        spec: the env's spaces; its action dim must equal the statistics' (7 for LIBERO).
        proprio_dim: S of the proprio statistics to create for a random ``preset`` (OFT).

    Raises:
        ValueError: the checkpoint's statistics do not match ``spec`` (names the fix).
    """

    head_type = "autoregressive_tokens"

    def critic_parameters(self) -> list[nn.Parameter]:
        """See :meth:`Policy.critic_parameters`: the value head's (the LoRA backbone under it
        is shared with the actor)."""
        return [] if self.value_head is None else list(self.value_head.parameters())

    def fsdp_units(self) -> list[nn.Module]:
        """One FSDP2 unit per Llama decoder layer and ViT block (see prismatic_training.fsdp_block_classes)."""
        from rlinf_embodied.policies.prismatic_training import fsdp_block_classes

        classes = fsdp_block_classes()
        return [m for m in self.modules() if isinstance(m, classes)]

    def __init__(self, config: VLAPolicyConfig, spec: SpaceSpec, proprio_dim: int | None = None):
        super().__init__(config, spec)
        if spec.discrete:
            raise ValueError("VLA policies emit continuous actions; the env has a Discrete space.")
        _, dtype = select_device_dtype(None, config.dtype)
        if config.pretrained:
            vlm, norm_stats = load_prismatic(config.pretrained, torch.device("cpu"), dtype,
                                             config.attn_implementation)
            tok = PromptTokenizer.from_pretrained(config.pretrained, config.max_prompt_tokens)
        else:
            arch_d = (tiny_arch_dict(**config.tiny.arch_kwargs()) if config.preset == "tiny"
                      else openvla_7b_arch_dict())
            arch = PrismaticArchConfig.from_dict(arch_d, source=f"preset {config.preset}")
            vlm = PrismaticVLM(arch, config.attn_implementation).to(dtype)
            norm_stats = identity_norm_stats(spec.action_dim, proprio_dim)
            if config.preset != "tiny":
                raise ValueError(
                    "policy.preset=openvla-7b has no tokenizer without weights; set "
                    "policy.pretrained to a checkpoint directory."
                )
            tok = PromptTokenizer(tiny_tokenizer(arch.base_vocab_size, config.tiny.words),
                                  config.max_prompt_tokens)
        self.vlm = vlm
        self.prompts = tok
        self.norm_stats = norm_stats
        self.dataset_stats = select_norm_stats(norm_stats, config.unnorm_key)
        self.unnorm_key = config.unnorm_key or next(iter(norm_stats))
        self.action_norm = ActionNormalizer.from_stats(self.dataset_stats["action"])
        if self.action_norm.dim != spec.action_dim:
            raise ValueError(
                f"The checkpoint's action statistics have {self.action_norm.dim} dims but the env "
                f"has A={spec.action_dim}; pick policy.unnorm_key for this env's dataset."
            )
        self.tokenizer = ActionTokenizer(vlm.arch.base_vocab_size, vlm.arch.n_action_bins)
        self.gripper = GripperConvention(
            to_signed=config.gripper_to_signed, binarize=config.gripper_binarize,
            invert=config.gripper_invert,
        )
        mode = config.image_preprocessing
        if mode == "auto":
            mode = "upstream" if config.pretrained else "fast"
        self.images = image_preprocessor(vlm, config.center_crop, mode, config.pretrained)
        self.value_head = ValueHead(vlm.llm_dim, config.value_head_hidden) if config.critic else None
        if self.value_head is not None and config.pretrained:
            # a value head fitted during SFT travels with the checkpoint like OFT's heads
            load_head(config.pretrained, "value_head", self.value_head, required=False)
        if config.lora_rank > 0:
            alpha = config.lora_alpha if config.lora_alpha is not None else min(config.lora_rank, 16)
            apply_lora(vlm, config.lora_rank, alpha, config.lora_dropout, config.lora_targets)
        if config.gradient_checkpointing:
            enable_gradient_checkpointing(vlm)

    # ------------------------------------------------------------------ observation encoding
    def encode_obs(self, obs: Mapping[str, Any], wrist: bool = False, states: bool = False) -> dict[str, torch.Tensor]:
        """The stored part of ``forward_inputs`` for an observation batch.

        Raises:
            ValueError: a required key is missing or ``task_descriptions`` has the wrong length.
        """
        dev = self.device
        fi: dict[str, torch.Tensor] = {}
        fi["main_images"] = obs_tensor(obs, "main_images", dev, torch.uint8, self.config.type)
        n = fi["main_images"].shape[0]
        texts = obs.get("task_descriptions")
        if texts is None or len(texts) != n:
            raise ValueError(
                f"The {self.config.type} policy needs obs['task_descriptions'] with {n} strings "
                f"(got {None if texts is None else len(texts)})."
            )
        fi["input_ids"], fi["text_valid"] = self.prompts(list(texts), dev)
        if wrist:
            fi["wrist_images"] = obs_tensor(obs, "wrist_images", dev, torch.uint8, self.config.type)
        if states:
            fi["states"] = obs_tensor(obs, "states", dev, torch.float32, self.config.type)
        return fi

    def pixel_values(self, fi: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """(N, I * 6, S, S): main (then wrist) image, each normalised for both backbones."""
        parts = [self.images(fi["main_images"])]
        if "wrist_images" in fi:
            parts.append(self.images(fi["wrist_images"]))
        return torch.cat(parts, dim=1)

    def prefix(self, fi: Mapping[str, torch.Tensor], extra: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Embeddings and validity of ``<s>, patches, [extra], prompt``.

        Args:
            fi: forward inputs.
            extra: (N, E, D) embeddings placed after the patches (OFT's proprio token).

        Returns:
            ``(embeds (N, L0, D), valid (N, L0) bool)``.
        """
        patches = self.vlm.encode_images(self.pixel_values(fi))
        text = self.vlm.embed_tokens(fi["input_ids"])
        parts = [text[:, :1], patches] + ([extra.to(text.dtype)] if extra is not None else []) + [text[:, 1:]]
        n_mid = patches.shape[1] + (extra.shape[1] if extra is not None else 0)
        ones = torch.ones(text.shape[0], n_mid, dtype=torch.bool, device=text.device)
        valid = torch.cat([fi["text_valid"][:, :1], ones, fi["text_valid"][:, 1:]], dim=1)
        return torch.cat(parts, dim=1), valid

    @staticmethod
    def positions(valid: torch.Tensor) -> torch.Tensor:
        """Rotary positions (N, L) from validity: padding does not advance the position."""
        return (valid.long().cumsum(dim=1) - 1).clamp(min=0)

    # ------------------------------------------------------------------ action tokens
    def token_logprobs(self, hidden: torch.Tensor) -> torch.Tensor:
        """(N, L, D) readout hidden states -> (N, L, 256) tempered log-probs over the action ids."""
        logits = self.tokenizer.action_logits(self.vlm.lm_logits(hidden))
        return torch.log_softmax(logits / self.config.temperature, dim=-1)

    @staticmethod
    def choose(logp: torch.Tensor, greedy: bool) -> torch.Tensor:
        """Bin indices (...) from log-probs (..., 256): argmax or a categorical sample."""
        if greedy:
            return logp.argmax(dim=-1)
        flat = logp.reshape(-1, logp.shape[-1]).exp()
        return torch.multinomial(flat, 1).reshape(logp.shape[:-1])

    @staticmethod
    def score(logp: torch.Tensor, bins: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Log-probs of ``bins`` (...) and entropies (...) from log-probs (..., 256)."""
        chosen = logp.gather(-1, bins.long().unsqueeze(-1)).squeeze(-1)
        entropy = -(logp.exp() * logp).sum(dim=-1)
        return chosen, entropy

    def to_env(self, normalized: torch.Tensor) -> torch.Tensor:
        """(N, K, A) normalised actions -> env units (un-normalise, gripper convention).

        Not clipped first: upstream un-normalises the L1 head's output as it is, so values
        beyond [-1, 1] map beyond q01/q99 (token bins are inside [-1, 1] by construction).
        """
        return self.gripper.apply(self.action_norm.unnormalize(normalized))

    def execution(self) -> dict[str, Any]:
        """What one query executes, for results headers: head type, K, open-loop steps, inputs,
        and the temperature that ``sample`` mode draws at (greedy decoding ignores it)."""
        return {"head": self.head_type, "action_chunk": self.action_chunk,
                "open_loop_steps": self.action_chunk, "unnorm_key": self.unnorm_key,
                "sample_temperature": float(self.config.temperature),
                "preprocessing": self.images.describe()}

    def require_samples(self, fi: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """``fi["action_samples"]``, or an error naming what to pass.

        Raises:
            ValueError: if absent (scoring env-unit actions is not supported: the gripper
                convention is not invertible).
        """
        if "action_samples" not in fi:
            raise ValueError(
                f"{type(self).__name__}.evaluate needs forward_inputs['action_samples'] from act(); "
                "VLA policies cannot score env-unit actions (binarised grippers do not invert)."
            )
        return fi["action_samples"]

    def values_from(self, readout0: torch.Tensor) -> torch.Tensor | None:
        """(N,) values from the first readout position's hidden state, or None without critic."""
        return self.value_head(readout0) if self.value_head is not None else None

    def finish(self, logp_tok: torch.Tensor, ent_tok: torch.Tensor, values: torch.Tensor | None) -> Evaluation:
        """Reduce (N, K, A) log-probs and entropies to the configured granularity."""
        return Evaluation(self.to_granularity(logp_tok), self.to_granularity(ent_tok), values)

    def reshape_chunk(self, x: torch.Tensor) -> torch.Tensor:
        """(N, K*A, ...) -> (N, K, A, ...)."""
        return x.reshape(x.shape[0], self.action_chunk, self.spec.action_dim, *x.shape[2:])

    # ------------------------------------------------------------------ supervised fine-tuning
    def set_dataset_statistics(self, norm_stats: Mapping[str, Any], unnorm_key: str) -> None:
        """Use ``norm_stats[unnorm_key]`` (``{"action": {"q01", "q99", "mask"}, "proprio": ...}``,
        the published ``dataset_statistics.json`` layout) from now on, e.g. statistics of the
        demonstrations before SFT; :meth:`save_pretrained_like` writes them with the weights and
        ``policy.unnorm_key`` becomes ``unnorm_key``.

        Raises:
            ValueError: the statistics' action (or proprio) width differs from the policy's.
        """
        import dataclasses

        stats = select_norm_stats(norm_stats, unnorm_key)
        action = ActionNormalizer.from_stats(stats["action"])
        if action.dim != self.spec.action_dim:
            raise ValueError(f"Statistics {unnorm_key!r} have {action.dim} action dims but the "
                             f"policy acts in A={self.spec.action_dim}.")
        self.norm_stats = {k: v for k, v in norm_stats.items()}
        self.dataset_stats, self.unnorm_key, self.action_norm = stats, unnorm_key, action
        self.config = dataclasses.replace(self.config, unnorm_key=unnorm_key)

    def samples_from_env_actions(self, actions: torch.Tensor) -> torch.Tensor:
        """(N, K, A) env-unit actions (demonstrations) -> ``action_samples`` as :meth:`act`
        stores them: action-token bin indices (int64), or normalised float32 for a continuous
        head (:attr:`continuous_actions`). The inverse of :meth:`to_env`: the gripper
        convention is undone (``to_signed``, ``invert``), then the q01/q99 normalisation
        (clipped to [-1, 1]).
        """
        a = torch.as_tensor(actions, dtype=torch.float32, device=self.device).clone()
        g = self.gripper
        if g.invert:
            a[..., g.index] = -a[..., g.index]
        if g.to_signed:
            a[..., g.index] = (a[..., g.index] + 1.0) / 2.0
        x = self.action_norm.normalize(a).clamp(-1.0, 1.0)
        return x if self.continuous_actions else self.tokenizer.encode_bins(x)

    continuous_actions = False
    """Whether ``action_samples`` are normalised floats (OFT's continuous head), not bins."""

    def demo_forward_inputs(self, obs: Mapping[str, Any], actions: torch.Tensor) -> dict[str, torch.Tensor]:
        """``forward_inputs`` of demonstrated (observation, action chunk) pairs: what
        :meth:`act` would have stored had it chosen ``actions`` (N, K, A) in env units."""
        fi = self.encode_obs(obs, wrist=getattr(self.config, "use_wrist_image", False),
                             states=getattr(self.config, "use_proprio", False))
        fi["action_samples"] = self.samples_from_env_actions(actions)
        return fi

    def sft_loss(self, forward_inputs: Mapping[str, torch.Tensor]) -> SFTLoss:
        """Supervised loss of the stored ``action_samples`` (the published models' training
        objective): mean cross-entropy per action token at temperature 1 (OpenVLA, OFT's
        discrete head) or mean L1 in normalised units (OFT's continuous head).

        Returns:
            :class:`~rlinf_embodied.policies.base.SFTLoss` ``(loss, values (N,) or None,
            metrics)``; values come from the same forward pass
            with the hidden state detached, so fitting the value head to demonstration returns
            moves the value head alone (measured: with the backbone in the value loss, whose
            targets reach 1 / (1 - gamma) = 20, the action tokens' accuracy after 1,000 steps
            fell from 0.54 to 0.37).
        """
        raise NotImplementedError

    def token_sft_loss(self, readout: torch.Tensor, bins: torch.Tensor) -> tuple[torch.Tensor, dict]:
        """Cross-entropy of ``bins`` (N, L) from readout hidden states (N, L, D) over the
        action ids at temperature 1, and the fraction of argmax tokens that match."""
        logits = self.tokenizer.action_logits(self.vlm.lm_logits(readout)).float()
        logp = torch.log_softmax(logits, dim=-1)
        nll = -logp.gather(-1, bins.long().unsqueeze(-1)).squeeze(-1)
        acc = (logits.argmax(-1) == bins).float().mean()
        return nll.mean(), {"token_accuracy": float(acc)}

    # ------------------------------------------------------------------ export
    def extra_heads(self) -> dict[str, nn.Module]:
        """Heads written next to the VLM weights by :meth:`save_pretrained_like`: the value head
        when there is one (``value_head--{step}_checkpoint.pt``, read back when ``policy.critic``
        is set); OFT adds its proprio projector and action head."""
        return {"value_head": self.value_head} if self.value_head is not None else {}

    def save_pretrained_like(self, path: str | Path, step: int = 0) -> Path:
        """Write the published layout (LoRA merged): config, shards + index, statistics, tokenizer.

        Args:
            path: output directory (created).
            step: training step in OFT head file names (``action_head--{step}_checkpoint.pt``).

        Returns:
            The directory, loadable with ``policy.pretrained`` (and by the upstream code).
        """
        path = Path(path)
        save_prismatic(self.vlm, path, norm_stats=self.norm_stats, state_dict=merged_state_dict(self.vlm))
        self.prompts.tokenizer.save_pretrained(str(path))
        for name, module in self.extra_heads().items():
            # DDP-trained heads are published with a "module." prefix; the loader strips it.
            sd = {f"module.{k}": v.detach().cpu() for k, v in module.state_dict().items()}
            torch.save(sd, path / f"{name}--{step}_checkpoint.pt")
        return path


def gaussian_logprob_entropy(x: torch.Tensor, mean: torch.Tensor, log_std: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-dimension Normal log-density of ``x`` and entropy, broadcast to ``x``'s shape."""
    log_std = log_std.expand_as(mean)
    var = torch.exp(2 * log_std)
    logp = -((x - mean) ** 2) / (2 * var) - log_std - 0.5 * math.log(2 * math.pi)
    entropy = 0.5 + 0.5 * math.log(2 * math.pi) + log_std
    return logp, entropy


def load_head(directory: str | Path, prefix: str, module: nn.Module, required: bool = True) -> Path | None:
    """Load ``{prefix}--*checkpoint.pt`` from a checkpoint directory into ``module`` (OFT's
    ``action_head`` / ``proprio_projector`` files, or a ``value_head`` written by SFT).

    Files are read with ``torch.load(weights_only=True)`` (tensors only, no code) and a DDP
    ``module.`` prefix is stripped, as upstream's ``load_component_state_dict`` does.

    Returns:
        The file read, or None when ``required`` is False and there is none.

    Raises:
        FileNotFoundError: no (with ``required``) or several matching files (names the pattern
            and directory).
        ValueError: the tensors do not fit ``module`` (e.g. another action dim or LM width).
    """
    directory = Path(directory)
    files = sorted(p for p in directory.glob(f"{prefix}--*") if "checkpoint" in p.name and p.suffix == ".pt")
    if not files and not required:
        return None
    if len(files) != 1:
        raise FileNotFoundError(
            f"Expected exactly one {prefix}--*_checkpoint.pt in {directory}, found "
            f"{[p.name for p in files]}; copy the OFT head files next to the weights or disable "
            "the component (policy.use_proprio / policy.action_head)."
        )
    raw = torch.load(files[0], map_location="cpu", weights_only=True)
    sd = {(k.removeprefix("module.")): v for k, v in raw.items()}
    try:
        module.load_state_dict(sd, strict=True)
    except RuntimeError as e:
        raise ValueError(f"{files[0]} does not fit {type(module).__name__}: {e}") from None
    return files[0]
