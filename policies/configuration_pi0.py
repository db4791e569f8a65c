"""Configs of the flow-matching VLA policies (policies/pi0.py), ``policy.type: pi0 | pi05``.

π0 and π0.5 (Physical Intelligence; openpi, LeRobot) put a Gemma "action expert" beside a
PaliGemma VLM; the expert denoises an action chunk of H steps by flow matching in
``num_steps`` Euler steps, and the first K = ``action_chunk`` actions run open loop. For RL the
denoising is made stochastic as in πRL (arXiv 2510.25889): Flow-SDE or Flow-Noise
(REFERENCE.md "Flow-matching VLAs").

Registered by type in :mod:`rlinf_embodied.config.components`; loaded lazily by the config loader.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from rlinf_embodied.config import ConfigError, PolicyConfig

__all__ = ["FlowVLAPolicyConfig", "Pi05PolicyConfig", "Pi0PolicyConfig"]

NOISE_METHODS = ("flow_sde", "flow_noise")
GREEDY_NOISE = ("fixed", "fresh")
PRESETS = ("tiny", "small", "full")


@dataclass
class FlowVLAPolicyConfig(PolicyConfig):
    """Fields shared by ``pi0`` and ``pi05`` (policies/pi0.py).

    Weights come from ``pretrained`` (a directory in LeRobot's or openpi's published PyTorch
    layout, policies/pi0_checkpoint.py) or, without it, from a random ``preset``;
    ``checkpoint`` still names a ``save_policy`` directory of this framework (RL checkpoints).
    """

    pretrained: Optional[str] = None
    """Directory in a published π0 / π0.5 PyTorch layout: LeRobot's (``config.json`` with
    ``type``, ``model.safetensors`` with ``model.``-prefixed keys, ``policy_preprocessor.json``
    + its normaliser statistics) or openpi's conversion (``config.json``, ``model.safetensors``,
    ``assets/<asset id>/norm_stats.json``). None builds ``preset`` with random weights."""
    tokenizer: Optional[str] = None
    """Directory with the PaliGemma tokenizer files (``tokenizer.model`` or ``tokenizer.json``
    of google/paligemma-3b-pt-224; the published π0 checkpoints do not ship them). None: look in
    ``pretrained``; random presets use a character-level tokenizer."""
    preset: str = "tiny"
    """Architecture when ``pretrained`` is None: ``tiny`` (width 64, depth 2, 32 px images: CPU
    tests), ``small`` (width 128, depth 4, 64 px: the miniature learning suite) or ``full``
    (SigLIP So400m/14 + Gemma 2B + Gemma 300M expert at 224 px, random weights: memory and
    throughput checks)."""
    unnorm_key: Optional[str] = None
    """openpi layout: the ``assets/`` entry whose ``norm_stats.json`` (un)normalises states and
    actions (e.g. ``physical-intelligence/libero``); None when there is exactly one."""
    action_chunk: int = 10
    """K, actions of each predicted chunk executed open loop before the next query (LeRobot's
    ``n_action_steps``; RLinf's LIBERO π0 RL: 10). At most ``action_horizon``."""
    action_horizon: int = 50
    """H, actions the expert denoises per query (openpi ``action_horizon``, LeRobot
    ``chunk_size``; the published models: 50). Only the first K are executed and scored."""
    num_steps: int = 10
    """N, Euler denoising steps per query (openpi / LeRobot inference: 10; RLinf RL: 4 for π0,
    5 for π0.5)."""
    noise_method: str = "flow_sde"
    """How ``act(mode="sample")`` makes denoising stochastic (πRL): ``flow_sde`` (one randomly
    chosen step per sample is a Gaussian SDE transition whose log-prob is used) or
    ``flow_noise`` (a learned noise head adds Gaussian noise at every step; the log-prob is the
    mean over all steps). Greedy mode always integrates the ODE without noise."""
    noise_level: float = 0.5
    """Flow-SDE noise scale a in sigma_t = a * sqrt(t / (1 - t)) (πRL: 0.5)."""
    sde_step: Optional[int] = None
    """Flow-SDE: the denoising step j (0 = the first, from t = 1, where the largest noise is
    added and the chunk's motion is chosen) that is stochastic and scored in every sample; None
    draws j uniformly per sample (πRL). The other N - 1 steps are the ODE's."""
    noise_std_min: float = 0.08
    """Flow-Noise: lower bound of the noise head's std, normalised action units (πRL: 0.08)."""
    noise_std_max: float = 0.16
    """Flow-Noise: upper bound of the noise head's std (πRL: 0.16)."""
    initial_noise_head: bool = False
    """Learn the distribution of the initial noise x_0 (a Gaussian with a mean and std per element
    from the mean of the VLM prefix outputs; it starts at N(0, I), so the SFT policy's samples are
    unchanged) and score x_0 with the chain: x_0's log-prob (and entropy, in ``train/entropy``)
    is added to Flow-SDE's transition and replaces Flow-Noise's N(0, I) term (one of its N + 1
    averaged terms). Otherwise Flow-SDE leaves x_0 unscored and Flow-Noise scores it under the
    fixed N(0, I), which has no parameters, so an outcome decided by where the ODE starts
    (which demonstrated motion a chunk follows) gives the gradient nothing to follow; learning
    where to start the ODE is DSRL's idea
    (Wagenmaker et al. 2025, arXiv 2506.15799). Greedy mode draws x_0 from the learned
    distribution too (``greedy_noise: fresh``; with ``fixed``, its mean plus std times the fixed
    noise)."""
    initial_noise_gain: float = 5.0
    """Factor on the initial-noise head's output. The head starts at zero and learns at the RL
    run's learning rate, which is set for the pretrained weights: an Adam step moves a weight
    by about lr, so the gain is the head's learning-rate multiplier (at lr 1e-4 and gain 5 the
    miniature's 16 iterations moved its means by 0.04 prior std on average, 0.11 at most, and
    its std within 0.93-1.06: docs/pi0.md)."""
    greedy_noise: str = "fixed"
    """Where greedy mode's ODE starts: ``fixed`` (the noise of ``greedy_noise_seed``, the same
    for every query: a deterministic policy) or ``fresh`` (a new N(0, I) draw per query (from
    the learned distribution with ``initial_noise_head``), as
    openpi's and LeRobot's inference sample; evaluations seed it per trial and query, as they
    seed sampled actions, so results stay reproducible and paired across checkpoints). The
    fixed noise is one arbitrary sample used for every query; measured on maniskill_lang3
    (docs/pi0.md) it can act very differently from the policy's samples."""
    greedy_noise_seed: Optional[int] = 0
    """``greedy_noise: fixed``: greedy mode starts the ODE from noise drawn with this fixed seed
    (the same for every query, so the policy is deterministic); None starts from zeros (the
    prior's mode)."""
    max_token_len: int = 48
    """Prompt tokens (BOS included), right-padded; longer prompts are an error (openpi /
    LeRobot: 48 for π0, 200 for π0.5 whose prompt carries the state)."""
    use_wrist_image: bool = True
    """Feed ``wrist_images`` as the second camera (openpi LIBERO: agentview + wrist)."""
    critic: bool = False
    """Value head on the mean of the VLM prefix outputs (PPO); GRPO runs without it."""
    value_head_hidden: int = 512
    """Width of the value head's hidden layer."""
    train_expert_only: bool = False
    """Freeze the PaliGemma VLM (vision tower, projector, Gemma): only the action expert, the
    projections and the heads train (RLinf's π0 RL default)."""
    dtype: str = "auto"
    """Parameter dtype: ``auto`` (bfloat16 when CUDA is available, else float32), ``float32``,
    ``bfloat16``."""

    def __post_init__(self):
        super().__post_init__()
        if self.pretrained is None and self.preset not in PRESETS:
            raise ConfigError(f"policy.preset must be one of {', '.join(PRESETS)} (got {self.preset!r}).")
        if self.action_horizon < 1 or self.action_chunk > self.action_horizon:
            raise ConfigError(
                f"policy.action_chunk ({self.action_chunk}) must be between 1 and "
                f"policy.action_horizon ({self.action_horizon}); lower action_chunk or raise "
                "action_horizon."
            )
        if self.num_steps < 1:
            raise ConfigError(f"policy.num_steps must be >= 1 (got {self.num_steps}).")
        if self.noise_method not in NOISE_METHODS:
            raise ConfigError(
                f"policy.noise_method must be one of {', '.join(NOISE_METHODS)} (got {self.noise_method!r})."
            )
        if self.greedy_noise not in GREEDY_NOISE:
            raise ConfigError(f"policy.greedy_noise must be one of {', '.join(GREEDY_NOISE)} "
                              f"(got {self.greedy_noise!r}).")
        if not self.initial_noise_gain > 0:
            raise ConfigError(f"policy.initial_noise_gain must be > 0 (got {self.initial_noise_gain}).")
        if self.sde_step is not None and not 0 <= self.sde_step < self.num_steps:
            raise ConfigError(f"policy.sde_step must be in 0..num_steps-1 = 0..{self.num_steps - 1} "
                              f"(got {self.sde_step}); null draws the step uniformly.")
        if self.noise_level <= 0:
            raise ConfigError(f"policy.noise_level must be > 0 (got {self.noise_level}).")
        if not 0 < self.noise_std_min <= self.noise_std_max:
            raise ConfigError(
                f"policy.noise_std_min ({self.noise_std_min}) and noise_std_max "
                f"({self.noise_std_max}) must satisfy 0 < min <= max."
            )
        if self.max_token_len < 8:
            raise ConfigError(f"policy.max_token_len must be >= 8 (got {self.max_token_len}).")
        if self.dtype not in ("auto", "float32", "bfloat16"):
            raise ConfigError(f"policy.dtype must be auto, float32 or bfloat16 (got {self.dtype!r}).")
        if self.value_head_hidden < 1:
            raise ConfigError(f"policy.value_head_hidden must be >= 1 (got {self.value_head_hidden}).")


@dataclass
class Pi0PolicyConfig(FlowVLAPolicyConfig):
    """π0: the state is one continuous token of the expert; z-score normalisation."""

    type: str = "pi0"
    """Selects policies/pi0.py (:class:`~rlinf_embodied.policies.pi0.Pi0Policy`)."""
    logprob_granularity: str = "token"
    """Log-probs per action element (N, K, A): each is one Gaussian transition coordinate."""


@dataclass
class Pi05PolicyConfig(FlowVLAPolicyConfig):
    """π0.5: the state is discretised into the prompt; adaptive RMSNorm in the expert carries
    the flow time; quantile normalisation."""

    type: str = "pi05"
    """Selects policies/pi0.py (:class:`~rlinf_embodied.policies.pi0.Pi05Policy`)."""
    logprob_granularity: str = "token"
    """Log-probs per action element (N, K, A)."""
    max_token_len: int = 200
    """Prompt tokens (BOS included); π0.5's prompt carries the discretised state (openpi /
    LeRobot: 200)."""
