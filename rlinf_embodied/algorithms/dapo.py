"""Token-level pieces of GRPO/DAPO for reasoning LLMs: pure tensor functions, registered.

Shapes: B responses, R response positions (right-padded; ``mask`` (B, R) bool marks real
tokens). Advantages are per response (B,) and broadcast over its tokens.

- ``ppo_token`` loss (:func:`ppo_token_objective`, the one loss signature of batch.py on a
  :class:`TokenLossBatch`): clipped surrogate per token with clip-higher and a choice of loss
  aggregation (DAPO, Yu et al. 2025, "DAPO: An Open-Source LLM Reinforcement Learning System at
  Scale", sections 3.1 and 3.3), optional k3 KL to a reference model and entropy bonus; the
  math is :func:`ppo_token_loss`.
- ``nonuniform_groups`` filter: dynamic sampling (DAPO section 3.2), keep groups whose rewards
  are not all equal.
- ``complete`` filter: overlong filtering (DAPO section 3.4), drop truncated responses.
- :func:`overlong_reward_penalty`: DAPO's soft overlong punishment (section 3.4, eq. 13).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from rlinf_embodied.algorithms.batch import LossBatch
from rlinf_embodied.algorithms.losses import k3_kl
from rlinf_embodied.algorithms.registry import register_filter, register_loss
from rlinf_embodied.algorithms.utils import group_index, group_mean

__all__ = ["TokenLossBatch", "aggregate_token_loss", "ppo_token_loss", "ppo_token_objective", "nonuniform_groups", "complete_responses",
           "overlong_reward_penalty", "LOSS_AGGREGATIONS"]

Tensor = torch.Tensor
LOSS_AGGREGATIONS = ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum")


def aggregate_token_loss(losses: Tensor, mask: Tensor, mode: str,
                         denominator: float | Tensor | None = None) -> Tensor:
    """Reduce per-token losses (B, R) to a scalar.

    Args:
        losses: (B, R) float.
        mask: (B, R) bool, real tokens.
        mode: ``token_mean`` (sum over all tokens / number of tokens: long responses weigh
            more, DAPO section 3.3), ``seq_mean_token_mean`` (mean per response, then mean over
            responses: GRPO's original form) or ``seq_mean_token_sum`` (sum per response, mean
            over responses; Dr. GRPO divides by a constant instead).
        denominator: the count to divide by (tokens for ``token_mean``, responses otherwise);
            None uses this batch's. Data-parallel training passes the global count so that
            micro-batches and ranks add up to the mean over the whole minibatch.

    Raises:
        ValueError: for an unknown mode or mismatched shapes.
    """
    if losses.shape != mask.shape:
        raise ValueError(f"losses {tuple(losses.shape)} and mask {tuple(mask.shape)} differ.")
    m = mask.to(losses.dtype)
    if mode == "token_mean":
        total, count = (losses * m).sum(), m.sum()
    elif mode == "seq_mean_token_mean":
        per_seq = (losses * m).sum(-1) / m.sum(-1).clamp_min(1.0)
        has = (m.sum(-1) > 0).to(losses.dtype)
        total, count = (per_seq * has).sum(), has.sum()
    elif mode == "seq_mean_token_sum":
        has = (m.sum(-1) > 0).to(losses.dtype)
        total, count = (losses * m).sum(), has.sum()
    else:
        raise ValueError(f"Unknown loss aggregation {mode!r}; set algorithm.loss_agg to one of "
                         f"{', '.join(LOSS_AGGREGATIONS)}.")
    den = count if denominator is None else denominator
    return total / (den.clamp_min(1.0) if isinstance(den, Tensor) else max(float(den), 1.0))


@dataclass
class TokenLossBatch(LossBatch):
    """A :class:`~rlinf_embodied.algorithms.batch.LossBatch` of B responses with (B, R) log-probs
    and mask, plus the aggregation denominator.

    Attributes:
        denominator: tokens (``token_mean``) or responses (the ``seq_mean_*`` modes) of the
            whole minibatch over all data-parallel ranks, so that micro-batch losses add up to
            the minibatch mean; None uses this batch's own count.
    """

    granularity: str = "token"
    denominator: Optional[float] = None


def ppo_token_loss(
    *,
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    ref_logprobs: Tensor | None = None,
    entropy: Tensor | None = None,
    clip_ratio_low: float = 0.2,
    clip_ratio_high: float = 0.28,
    loss_agg: str = "token_mean",
    kl_coef: float = 0.0,
    entropy_coef: float = 0.0,
    denominator: float | Tensor | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Clipped surrogate per response token: ``l_t = max(-A r_t, -A clip(r_t, 1 - low, 1 +
    high))`` with ``r_t = exp(logp_t - logp_old_t)``, aggregated by ``loss_agg``, plus
    ``kl_coef * k3(pi || pi_ref)`` and ``- entropy_coef * entropy`` (token means).

    Args:
        logprobs: (B, R) current log-probs of the response tokens (with grad).
        old_logprobs: (B, R) rollout-time log-probs.
        advantages: (B,) per-response advantage.
        mask: (B, R) bool, real (and kept) response tokens.
        ref_logprobs: (B, R) reference-model log-probs; required when ``kl_coef > 0``.
        entropy: (B, R) per-token entropy; None skips the bonus.
        clip_ratio_low, clip_ratio_high: clip epsilons (DAPO clip-higher: 0.2 / 0.28).
        loss_agg, denominator: see :func:`aggregate_token_loss`.
        kl_coef, entropy_coef: weights.

    Returns:
        ``(loss, metrics)``; metrics are detached scalars: ``policy_loss``, ``clip_fraction``,
        ``approx_kl`` (mean of ``(r - 1) - log r``), ``kl_ref``, ``entropy`` when computed.

    Raises:
        ValueError: on shape mismatches or ``kl_coef > 0`` without ``ref_logprobs``.
    """
    if logprobs.shape != old_logprobs.shape or logprobs.shape != mask.shape:
        raise ValueError(f"logprobs {tuple(logprobs.shape)}, old_logprobs "
                         f"{tuple(old_logprobs.shape)} and mask {tuple(mask.shape)} must match.")
    if advantages.shape != logprobs.shape[:1]:
        raise ValueError(f"advantages must be (B,) = ({logprobs.shape[0]},); got "
                         f"{tuple(advantages.shape)}.")
    mask = mask.bool()
    log_ratio = (logprobs - old_logprobs.detach()).masked_fill(~mask, 0.0)
    ratio = torch.exp(log_ratio)
    adv = advantages.detach().to(logprobs.dtype)[:, None]
    clipped = ratio.clamp(1.0 - clip_ratio_low, 1.0 + clip_ratio_high)
    per_token = torch.maximum(-adv * ratio, -adv * clipped)
    loss = aggregate_token_loss(per_token, mask, loss_agg, denominator)
    metrics = {"policy_loss": loss.detach()}
    with torch.no_grad():
        n = mask.sum().clamp_min(1)
        metrics["clip_fraction"] = ((ratio != clipped) & mask).sum() / n
        metrics["approx_kl"] = (((ratio - 1.0) - log_ratio) * mask).sum() / n
    if kl_coef > 0.0:
        if ref_logprobs is None:
            raise ValueError(f"algorithm.kl_coef is {kl_coef} but no ref_logprobs were given; "
                             f"keep a reference model or set algorithm.kl_coef=0.")
        kl = k3_kl(logprobs, ref_logprobs, mask)
        loss = loss + kl_coef * kl
        metrics["kl_ref"] = kl.detach()
    if entropy is not None:
        ent = (entropy * mask).sum() / mask.sum().clamp_min(1)
        loss = loss - entropy_coef * ent
        metrics["entropy"] = ent.detach()
    metrics["loss"] = loss.detach()
    return loss, metrics


