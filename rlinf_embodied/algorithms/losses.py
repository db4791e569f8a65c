"""Policy-gradient and value losses: pure functions of tensors, registered by name.

Batch shapes: B flattened queries (T * N), K action-chunk length, A action dim. Log-probs come
at the policy's granularity, (B, K, A) ``token``, (B, K) ``action`` or (B,) ``chunk``
(:mod:`rlinf_embodied.algorithms.utils`); the ratio is taken at ``ratio_level`` after summing
the log-probs over the finer dims. Advantages and masks are given per query (B,) or with any
leading dims of the ratio's shape and are broadcast over the rest. Losses average over valid
entries (a token-level ratio is therefore a token mean, as in DAPO).

The registered loss ``ppo`` (:func:`ppo_objective`) has the one signature of batch.py,
``fn(LossBatch, AlgorithmConfig)``. Every loss returns ``(loss, metrics)``: a scalar tensor to minimise, and a dict of detached
scalar tensors (no ``.item()``, so no device sync inside the loss).
"""

from __future__ import annotations

import torch

from rlinf_embodied.algorithms.batch import LossBatch
from rlinf_embodied.algorithms.registry import register_loss
from rlinf_embodied.algorithms.utils import expand_prefix, level_of, masked_mean, sum_to_level

__all__ = ["k3_kl", "ppo_loss", "ppo_objective", "ppo_policy_loss", "value_loss"]

Tensor = torch.Tensor
Metrics = dict[str, Tensor]


def _at_level(x: Tensor, level: str, like: Tensor, name: str) -> Tensor:
    y = sum_to_level(x, level)
    if y.shape != like.shape:
        raise ValueError(
            f"{name} has shape {tuple(x.shape)} but the log-probs have {tuple(like.shape)} at "
            f"{level} level; both must come from the same policy granularity."
        )
    return y


def ppo_policy_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor | None = None,
    *,
    clip_ratio_low: float = 0.2,
    clip_ratio_high: float = 0.2,
    dual_clip: float | None = None,
    ratio_level: str | None = None,
) -> tuple[Tensor, Metrics]:
    """Clipped surrogate policy loss (PPO, Schulman et al. 2017, eq. 7) with an asymmetric
    clip range (clip-higher, DAPO, Yu et al. 2025, section 3.1) and optional dual clip (Ye et
    al. 2020, "Mastering Complex Control in MOBA Games with Deep RL", eq. 5).

    Per entry with ratio ``r = exp(logp - logp_old)``:
    ``l = max(-A r, -A clip(r, 1 - low, 1 + high))``, and with dual clip ``c > 1``,
    ``l = min(l, -c A)`` where ``A < 0``.

    Args:
        logprobs: (B, K, A), (B, K) or (B,) current log-probs (with grad).
        old_logprobs: same shape, log-probs at rollout time.
        advantages: (B,) or a leading-dims prefix of the ratio's shape.
        mask: bool, a prefix of the ratio's shape (e.g. (B,) or (B, K)); None = all valid.
        clip_ratio_low: epsilon below 1 (PPO: 0.2).
        clip_ratio_high: epsilon above 1 (clip-higher: 0.28).
        dual_clip: constant c > 1 bounding the loss of negative advantages; None disables.
        ratio_level: ``token``, ``action`` or ``chunk``; None uses the log-probs' own level.

    Returns:
        ``(loss, metrics)`` with metrics ``policy_loss``, ``clip_fraction`` (ratio outside
        [1 - low, 1 + high]), ``dual_clip_fraction``, ``approx_kl`` (k3 estimate of
        KL(old || new)), ``ratio_mean``.

    Raises:
        ValueError: for mismatched shapes, an unknown level, a level finer than the log-probs,
            or ``dual_clip <= 1``.
    """
    if dual_clip is not None and dual_clip <= 1.0:
        raise ValueError(f"algorithm.dual_clip must be > 1 (got {dual_clip}); use 3.0 or None.")
    level = ratio_level or level_of(logprobs)
    logp = sum_to_level(logprobs, level)
    old = _at_level(old_logprobs, level, logp, "old_logprobs").detach()
    adv = expand_prefix(advantages.detach().to(logp.dtype), logp.shape, "advantages")
    log_ratio = logp - old
    ratio = torch.exp(log_ratio)
    clipped = ratio.clamp(1.0 - clip_ratio_low, 1.0 + clip_ratio_high)
    losses = torch.maximum(-adv * ratio, -adv * clipped)
    dual = torch.zeros_like(losses, dtype=torch.bool)
    if dual_clip is not None:
        dual = (adv < 0) & (losses > -dual_clip * adv)
        losses = torch.where(dual, -dual_clip * adv, losses)
    loss = masked_mean(losses, mask)
    with torch.no_grad():
        outside = (ratio < 1.0 - clip_ratio_low) | (ratio > 1.0 + clip_ratio_high)
        metrics = {
            "policy_loss": loss.detach(),
            "clip_fraction": masked_mean(outside.to(logp.dtype), mask),
            "dual_clip_fraction": masked_mean(dual.to(logp.dtype), mask),
            "approx_kl": masked_mean((ratio - 1.0) - log_ratio, mask),
            "ratio_mean": masked_mean(ratio, mask),
        }
    return loss, metrics


