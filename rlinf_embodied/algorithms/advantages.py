"""Advantage estimators: pure functions of rollout tensors, registered by name.

Time-major shapes (DESIGN.md vocabulary): T policy queries per env, N envs. Step t pairs the
observation o_t, its action a_t, the reward r_t it earned and the flags of that transition:
``terminations[t]`` (the task ended: success or failure, no future reward) and
``truncations[t]`` (a time limit or error cut the episode: the future is unknown, so the value
of the final observation stands in for it).

Autoreset (envs/base.py): under NEXT_STEP the step after a done is the env's reset step; its
action is ignored and its reward is meaningless, so the caller passes ``valid[t] = False`` there.
Row t+1 of ``values`` is then the value of the final observation, which is exactly the
truncation bootstrap. Under SAME_STEP the next row already belongs to the new episode, so the
caller passes ``final_values`` (the value of each truncated step's final observation).

The math functions (:func:`gae`, :func:`grpo`, :func:`reinforce_pp`) return ``(advantages,
returns)`` of the rewards' shape; invalid entries are 0 in ``advantages`` (and must be masked out
of the loss by the caller). The registered estimators (``gae``, ``grpo``, ``reinforce_pp``) wrap
them in the one signature of batch.py: ``fn(RolloutBatch, AlgorithmConfig) -> Advantages``.
"""

from __future__ import annotations

import torch

from rlinf_embodied.algorithms.batch import Advantages, RolloutBatch
from rlinf_embodied.algorithms.registry import get_filter, register_advantage
from rlinf_embodied.algorithms.utils import group_index, group_mean

__all__ = ["gae", "gae_estimator", "grpo", "grpo_estimator", "reinforce_pp", "reinforce_pp_estimator"]

Tensor = torch.Tensor


def _flags(x: Tensor | None, like: Tensor, name: str) -> Tensor:
    """Bool (T, N) flags; an absent tensor is all False."""
    if x is None:
        return torch.zeros(like.shape, dtype=torch.bool, device=like.device)
    if x.shape != like.shape:
        raise ValueError(
            f"{name} must have the rewards' shape (T, N)={tuple(like.shape)}; got {tuple(x.shape)}."
        )
    return x.to(device=like.device, dtype=torch.bool)


def _valid(valid: Tensor | None, like: Tensor) -> Tensor:
    if valid is None:
        return torch.ones(like.shape, dtype=torch.bool, device=like.device)
    return _flags(valid, like, "valid")


def gae(
    rewards: Tensor,
    values: Tensor,
    terminations: Tensor,
    truncations: Tensor | None = None,
    *,
    next_values: Tensor | None = None,
    final_values: Tensor | None = None,
    valid: Tensor | None = None,
    gamma: float = 0.99,
    gae_lambda: float = 0.95,
) -> tuple[Tensor, Tensor]:
    """Generalised advantage estimation (Schulman et al. 2016, "High-Dimensional Continuous
    Control Using Generalized Advantage Estimation", eq. 16), episode-boundary aware.

    ``delta_t = r_t + gamma * (1 - term_t) * V_boot_t - V(o_t)`` with ``V_boot_t`` the value of
    the next observation (``final_values[t]`` on a truncated step when given), and
    ``A_t = delta_t + gamma * lambda * (1 - done_t) * A_{t+1}`` with ``done = term | trunc``:
    the recursion never crosses an episode boundary, a termination never bootstraps and a
    truncation bootstraps from its final observation. Invalid steps get ``A_t = 0`` and cut the
    recursion.

    Args:
        rewards: (T, N) float, reward of each transition.
        values: (T+1, N) float, V(o_0) .. V(o_T) (row T is the bootstrap value after the
            rollout), or (T, N) together with ``next_values``.
        terminations: (T, N) bool, the transition ended the episode for good.
        truncations: (T, N) bool, the transition was cut by a time limit or error; None = never.
        next_values: (N,) float, V(o_T) when ``values`` has T rows.
        final_values: (T, N) float, value of the final observation of each truncated step
            (read only where ``truncations`` is set); None bootstraps from ``values[t + 1]``
            (right under NEXT_STEP autoreset, where that row is the final observation).
        valid: (T, N) bool, False on the NEXT_STEP autoreset step whose action the env
            ignored; None = all valid.
        gamma: discount per policy query (ManiSkill PPO baseline: 0.8).
        gae_lambda: GAE lambda (ManiSkill PPO baseline: 0.9).

    Returns:
        ``(advantages (T, N), returns (T, N))`` in the rewards' dtype; ``returns = A + V``
        (the value targets, lambda-returns).

    Raises:
        ValueError: on inconsistent shapes or a missing ``next_values``.
    """
    if rewards.dim() != 2:
        raise ValueError(f"rewards must be (T, N); got {tuple(rewards.shape)}.")
    T, N = rewards.shape
    values = values.to(rewards.dtype)
    if values.shape == (T + 1, N):
        v, v_next = values[:T], values[1:]
    elif values.shape == (T, N):
        if next_values is None or next_values.shape != (N,):
            raise ValueError(
                f"values has T={T} rows, so pass next_values of shape (N,)=({N},) "
                "(the value of the observation after the last step), or values of shape (T+1, N)."
            )
        v, v_next = values, torch.cat([values[1:], next_values.to(values)[None]], 0)
    else:
        raise ValueError(
            f"values must be (T+1, N)={(T + 1, N)} or (T, N)={(T, N)}; got {tuple(values.shape)}."
        )
    term = _flags(terminations, rewards, "terminations")
    trunc = _flags(truncations, rewards, "truncations")
    ok = _valid(valid, rewards)
    if final_values is not None:
        if final_values.shape != (T, N):
            raise ValueError(
                f"final_values must be (T, N)={(T, N)}; got {tuple(final_values.shape)}."
            )
        v_next = torch.where(trunc, final_values.to(v_next), v_next)
    not_term = (~term).to(rewards.dtype)
    not_done = (~(term | trunc)).to(rewards.dtype)
    deltas = rewards + gamma * not_term * v_next - v
    advantages = torch.zeros_like(rewards)
    carry = torch.zeros_like(rewards[0])
    for t in range(T - 1, -1, -1):
        carry = torch.where(ok[t], deltas[t] + gamma * gae_lambda * not_done[t] * carry, 0.0)
        advantages[t] = carry
    return advantages, advantages + v


