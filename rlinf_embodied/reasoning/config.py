"""Typed configuration of a reasoning-LLM RL job (top level: :class:`ReasoningJobConfig`).

A YAML file is a reasoning job when its top level says ``workflow: reasoning``; the CLI then
loads it with this schema (same strict parsing and dotted overrides as the embodied jobs:
:func:`rlinf_embodied.config.load_config`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from rlinf_embodied.config import (
    ClusterConfig,
    ConfigError,
    ElasticConfig,
    LoggingConfig,
    RunConfig,
)

__all__ = [
    "is_reasoning_job",
    "load_job_config",
    "ModelConfig",
    "TaskConfig",
    "ReasoningRolloutConfig",
    "ReasoningAlgorithmConfig",
    "ReasoningTrainerConfig",
    "ReasoningEvalConfig",
    "ReasoningJobConfig",
]


@dataclass
class ModelConfig:
    """The causal LM being trained."""

    path: Optional[str] = None
    """Local HF model directory (e.g. a downloaded Qwen2.5-0.5B-Instruct); None builds the tiny
    model (:mod:`rlinf_embodied.llm.tiny_model`) into ``{run_dir}/tiny_model``."""
    tiny_seed: int = 0
    """Weight-initialisation seed of the tiny model (when ``path`` is None)."""
    tiny_layers: int = 2
    """Layers of the tiny model (when ``path`` is None)."""
    dtype: str = "float32"
    """Actor parameter dtype (``float32`` or ``bfloat16``; optimizer state follows it)."""
    gradient_checkpointing: bool = False
    """Recompute activations in the backward pass (large models)."""


@dataclass
class TaskConfig:
    """Where prompts and reference answers come from."""

    type: str = "arithmetic"
    """``arithmetic`` (procedural, shipped; :func:`~rlinf_embodied.llm.tasks.arithmetic_problems`)
    or ``jsonl`` (GSM8K/MATH-style file at ``path``)."""
    path: Optional[str] = None
    """Training JSONL file (``type: jsonl``)."""
    test_path: Optional[str] = None
    """Held-out JSONL file; None evaluates on the training file's first ``num_test`` lines."""
    question_key: str = "question"
    """JSONL field of the question (MATH: ``problem``)."""
    answer_key: str = "answer"
    """JSONL field of the answer (GSM8K ``#### N`` answers reduce to N)."""
    num_train: int = 300
    """Training problems (arithmetic: generated; jsonl: first lines kept)."""
    num_test: int = 64
    """Held-out problems scored at every evaluation."""
    seed: int = 0
    """Arithmetic task seed (train/test streams derive from it)."""
    max_operand: int = 20
    """Arithmetic operands are integers in [0, max_operand]."""
    num_operands: int = 2
    """Operands per arithmetic expression."""
    no_carry: bool = False
    """Arithmetic without carries: sums only (``+``), every operand has the digit count of
    ``max_operand`` and each digit column adds up to at most 9 (``34+52``), so each answer
    digit is a function of the two digits above it: a tiny model can learn the rule from
    training questions and apply it to held-out ones."""
    prompt_format: str = "{question}="
    """Prompt text around the question (``{question}`` is replaced)."""
    use_chat_template: bool = False
    """Wrap the prompt as one user message through the tokenizer's chat template (instruct
    models such as Qwen2.5-Instruct)."""

    def __post_init__(self):
        if self.type not in ("arithmetic", "jsonl"):
            raise ConfigError(f"task.type must be arithmetic or jsonl (got {self.type!r}).")
        if self.type == "jsonl" and not self.path:
            raise ConfigError("task.type=jsonl needs task.path (a local GSM8K-style JSONL file).")
        if "{question}" not in self.prompt_format:
            raise ConfigError(f"task.prompt_format must contain {{question}} "
                              f"(got {self.prompt_format!r}).")