def value_loss(
    values: Tensor,
    returns: Tensor,
    old_values: Tensor | None = None,
    mask: Tensor | None = None,
    *,
    value_clip: float | None = None,
) -> tuple[Tensor, Metrics]:
    """Squared-error value loss ``0.5 (V - R)^2``, optionally clipped around the rollout-time
    values (PPO2 baseline; also CleanRL's ``clip_vloss``): ``0.5 max((V - R)^2,
    (V_old + clip(V - V_old, -c, c) - R)^2)``.

    Args:
        values: (B,) current value predictions (with grad).
        returns: (B,) value targets.
        old_values: (B,) rollout-time values; required when ``value_clip`` is set.
        mask: (B,) bool; None = all valid.
        value_clip: clip range c in value units; None disables.

    Returns:
        ``(loss, metrics)`` with metrics ``value_loss`` and ``value_clip_fraction``.

    Raises:
        ValueError: for mismatched shapes or ``value_clip`` without ``old_values``.
    """
    if values.shape != returns.shape:
        raise ValueError(
            f"values {tuple(values.shape)} and returns {tuple(returns.shape)} must match."
        )
    returns = returns.detach().to(values.dtype)
    losses = (values - returns) ** 2
    clipped_frac = torch.zeros((), dtype=values.dtype, device=values.device)
    if value_clip is not None:
        if old_values is None or old_values.shape != values.shape:
            raise ValueError("value_clip needs old_values of the values' shape (B,).")
        old = old_values.detach().to(values.dtype)
        delta = values - old
        v_clipped = old + delta.clamp(-value_clip, value_clip)
        losses = torch.maximum(losses, (v_clipped - returns) ** 2)
        with torch.no_grad():
            clipped_frac = masked_mean((delta.abs() > value_clip).to(values.dtype), mask)
    loss = 0.5 * masked_mean(losses, mask)
    return loss, {"value_loss": loss.detach(), "value_clip_fraction": clipped_frac}


def k3_kl(logprobs: Tensor, ref_logprobs: Tensor, mask: Tensor | None = None) -> Tensor:
    """Mean k3 estimate of KL(pi || pi_ref) from samples of pi: ``exp(d) - d - 1`` with
    ``d = logp_ref - logp`` (Schulman 2020, "Approximating KL Divergence", blog post;
    unbiased, always >= 0).

    Args:
        logprobs: log-probs of the current policy at some level, e.g. (B, K).
        ref_logprobs: the reference policy's log-probs of the same samples, same shape.
        mask: a prefix of the shape; None = all valid.

    Returns:
        Scalar tensor (differentiable in ``logprobs``).

    Raises:
        ValueError: if the shapes differ.
    """
    if logprobs.shape != ref_logprobs.shape:
        raise ValueError(
            f"logprobs {tuple(logprobs.shape)} and ref_logprobs {tuple(ref_logprobs.shape)} "
            "must have the same shape."
        )
    d = ref_logprobs.detach().to(logprobs.dtype) - logprobs
    return masked_mean(torch.exp(d) - d - 1.0, mask)