def grpo(
    rewards: Tensor,
    groups: int | Tensor,
    *,
    valid: Tensor | None = None,
    std_normalize: bool = True,
    eps: float = 1e-6,
) -> tuple[Tensor, Tensor]:
    """Group-relative advantages (GRPO, Shao et al. 2024, "DeepSeekMath", section 4.1.2,
    outcome supervision): each rollout's score minus its group's mean, optionally divided by
    the group's standard deviation. A group is the G rollouts that share an initial state.

    Each env column is one trajectory (fixed-length episodes, ``env.ignore_terminations``, or
    steps after the episode's end marked invalid). A group of size 1 has no baseline and gets
    advantage 0.

    Args:
        rewards: (N,) float episode scores, or (T, N) per-step rewards whose valid steps are
            summed (undiscounted) into the score.
        groups: int G (envs ``[g*G, (g+1)*G)`` form a group; N must be a multiple of G) or a
            (N,) integer tensor of group ids (any values, any sizes).
        valid: (T, N) bool mask of steps that count (only with (T, N) rewards); None = all.
        std_normalize: divide by the group's unbiased standard deviation (+ ``eps``); the
            "Dr. GRPO" variant turns this off.
        eps: added to the standard deviation, so that a group with equal scores gets 0.

    Returns:
        ``(advantages, returns)`` of the rewards' shape: the normalised score and the raw score
        of each rollout, broadcast over T for (T, N) rewards (0 advantage on invalid steps).

    Raises:
        ValueError: for a bad shape or an N that is not a multiple of G.
    """
    if rewards.dim() == 2:
        ok = _valid(valid, rewards)
        scores = torch.where(ok, rewards, 0.0).sum(0)
    elif rewards.dim() == 1:
        if valid is not None:
            raise ValueError("valid only applies to per-step (T, N) rewards; drop it for (N,).")
        scores, ok = rewards, None
    else:
        raise ValueError(f"rewards must be (N,) or (T, N); got {tuple(rewards.shape)}.")
    index, num_groups = group_index(groups, scores.shape[0], scores.device)
    mean, counts = group_mean(scores, index, num_groups)
    centred = scores - mean
    if std_normalize:
        sq, _ = group_mean(centred**2, index, num_groups)
        var = sq * counts / (counts - 1).clamp_min(1.0)
        centred = centred / (var.sqrt() + eps)
    adv = torch.where(counts > 1, centred, 0.0)
    if ok is None:
        return adv, scores
    return torch.where(ok, adv.expand_as(rewards), 0.0), scores.expand_as(rewards).clone()