@dataclass
class ReasoningRolloutConfig:
    """Response generation (the rollout worker and its backend)."""

    backend: str = "hf"
    """``hf`` (transformers, default on CPU) or ``vllm`` (needs the vLLM venv)."""
    prompts_per_step: int = 16
    """Prompts sampled per training step; each gets ``algorithm.group_size`` responses."""
    max_new_tokens: int = 8
    """Response length limit R_max (tokens); longer responses end with finish_reason=length."""
    temperature: float = 1.0
    """Sampling temperature of training rollouts (log-probs are always taken at 1)."""
    top_p: float = 1.0
    """Nucleus sampling mass in (0, 1]."""
    max_batch_size: int = 256
    """Sequences decoded together by the HF backend (memory bound)."""
    pipelining: bool = False
    """Elastic pipelining: stream finished responses to reward and actor in micro-batches while
    long ones are still generating (RLinf paper 2.2/3.3)."""
    micro_batch_size: int = 8
    """Responses per message on the stream to the reward/actor workers (pipelining granularity)."""
    long_tail_alpha: Optional[float] = None
    """Benchmark knob for long-tailed response lengths: each training response is exactly
    ``floor(Pareto(alpha))`` tokens (scale 1, clipped to ``max_new_tokens``; EOS suppressed
    before), so most responses are short and a few run to the limit (smaller alpha, heavier
    tail). None = off (the model decides the length)."""
    dtype: str = "float32"
    """Backend weight dtype."""
    device: Optional[str] = None
    """Backend torch device; None = the rollout worker's device from the placement."""
    gpu_memory_utilization: float = 0.1
    """vLLM: memory fraction for the KV cache (on the CPU build: of *CPU* memory; 0.92, vLLM's
    default, fails on a 24 GiB machine, ENVIRONMENT.md)."""
    enforce_eager: bool = True
    """vLLM: no CUDA graphs / compilation (faster start, needed on CPU)."""
    max_model_len: Optional[int] = None
    """vLLM: context length; None uses the model config's."""

    def __post_init__(self):
        if self.backend not in ("hf", "vllm"):
            raise ConfigError(f"rollout.backend must be hf or vllm (got {self.backend!r}).")
        if self.long_tail_alpha is not None and self.long_tail_alpha <= 0:
            raise ConfigError(f"rollout.long_tail_alpha must be > 0 or null (got "
                              f"{self.long_tail_alpha}).")
        if self.temperature <= 0:
            raise ConfigError(f"rollout.temperature must be > 0 (got {self.temperature}); "
                              f"evaluation is greedy by eval.greedy.")
        if not 0 < self.top_p <= 1:
            raise ConfigError(f"rollout.top_p must be in (0, 1] (got {self.top_p}).")
        if self.max_new_tokens < 1 or self.micro_batch_size < 1 or self.prompts_per_step < 1:
            raise ConfigError(
                f"rollout.max_new_tokens, micro_batch_size and prompts_per_step must be >= 1 "
                f"(got {self.max_new_tokens}, {self.micro_batch_size}, {self.prompts_per_step}).")


@dataclass
class ReasoningAlgorithmConfig:
    """GRPO / DAPO (names from the algorithm registry)."""

    advantage: str = "grpo"
    """Advantage estimator (``grpo``: group-normalised outcome reward)."""
    loss: str = "ppo_token"
    """Policy loss (``ppo_token``: clipped surrogate per response token)."""
    group_size: int = 4
    """G, responses per prompt."""
    grpo_std_normalize: bool = True
    """Divide group-centred rewards by the group std (off = Dr. GRPO)."""
    clip_ratio_low: float = 0.2
    """Clip epsilon below 1 (PPO: 0.2)."""
    clip_ratio_high: float = 0.28
    """Clip-higher epsilon above 1 (DAPO: 0.28)."""
    loss_agg: str = "token_mean"
    """``token_mean`` (DAPO: every token of the batch weighs the same), ``seq_mean_token_mean``
    (GRPO: mean per response, then over responses) or ``seq_mean_token_sum``."""
    dynamic_sampling: bool = False
    """DAPO dynamic sampling: drop groups whose rewards are all equal (zero advantage)."""
    filter_low: Optional[float] = None
    """Success-rate band of the ``grpo`` estimator's own dynamic sampling (a response succeeds
    when its reward > 0.5): drop groups below this; None = 0. ``dynamic_sampling`` is the
    reward-based DAPO form."""
    filter_high: Optional[float] = None
    """Upper end of that band; None = 1."""
    overlong_filter: bool = False
    """DAPO overlong filtering: truncated responses (finish_reason=length) get no loss."""
    overlong_buffer: int = 0
    """DAPO soft overlong punishment: the reward falls linearly by up to
    ``overlong_penalty_factor`` over the last this-many tokens before rollout.max_new_tokens
    (0 disables; :func:`~rlinf_embodied.algorithms.dapo.overlong_reward_penalty`)."""
    overlong_penalty_factor: float = 1.0
    """Penalty at the length limit (DAPO: 1.0)."""
    recompute_logprobs: bool = False
    """Recompute the old log-probs on the actor after the rollout instead of using the
    backend's (needed when the backend's numerics differ from the actor's, e.g. bf16 vLLM)."""
    kl_coef: float = 0.0
    """Weight of the k3 KL estimate to the reference model (0: no reference model is kept)."""
    entropy_coef: float = 0.0
    """Weight of the entropy bonus."""

    def __post_init__(self):
        if self.group_size < 2:
            raise ConfigError(f"algorithm.group_size must be >= 2 for group-normalised "
                              f"advantages (got {self.group_size}).")
        if self.loss_agg not in ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum"):
            raise ConfigError(f"algorithm.loss_agg must be token_mean, seq_mean_token_mean or "
                              f"seq_mean_token_sum (got {self.loss_agg!r}).")
        if self.overlong_buffer < 0:
            raise ConfigError(f"algorithm.overlong_buffer must be >= 0 (got {self.overlong_buffer}).")
        if self.clip_ratio_low < 0 or self.clip_ratio_high < 0 or self.kl_coef < 0:
            raise ConfigError("algorithm.clip_ratio_low, clip_ratio_high and kl_coef must be "
                              f">= 0 (got {self.clip_ratio_low}, {self.clip_ratio_high}, "
                              f"{self.kl_coef}).")


