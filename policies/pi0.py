"""π0 and π0.5 behind the policy contract: flow matching, Flow-SDE / Flow-Noise log-probs.

One query: the cameras and the prompt go through PaliGemma once (the prefix, its keys and values
cached); the action expert then denoises an H x D chunk in N Euler steps
(policies/pi0_model.py, policies/pi0_sampling.py); the first K actions and A dims are
un-normalised into env units and run open loop.

``forward_inputs`` (leading dim N):

* ``main_images`` (N, H, W, 3) uint8 and, with ``policy.use_wrist_image``, ``wrist_images``;
* ``states`` (N, S) float32 raw (π0 normalises them into its state token);
* ``input_ids`` / ``text_valid`` (N, T): the prompt (π0.5's carries the discretised state);
* ``chains`` (N, N_steps + 1, H, D) float32: the denoising states x_0 (noise) .. x_N;
* ``denoise_index`` (N,) int64: the Flow-SDE step of each sample (-1 otherwise).

Log-probs (N, K, A) are those of the chosen transition (Flow-SDE) or the mean over the
transitions (Flow-Noise) of the executed actions' coordinates; ``evaluate`` recomputes them from
the stored chain with the same operations. Greedy mode integrates the ODE (no noise) from a
fixed seeded noise (``policy.greedy_noise_seed``) or, with ``policy.greedy_noise: fresh``, from a
new draw per query (openpi's / LeRobot's inference), and reports zero log-probs.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, NamedTuple

import torch
from rlinf_embodied.policies.base import (
    ActionOutput,
    Evaluation,
    Policy,
    SFTLoss,
    SpaceSpec,
    check_mode,
    obs_tensor,
)
from rlinf_embodied.policies.pi0_arch import preset_arch
from rlinf_embodied.policies.pi0_checkpoint import PiCheckpoint, load_pi_checkpoint, save_pi_checkpoint
from rlinf_embodied.policies.pi0_inputs import (
    PiNormalizer,
    PiPromptTokenizer,
    pi_prompt,
    preprocess_images,
    state_bins,
)
from rlinf_embodied.policies.pi0_model import PiFlowModel, PrefixCache
from rlinf_embodied.policies.pi0_sampling import InitialNoiseHead, NoiseHead, chain_logprob, denoise
from rlinf_embodied.policies.prismatic_config import select_device_dtype
from rlinf_embodied.policies.prismatic_tokenizer import tiny_tokenizer
from rlinf_embodied.policies.value_head import ValueHead
from torch import nn

from rlinf_embodied.policies.configuration_pi0 import FlowVLAPolicyConfig, Pi05PolicyConfig, Pi0PolicyConfig

__all__ = ["FlowVLAPolicy", "Pi05Policy", "Pi0Policy"]

TIME_BETA = (1.5, 1.0)
"""Flow-matching training times t = 0.999 * Beta(1.5, 1) + 0.001 (openpi ``sample_time``)."""


class _Prefix(NamedTuple):
    cache: PrefixCache
    state: torch.Tensor | None


class FlowVLAPolicy(Policy):
    """Base of :class:`Pi0Policy` and :class:`Pi05Policy` (``PI05`` selects the variant).

    Args:
        config: a :class:`~rlinf_embodied.policies.configuration_pi0.FlowVLAPolicyConfig`.
        spec: the env's spaces: a Box action space, ``states``, ``main_images`` (and
            ``wrist_images`` with ``policy.use_wrist_image``).

    Raises:
        ValueError: the env lacks an input, or its widths do not fit the checkpoint.
        FileNotFoundError: a pretrained directory lacks a file of its layout.
    """

    config_class = FlowVLAPolicyConfig
    PI05 = False
    head_type = "flow_matching"

    def __init__(self, config: FlowVLAPolicyConfig, spec: SpaceSpec):
        super().__init__(config, spec)
        name = config.type
        if spec.discrete or spec.image_shape is None or spec.state_dim == 0:
            raise ValueError(f"The {name} policy needs a Box action space, states and main_images.")
        if config.use_wrist_image and spec.wrist_image_shape is None:
            raise ValueError(f"policy.use_wrist_image is true but the env has no wrist camera; set "
                             f"policy.use_wrist_image=false for {name}.")
        _, dtype = select_device_dtype(None, config.dtype)
        s, a = spec.state_dim, spec.action_dim
        self.layout = None
        if config.pretrained:
            ckpt = PiCheckpoint(config.pretrained, config.unnorm_key)
            if ckpt.arch.pi05 != self.PI05:
                raise ValueError(f"{config.pretrained} holds a {'π0.5' if ckpt.arch.pi05 else 'π0'} model; "
                                 f"set policy.type={'pi05' if ckpt.arch.pi05 else 'pi0'}.")
            n_cam = 1 + int(config.use_wrist_image)
            if ckpt.cameras is not None and len(ckpt.cameras) < n_cam:
                raise ValueError(f"{config.pretrained} was trained with cameras {ckpt.cameras}; set "
                                 "policy.use_wrist_image=false.")
            self.arch, self.layout, self.unnorm_key = ckpt.arch, ckpt.layout, ckpt.unnorm_key
            modes, convention = ckpt.modes, ckpt.layout
        else:
            full = config.preset == "full"
            self.arch = preset_arch(config.preset, self.PI05, 32 if full else a, 32 if full else s)
            self.unnorm_key = None
            mode = "quantiles" if self.PI05 else "mean_std"
            modes, convention = {"state": mode, "action": mode}, "openpi"
        if a > self.arch.action_dim or (not self.PI05 and s > self.arch.state_dim):
            raise ValueError(f"The env has A={a}, S={s} but the model reads D={self.arch.action_dim} action "
                             f"and {self.arch.state_dim} state dims; use an env or checkpoint that fits.")
        self.model = PiFlowModel(self.arch)
        self.normalizer = PiNormalizer(s, a, modes, convention)
        if config.pretrained:
            load_pi_checkpoint(self.model, ckpt)
            for key in ("state", "action"):
                self.normalizer.set_stats(key, ckpt.stats[key])
            tok_dir = config.tokenizer or config.pretrained
            self.prompts = PiPromptTokenizer.from_dir(tok_dir, config.max_token_len)
        elif config.tokenizer:
            self.prompts = PiPromptTokenizer.from_dir(config.tokenizer, config.max_token_len)
        else:
            self.prompts = PiPromptTokenizer(tiny_tokenizer(self.arch.vocab_size), config.max_token_len)
        self.model.to(dtype)
        width = self.arch.expert.width
        self.noise_head = (NoiseHead(width, self.arch.action_dim, config.noise_std_min, config.noise_std_max)
                           if config.noise_method == "flow_noise" else None)
        self.initial_noise_head = (InitialNoiseHead(self.arch.vlm.width, config.action_horizon,
                                                    self.arch.action_dim, config.initial_noise_gain)
                                   if config.initial_noise_head else None)
        self.value_head = ValueHead(self.arch.vlm.width, config.value_head_hidden) if config.critic else None
        if config.train_expert_only:
            self.model.paligemma_with_expert.paligemma.requires_grad_(False)
        self._greedy_noise: torch.Tensor | None = None

    # ------------------------------------------------------------------ inputs
    @property
    def horizon(self) -> int:
        """H, actions denoised per query."""
        return self.config.action_horizon

    def encode_obs(self, obs: Mapping[str, Any]) -> dict[str, torch.Tensor]:
        """The observation part of ``forward_inputs`` (see the module docstring).

        Raises:
            ValueError: a missing key or ``task_descriptions`` of the wrong length.
        """
        dev, name = self.device, self.config.type
        fi = {"main_images": obs_tensor(obs, "main_images", dev, torch.uint8, name)}
        if self.config.use_wrist_image:
            fi["wrist_images"] = obs_tensor(obs, "wrist_images", dev, torch.uint8, name)
        fi["states"] = obs_tensor(obs, "states", dev, torch.float32, name, (self.spec.state_dim,))
        n = fi["main_images"].shape[0]
        texts = obs.get("task_descriptions")
        if texts is None or len(texts) != n:
            raise ValueError(f"The {name} policy needs obs['task_descriptions'] with {n} strings "
                             f"(got {None if texts is None else len(texts)}).")
        if self.PI05:
            bins = state_bins(self.normalizer.normalize("state", fi["states"])).tolist()
            prompts = [pi_prompt(t, b) for t, b in zip(texts, bins)]
        else:
            prompts = [pi_prompt(t) for t in texts]
        fi["input_ids"], fi["text_valid"] = self.prompts(prompts, dev)
        return fi

    def _prefix(self, fi: Mapping[str, torch.Tensor]) -> _Prefix:
        """Prefix pass (keys/values for the expert) and π0's padded state token input."""
        size = self.arch.vision.image_size
        dtype = next(self.model.parameters()).dtype
        cams = [fi["main_images"]] + ([fi["wrist_images"]] if "wrist_images" in fi else [])
        images = [preprocess_images(c, size).to(dtype) for c in cams]
        embs, valid = self.model.embed_prefix(images, fi["input_ids"], fi["text_valid"])
        cache = self.model.encode_prefix(embs, valid)
        state = None
        if not self.PI05:
            s = self.normalizer.normalize("state", fi["states"])
            state = nn.functional.pad(s, (0, self.arch.state_dim - s.shape[-1])).to(dtype)
        return _Prefix(cache, state)

    def _velocity(self, pre: _Prefix):
        return lambda x, t: self.model.velocity(pre.cache, pre.state, x, t)

    @staticmethod
    def _pooled(pre: _Prefix) -> torch.Tensor:
        """(N, W) mean of the valid prefix outputs."""
        w = pre.cache.valid.to(pre.cache.hidden.dtype)[..., None]
        return (pre.cache.hidden * w).sum(1) / w.sum(1).clamp(min=1)

    def _values(self, pre: _Prefix) -> torch.Tensor | None:
        """(N,) values from the mean of the valid prefix outputs, or None without critic."""
        return None if self.value_head is None else self.value_head(self._pooled(pre))

    def _x0_dist(self, pre: _Prefix) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(mean, std) (N, H, D) of the learned initial noise, or None (N(0, I))."""
        return None if self.initial_noise_head is None else self.initial_noise_head(self._pooled(pre))

    def to_env(self, normalized: torch.Tensor) -> torch.Tensor:
        """(N, H, D) normalised model actions -> (N, K, A) env units, clipped to finite bounds."""
        a = self.spec.action_dim
        x = self.normalizer.unnormalize("action", normalized[:, : self.action_chunk, :a])
        lo = torch.tensor(self.spec.action_low, device=x.device)
        hi = torch.tensor(self.spec.action_high, device=x.device)
        return torch.maximum(torch.minimum(x, hi), lo)

    def _crop(self, per_element: torch.Tensor) -> torch.Tensor:
        """(N, H, D) -> (N, K, A): the executed actions' coordinates."""
        return per_element[:, : self.action_chunk, : self.spec.action_dim]

    @property
    def greedy_draws(self) -> bool:
        """Whether greedy mode draws from torch's generator (``policy.greedy_noise: fresh``);
        evaluations then seed greedy queries as they seed sampled ones."""
        return self.config.greedy_noise == "fresh"

    def _initial_noise(self, n: int, greedy: bool) -> torch.Tensor:
        shape = (self.horizon, self.arch.action_dim)
        if not greedy or self.greedy_draws:
            return torch.randn((n, *shape), device=self.device)
        if self._greedy_noise is None or self._greedy_noise.device != self.device:
            seed = self.config.greedy_noise_seed
            base = torch.zeros(shape) if seed is None else torch.randn(
                shape, generator=torch.Generator().manual_seed(int(seed)))
            self._greedy_noise = base.to(self.device)
        return self._greedy_noise.expand(n, *shape).clone()

    # ------------------------------------------------------------------ contract
    @torch.no_grad()
    def act(self, obs: Mapping[str, Any], mode: str = "sample") -> ActionOutput:
        """A chunk of K actions per env.

        Args:
            obs: ``main_images``, ``states``, ``task_descriptions`` (and ``wrist_images``).
            mode: ``sample`` (Flow-SDE / Flow-Noise, torch's global generator) or ``greedy``
                (the ODE from the fixed noise, or from a draw of torch's generator with
                ``policy.greedy_noise: fresh``; log-probs are zeros).

        Returns:
            :class:`ActionOutput` with actions (N, K, A) float32 in env units.
        """
        greedy = check_mode(mode)
        fi = self.encode_obs(obs)
        pre = self._prefix(fi)
        n = fi["states"].shape[0]
        method = "ode" if greedy else self.config.noise_method
        x0, dist = self._initial_noise(n, greedy), self._x0_dist(pre)
        if dist is not None:  # x_0 ~ N(mean, std^2): the same standard draw, moved and scaled
            x0 = dist[0] + dist[1] * x0
        index = None  # Flow-SDE: drawn uniformly per sample
        if method == "flow_sde" and self.config.sde_step is not None:
            index = torch.full((n,), int(self.config.sde_step), dtype=torch.long, device=x0.device)
        res = denoise(self._velocity(pre), x0, self.config.num_steps, method,
                      self.config.noise_level, self.noise_head, index=index, x0_dist=dist)
        fi["chains"], fi["denoise_index"] = res.chain, res.index
        lp = self.to_granularity(self._crop(res.logprob))
        return ActionOutput(self.to_env(res.actions), lp, self._values(pre), fi)

    def evaluate(self, forward_inputs: Mapping[str, torch.Tensor],
                 actions: torch.Tensor | None = None) -> Evaluation:
        """Log-probs and entropies of the stored denoising chains, with gradient.

        Args:
            forward_inputs: from :meth:`act` (possibly re-batched).
            actions: unused (flow policies have no tractable likelihood of env actions; SFT uses
                :meth:`sft_loss`).

        Raises:
            ValueError: ``chains`` missing, or chains sampled by the ODE (greedy mode).
        """
        if "chains" not in forward_inputs:
            raise ValueError(f"{type(self).__name__}.evaluate needs forward_inputs['chains'] from "
                             "act(mode='sample'); to fit demonstrations use sft_loss.")
        pre = self._prefix(forward_inputs)
        lp, ent = chain_logprob(self._velocity(pre), forward_inputs["chains"],
                                forward_inputs["denoise_index"], self.config.noise_method,
                                self.config.noise_level, self.noise_head, self._x0_dist(pre))
        return Evaluation(self.to_granularity(self._crop(lp)), self.to_granularity(self._crop(ent)),
                          self._values(pre))

    @torch.no_grad()
    def predict_values(self, obs: Mapping[str, Any]) -> torch.Tensor:
        """(N,) values from the prefix pass alone (no denoising); without ``policy.critic`` the
        base class raises NotImplementedError."""
        if self.value_head is not None:
            return self._values(self._prefix(self.encode_obs(obs)))
        return super().predict_values(obs)

    # ------------------------------------------------------------------ supervised fine-tuning
    def set_dataset_statistics(self, norm_stats: Mapping[str, Any], unnorm_key: str) -> None:
        """Normalise states and actions with ``norm_stats[unnorm_key]`` from now on (the
        demonstrations' statistics before SFT, in the ``dataset_statistics.json`` layout of
        :meth:`~rlinf_embodied.sft.dataset.RGBDemoDataset.statistics`: ``action`` and
        ``proprio`` (or ``state``) entries with ``mean``/``std``/``q01``/``q99``);
        :meth:`save_pretrained_like` writes them with the weights and ``policy.unnorm_key``
        becomes ``unnorm_key``. The normaliser switches to LeRobot's conventions (its epsilons),
        the layout the statistics are saved in, so the reloaded checkpoint normalises exactly
        as training did.

        Raises:
            KeyError: ``unnorm_key`` is not in ``norm_stats`` (names the keys).
            ValueError: a statistic's width differs from the env's, or one the normalisation
                mode needs (π0: mean/std, π0.5: q01/q99) is missing.
        """
        import dataclasses

        if unnorm_key not in norm_stats:
            raise KeyError(f"No statistics {unnorm_key!r} (have {sorted(norm_stats)}).")
        stats = norm_stats[unnorm_key]
        self.normalizer.set_stats("state", stats["proprio"] if "proprio" in stats else stats["state"])
        self.normalizer.set_stats("action", stats["action"])
        self.normalizer.convention = "lerobot"
        self.unnorm_key = unnorm_key
        self.config = dataclasses.replace(self.config, unnorm_key=unnorm_key)

    def demo_forward_inputs(self, obs: Mapping[str, Any], actions: torch.Tensor) -> dict[str, torch.Tensor]:
        """:meth:`encode_obs` of demonstration observations plus ``demo_actions`` (B, K', A)
        float32 env units, the chunks :meth:`sft_loss` fits (the VLA SFT loop's input)."""
        fi = self.encode_obs(obs)
        fi["demo_actions"] = torch.as_tensor(actions, dtype=torch.float32, device=self.device)
        return fi

    def sft_loss(self, forward_inputs: Mapping[str, torch.Tensor],
                 actions: torch.Tensor | None = None) -> SFTLoss:
        """The flow-matching loss of demonstrated chunks (openpi / LeRobot training objective).

        Actions are normalised and padded to (B, H, D); the mean squared velocity error counts
        only the given actions and the env's A dims (LeRobot drops the padded dims too). Times
        and noise come from torch's global generator.

        Args:
            forward_inputs: :meth:`encode_obs` (or :meth:`demo_forward_inputs`) of the
                demonstration observations (B rows).
            actions: (B, K', A) env-unit actions following each observation, K' <= H; None
                reads ``forward_inputs["demo_actions"]``.

        Returns:
            :class:`~rlinf_embodied.policies.base.SFTLoss`: the loss (scalar, with gradient)
            and the values of the same prefix pass (None without critic).

        Raises:
            ValueError: chunks longer than H, or no actions given nor stored.
        """
        if actions is None:
            if "demo_actions" not in forward_inputs:
                raise ValueError(f"{type(self).__name__}.sft_loss needs actions, or forward_inputs "
                                 "from demo_forward_inputs(obs, actions).")
            actions = forward_inputs["demo_actions"]
        b, k, a = actions.shape
        if k > self.horizon:
            raise ValueError(f"sft_loss got chunks of {k} actions > policy.action_horizon={self.horizon}.")
        target = torch.zeros(b, self.horizon, self.arch.action_dim, device=self.device)
        target[:, :k, :a] = self.normalizer.normalize("action", actions.to(self.device))
        mask = torch.zeros_like(target)
        mask[:, :k, :a] = 1.0
        t = torch.distributions.Beta(*TIME_BETA).sample((b,)).to(self.device) * 0.999 + 0.001
        pre = self._prefix(forward_inputs)
        err = self.model.flow_matching_loss(pre.cache, pre.state, target, torch.randn_like(target), t)
        return SFTLoss((err * mask).sum() / mask.sum(), self._values(pre))

    def critic_parameters(self) -> list[nn.Parameter]:
        """See :meth:`Policy.critic_parameters`: the value head's."""
        return [] if self.value_head is None else list(self.value_head.parameters())

    def execution(self) -> dict[str, Any]:
        """What one query executes, for results headers."""
        return {"head": self.head_type, "action_chunk": self.action_chunk,
                "open_loop_steps": self.action_chunk, "action_horizon": self.horizon,
                "denoise_steps": self.config.num_steps, "noise_method": self.config.noise_method,
                "sample_noise_level": float(self.config.noise_level),  # Flow-SDE's, sample mode
                "initial_noise": "learned" if self.initial_noise_head is not None else "standard normal",
                "greedy_noise": self.config.greedy_noise,  # greedy mode's ODE start
                "greedy_noise_seed": self.config.greedy_noise_seed if self.config.greedy_noise == "fixed" else None,
                "unnorm_key": self.unnorm_key, "layout": self.layout}

    # ------------------------------------------------------------------ export
    def save_pretrained_like(self, path: str | Path, layout: str = "lerobot", step: int = 0) -> Path:
        """Write the model in a published layout (``lerobot`` or ``openpi``), loadable with
        ``policy.pretrained`` (and by upstream at the published sizes); tokenizer files and the
        normalisation statistics too. The value head, Flow-Noise's noise head and the learned
        initial noise (``initial_noise_head``; without it the exported model starts the ODE from
        N(0, I) again) are not part of the published layouts (a ``save_policy`` checkpoint keeps
        them).

        Args:
            path: output directory (created).
            layout: ``lerobot`` (``policy_preprocessor.json`` + statistics) or ``openpi``
                (``assets/<unnorm_key>/norm_stats.json``).
            step: unused (the SFT pipeline passes it to every VLA; OFT names head files by it).
        """
        arch, cfg = self.arch, self.config
        vision, vlm, expert = arch.variants
        if layout == "lerobot":
            size = arch.vision.image_size
            feats = {"observation.images.image": {"type": "VISUAL", "shape": [3, size, size]}}
            if cfg.use_wrist_image:
                feats["observation.images.wrist_image"] = {"type": "VISUAL", "shape": [3, size, size]}
            feats["observation.state"] = {"type": "STATE", "shape": [self.spec.state_dim]}
            upper = {"mean_std": "MEAN_STD", "quantiles": "QUANTILES", "identity": "IDENTITY"}
            config = {"type": cfg.type, "paligemma_variant": vlm, "action_expert_variant": expert,
                      "chunk_size": self.horizon, "n_action_steps": self.action_chunk,
                      "max_state_dim": arch.state_dim, "max_action_dim": arch.action_dim,
                      "num_inference_steps": cfg.num_steps, "image_resolution": [size, size],
                      "tokenizer_max_length": cfg.max_token_len, "input_features": feats,
                      "output_features": {"action": {"type": "ACTION", "shape": [self.spec.action_dim]}},
                      "normalization_mapping": {"VISUAL": "IDENTITY",
                                                "STATE": upper[self.normalizer.modes["state"]],
                                                "ACTION": upper[self.normalizer.modes["action"]]}}
        else:
            config = {"action_dim": arch.action_dim, "action_horizon": self.horizon,
                      "paligemma_variant": vlm, "action_expert_variant": expert, "precision": "float32"}
        if vision != "so400m_14":
            config["vision_variant"] = vision  # tiny instances only (upstream has one tower)
        nz = self.normalizer
        stats = {k: {n: getattr(nz, f"{k}_{n}").tolist() for n in ("mean", "std", "q01", "q99")}
                 for k in ("state", "action")}
        out = save_pi_checkpoint(self.model, path, layout, config=config, stats=stats, modes=nz.modes,
                                 asset_id=self.unnorm_key or "rlinf_embodied")
        self.prompts.tokenizer.save_pretrained(str(out))
        return out


class Pi0Policy(FlowVLAPolicy):
    """π0: continuous state token in the expert (``policy.type: pi0``)."""

    config_class = Pi0PolicyConfig
    PI05 = False


class Pi05Policy(FlowVLAPolicy):
    """π0.5: discretised state in the prompt, adaptive RMSNorm time conditioning (``pi05``)."""

    config_class = Pi05PolicyConfig
    PI05 = True