def reinforce_pp(
    rewards: Tensor,
    terminations: Tensor,
    truncations: Tensor | None = None,
    *,
    valid: Tensor | None = None,
    gamma: float = 1.0,
    eps: float = 1e-8,
) -> tuple[Tensor, Tensor]:
    """REINFORCE++ advantages (Hu 2025, "REINFORCE++: A Simple and Efficient Approach for
    Aligning Large Language Models", section 3): critic-free discounted returns-to-go,
    normalised with the mean and standard deviation of the whole batch (not per group).

    ``G_t = r_t + gamma * (1 - done_t) * G_{t+1}``, ``done = term | trunc`` (no critic, so a
    truncation does not bootstrap and the return of a trajectory still running at T is
    partial). Invalid steps get ``G_t = 0``, cut the recursion and are left out of the
    statistics. The standard deviation is the population one over valid entries.

    Args:
        rewards: (T, N) float.
        terminations: (T, N) bool.
        truncations: (T, N) bool; None = never.
        valid: (T, N) bool, False on ignored NEXT_STEP reset steps; None = all valid.
        gamma: discount per policy query (1.0 in the paper's outcome-reward setting).
        eps: added to the standard deviation.

    Returns:
        ``(advantages (T, N), returns (T, N))``; advantages are 0 on invalid steps.

    Raises:
        ValueError: on inconsistent shapes.
    """
    if rewards.dim() != 2:
        raise ValueError(f"rewards must be (T, N); got {tuple(rewards.shape)}.")
    done = _flags(terminations, rewards, "terminations") | _flags(
        truncations, rewards, "truncations"
    )
    ok = _valid(valid, rewards)
    not_done = (~done).to(rewards.dtype)
    returns = torch.zeros_like(rewards)
    carry = torch.zeros_like(rewards[0])
    for t in range(rewards.shape[0] - 1, -1, -1):
        carry = torch.where(ok[t], rewards[t] + gamma * not_done[t] * carry, 0.0)
        returns[t] = carry
    okf = ok.to(rewards.dtype)
    count = okf.sum().clamp_min(1.0)
    mean = (returns * okf).sum() / count
    std = (((returns - mean) ** 2 * okf).sum() / count).sqrt()
    advantages = torch.where(ok, (returns - mean) / (std + eps), 0.0)
    return advantages, returns


# --------------------------------------------------------------------------------------------
# Registered estimators: ``fn(RolloutBatch, AlgorithmConfig) -> Advantages`` (batch.py)
# --------------------------------------------------------------------------------------------
@register_advantage("gae")
def gae_estimator(batch: RolloutBatch, cfg) -> Advantages:
    """:func:`gae` on a rollout (``algorithm.gamma``, ``gae_lambda``, ``bootstrap_terminations``,
    ``normalize_advantages``).

    With ``bootstrap_terminations`` every episode end bootstraps from its final observation's
    value (terminations are treated as truncations), as ManiSkill's PPO baselines do.

    Raises:
        ValueError: if the batch has no critic values (use a critic-free estimator).
    """
    if batch.values is None:
        raise ValueError(
            "algorithm.advantage=gae needs critic values; build the policy with a critic "
            "(policy.critic=true) or use advantage grpo or reinforce_pp."
        )
    term, trunc = batch.terminations, batch.truncations
    if cfg.bootstrap_terminations:
        term, trunc = torch.zeros_like(term), term | trunc
    adv, ret = gae(batch.rewards, batch.values, term, trunc, valid=batch.valid,
                   gamma=cfg.gamma, gae_lambda=cfg.gae_lambda)
    return Advantages(adv, ret, batch.valid, minibatch_normalize=cfg.normalize_advantages)


@register_advantage("grpo")
def grpo_estimator(batch: RolloutBatch, cfg) -> Advantages:
    """:func:`grpo` over the rollout's groups (``batch.group_ids``; each env column is one
    episode), with DAPO dynamic sampling when ``algorithm.filter_low`` / ``filter_high`` is set:
    groups whose success rate lies outside the band are dropped from ``valid``.

    Raises:
        ValueError: if the batch has no ``group_ids``, or dynamic sampling is asked for without
            ``success``.
    """
    if batch.group_ids is None:
        raise ValueError("algorithm.advantage=grpo needs group ids (envs sharing a reset seed).")
    adv, ret = grpo(batch.rewards, batch.group_ids, valid=batch.valid,
                    std_normalize=cfg.grpo_std_normalize)
    valid = batch.valid
    if cfg.filter_low is not None or cfg.filter_high is not None:
        if batch.success is None:
            raise ValueError("algorithm.filter_low/high need per-step success in the rollout.")
        keep = get_filter("dynamic_sampling")(
            batch.success.any(0).float(), batch.group_ids,
            low=0.0 if cfg.filter_low is None else cfg.filter_low,
            high=1.0 if cfg.filter_high is None else cfg.filter_high,
        )
        valid = valid & keep.bool().unsqueeze(0)
    return Advantages(adv, ret, valid)


@register_advantage("reinforce_pp")
def reinforce_pp_estimator(batch: RolloutBatch, cfg) -> Advantages:
    """:func:`reinforce_pp` on a rollout (``algorithm.gamma``)."""
    adv, ret = reinforce_pp(batch.rewards, batch.terminations, batch.truncations,
                            valid=batch.valid, gamma=cfg.gamma)
    return Advantages(adv, ret, batch.valid)