@dataclass
class ReasoningTrainerConfig:
    """The training loop."""

    iterations: int = 20
    """Training steps (one rollout + one update each)."""
    update_epochs: int = 1
    """Passes over each step's responses."""
    num_minibatches: int = 1
    """Optimizer steps per epoch (the step's responses split evenly)."""
    micro_batch_size: int = 64
    """Responses per forward/backward (gradient accumulation; memory bound)."""
    lr: float = 1e-4
    """AdamW learning rate."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    max_grad_norm: float = 1.0
    """Gradient-norm clip."""
    sft_steps: int = 0
    """Supervised warm-up steps on the task's solutions before RL (the tiny model starts from
    random weights, so it needs some to get any reward)."""
    sft_batch_size: int = 64
    """Solutions per step of the supervised warm-up."""
    sft_lr: float = 3e-3
    """AdamW learning rate of the supervised warm-up."""
    eval_every: int = 5
    """Evaluate every this many steps (and at the end); 0 disables."""
    save_every: int = 0
    """Checkpoint every this many steps (and at the end); 0 disables."""
    max_time_s: Optional[float] = None
    """Wall-time budget in seconds: the run stops after the step past which another (as
    long as the last, after the evaluation due first) would end beyond it."""
    offload: bool = False
    """FSDP CPU offload of parameters, gradients and optimizer state."""


@dataclass
class ReasoningEvalConfig:
    """Held-out evaluation."""

    greedy: bool = True
    """Greedy decoding (temperature -> argmax); False samples at rollout.temperature."""
    max_new_tokens: Optional[int] = None
    """None uses rollout.max_new_tokens."""


@dataclass
class ReasoningJobConfig:
    """A whole reasoning job: the top level of ``configs/reasoning_*.yaml``."""

    workflow: str = "reasoning"
    """Marks the file as a reasoning job (the CLI picks this schema by it)."""
    run: RunConfig = field(default_factory=RunConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    placement: str = "collocated"
    """File in ``configs/placement/`` (``collocated``, ``disaggregated``, ``hybrid``), a path,
    or ``auto``. Roles: ``rollout``, ``reward``, ``actor`` (the reward worker runs on the env
    group's devices of the placement file)."""
    model: ModelConfig = field(default_factory=ModelConfig)
    task: TaskConfig = field(default_factory=TaskConfig)
    rollout: ReasoningRolloutConfig = field(default_factory=ReasoningRolloutConfig)
    algorithm: ReasoningAlgorithmConfig = field(default_factory=ReasoningAlgorithmConfig)
    trainer: ReasoningTrainerConfig = field(default_factory=ReasoningTrainerConfig)
    eval: ReasoningEvalConfig = field(default_factory=ReasoningEvalConfig)
    elastic: ElasticConfig = field(default_factory=ElasticConfig)
    """Elastic rollout on reserved + preemptible workers (``elastic.enabled``; responses of a
    preempted worker continue from their partial tokens, rlinf_embodied/reasoning/elastic.py)."""
    logging: LoggingConfig = field(default_factory=LoggingConfig)

    def __post_init__(self):
        if self.workflow != "reasoning":
            raise ConfigError(f"workflow must be 'reasoning' in a reasoning job "
                              f"(got {self.workflow!r}).")


def is_reasoning_job(path) -> bool:
    """True when the YAML file at ``path`` says ``workflow: reasoning`` at its top level."""
    from rlinf_embodied.config import peek_top_level

    raw = peek_top_level(path)
    return raw is not None and raw.get("workflow") == "reasoning"


def load_job_config(path, overrides=None):
    """:func:`rlinf_embodied.config.load_config` with the schema the file asks for
    (:class:`ReasoningJobConfig` for ``workflow: reasoning``, else the embodied JobConfig)."""
    from rlinf_embodied.config import load_config

    if path is not None and is_reasoning_job(path):
        return load_config(path, overrides, schema=ReasoningJobConfig)
    return load_config(path, overrides)