@register_loss("ppo_token")
def ppo_token_objective(batch: LossBatch, cfg) -> tuple[Tensor, dict[str, Tensor]]:
    """:func:`ppo_token_loss` on a :class:`TokenLossBatch` with ``cfg``'s (a reasoning
    AlgorithmConfig) ``clip_ratio_low``, ``clip_ratio_high``, ``loss_agg``, ``kl_coef`` and
    ``entropy_coef``."""
    return ppo_token_loss(
        logprobs=batch.logprobs, old_logprobs=batch.old_logprobs, advantages=batch.advantages,
        mask=batch.mask, ref_logprobs=batch.ref_logprobs, entropy=batch.entropy,
        clip_ratio_low=cfg.clip_ratio_low, clip_ratio_high=cfg.clip_ratio_high,
        loss_agg=cfg.loss_agg, kl_coef=cfg.kl_coef, entropy_coef=cfg.entropy_coef,
        denominator=getattr(batch, "denominator", None))


@register_filter("nonuniform_groups")
def nonuniform_groups(rewards: Tensor, groups: int | Tensor) -> Tensor:
    """DAPO dynamic sampling: keep the groups whose rewards are not all equal.

    A group with equal rewards has zero group-relative advantage everywhere and only dilutes
    the batch (DAPO section 3.2); for 0/1 rewards this keeps groups with accuracy in (0, 1).

    Args:
        rewards: (N,) float.
        groups: int G (consecutive blocks) or (N,) integer group ids.

    Returns:
        (N,) bool keep mask, constant within each group.
    """
    if rewards.dim() != 1:
        raise ValueError(f"rewards must be (N,); got {tuple(rewards.shape)}.")
    r = rewards.to(torch.float64)
    index, num_groups = group_index(groups, r.shape[0], r.device)
    mean, _ = group_mean(r, index, num_groups)
    spread, _ = group_mean((r - mean) ** 2, index, num_groups)
    return spread > 1e-12


@register_filter("complete")
def complete_responses(truncated: Tensor) -> Tensor:
    """DAPO overlong filtering: keep responses that ended by themselves (EOS), drop those cut at
    the length limit, so a truncated answer is not punished for reasoning that was still
    going (DAPO section 3.4).

    Args:
        truncated: (N,) bool, ``finish_reason == "length"``.

    Returns:
        (N,) bool keep mask.
    """
    return ~truncated.bool()


def overlong_reward_penalty(lengths: Tensor, max_length: int, buffer: int,
                            factor: float = 1.0) -> Tensor:
    """DAPO soft overlong punishment (section 3.4, eq. 13), added to the reward.

    ``0`` for ``len <= max_length - buffer``, ``factor * ((max_length - buffer) - len) / buffer``
    inside the buffer, ``-factor`` beyond ``max_length``.

    Args:
        lengths: (N,) response lengths in tokens.
        max_length: L_max, the generation limit.
        buffer: L_cache, tokens before L_max where the penalty ramps up (0 disables).
        factor: penalty at L_max (DAPO: 1).

    Returns:
        (N,) float penalties in [-factor, 0].
    """
    lengths = lengths.to(torch.float64)
    if buffer <= 0:
        return torch.zeros_like(lengths)
    free = max_length - buffer
    pen = ((free - lengths) / buffer).clamp(-1.0, 0.0)
    return factor * torch.where(lengths > max_length, torch.full_like(pen, -1.0), pen)