def ppo_loss(
    *,
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor | None = None,
    entropy: Tensor | None = None,
    values: Tensor | None = None,
    returns: Tensor | None = None,
    old_values: Tensor | None = None,
    ref_logprobs: Tensor | None = None,
    clip_ratio_low: float = 0.2,
    clip_ratio_high: float = 0.2,
    dual_clip: float | None = None,
    value_clip: float | None = None,
    value_coef: float = 0.5,
    entropy_coef: float = 0.0,
    kl_coef: float = 0.0,
    ratio_level: str | None = None,
) -> tuple[Tensor, Metrics]:
    """Full PPO objective: ``policy + value_coef * value - entropy_coef * entropy + kl_coef *
    KL_k3(pi || pi_ref)``. Critic-free methods (GRPO, REINFORCE++) use it with ``values=None``.

    The hyperparameter names match :class:`rlinf_embodied.config.AlgorithmConfig` fields.

    Args:
        logprobs: (B, K, A), (B, K) or (B,) current log-probs (with grad).
        old_logprobs: same shape, rollout-time log-probs.
        advantages: (B,) or a prefix of the ratio's shape.
        mask: bool, a prefix of the ratio's shape; None = all valid. The value loss uses its
            per-query reduction (a query counts when any of its entries is valid).
        entropy: per-entry entropy at the log-probs' granularity; None skips the bonus.
        values: (B,) current values; None skips the value loss (critic-free).
        returns: (B,) value targets; required with ``values``.
        old_values: (B,) rollout-time values, for ``value_clip``.
        ref_logprobs: reference-policy log-probs at the log-probs' granularity; required when
            ``kl_coef > 0``.
        clip_ratio_low, clip_ratio_high, dual_clip, ratio_level: see :func:`ppo_policy_loss`.
        value_clip: see :func:`value_loss`.
        value_coef: weight of the value loss (CleanRL: 0.5).
        entropy_coef: weight of the entropy bonus (ManiSkill PPO baseline: 0).
        kl_coef: weight of the k3 KL penalty to the reference policy.

    Returns:
        ``(loss, metrics)``: the policy metrics plus ``value_loss``, ``value_clip_fraction``,
        ``entropy``, ``kl_ref`` (when computed) and ``loss``.

    Raises:
        ValueError: for mismatched shapes, ``values`` without ``returns``, or ``kl_coef > 0``
            without ``ref_logprobs``.
    """
    level = ratio_level or level_of(logprobs)
    loss, metrics = ppo_policy_loss(
        logprobs,
        old_logprobs,
        advantages,
        mask,
        clip_ratio_low=clip_ratio_low,
        clip_ratio_high=clip_ratio_high,
        dual_clip=dual_clip,
        ratio_level=level,
    )
    if values is not None:
        if returns is None:
            raise ValueError("ppo_loss got values but no returns; pass the value targets.")
        query_mask = mask if mask is None or mask.dim() == 1 else mask.flatten(1).any(1)
        vf, vf_metrics = value_loss(values, returns, old_values, query_mask, value_clip=value_clip)
        loss = loss + value_coef * vf
        metrics.update(vf_metrics)
    if entropy is not None:
        ent = masked_mean(sum_to_level(entropy, level), mask)
        loss = loss - entropy_coef * ent
        metrics["entropy"] = ent.detach()
    if kl_coef > 0.0:
        if ref_logprobs is None:
            raise ValueError(
                f"algorithm.kl_coef is {kl_coef} but no ref_logprobs were given; compute the "
                "reference policy's log-probs or set algorithm.kl_coef=0."
            )
        logp = sum_to_level(logprobs, level)
        kl = k3_kl(logp, _at_level(ref_logprobs, level, logp, "ref_logprobs"), mask)
        loss = loss + kl_coef * kl
        metrics["kl_ref"] = kl.detach()
    metrics["loss"] = loss.detach()
    return loss, metrics


@register_loss("ppo")
def ppo_objective(batch: LossBatch, cfg) -> tuple[Tensor, Metrics]:
    """:func:`ppo_loss` on a :class:`~rlinf_embodied.algorithms.batch.LossBatch` with the
    hyperparameters of ``cfg`` (an AlgorithmConfig: clip ratios, dual clip, value clip and
    coefficient, entropy and KL coefficients). The importance ratio is taken per
    ``algorithm.ratio_level``, or per entry of the log-probs when it is None.
    """
    return ppo_loss(
        logprobs=batch.logprobs, old_logprobs=batch.old_logprobs, advantages=batch.advantages,
        mask=batch.mask, entropy=batch.entropy, values=batch.values, returns=batch.returns,
        old_values=batch.old_values, ref_logprobs=batch.ref_logprobs,
        clip_ratio_low=cfg.clip_ratio_low, clip_ratio_high=cfg.clip_ratio_high,
        dual_clip=cfg.dual_clip, value_clip=cfg.value_clip, value_coef=cfg.value_coef,
        entropy_coef=cfg.entropy_coef, kl_coef=cfg.kl_coef,
        ratio_level=cfg.ratio_level or batch.granularity,
    )
