"""The typed inputs and outputs of registered advantage estimators and losses.

One signature per kind, so that the training code never branches on algorithm names:

- an **advantage estimator** (``algorithm.advantage``) is
  ``fn(batch: RolloutBatch, cfg: AlgorithmConfig) -> Advantages``;
- a **loss** (``algorithm.loss``) is ``fn(batch: LossBatch, cfg: AlgorithmConfig) ->
  (loss scalar, metrics dict)``.

A new estimator or loss reads what it needs from the batch and its hyperparameters from the
config (add fields to :class:`~rlinf_embodied.config.AlgorithmConfig`, or subclass it), and
registers itself with :func:`~rlinf_embodied.algorithms.register_advantage` /
:func:`~rlinf_embodied.algorithms.register_loss`; no worker changes.

Shapes (DESIGN.md vocabulary): T steps (policy queries) per env, N envs (or sequences), B
samples of a minibatch; log-probs at the policy's granularity: (B, K, A) per token, (B, K) per
action, (B,) per chunk, or (B, L) per response token for language models.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Optional

import torch

__all__ = ["Advantages", "LossBatch", "RolloutBatch"]

Tensor = torch.Tensor


@dataclass
class RolloutBatch:
    """A time-major rollout of N envs over T steps: what advantage estimators read.

    Attributes:
        rewards: (T, N) float32, reward of each step.
        valid: (T, N) bool, steps that count (False on NEXT_STEP autoreset steps and on steps
            after a fixed-length episode's end).
        terminations: (T, N) bool, the task ended at this step (no future reward).
        truncations: (T, N) bool, a time limit or an error cut the episode (bootstrap).
        values: (T + 1, N) float32 critic values (row T: the value after the last step), or
            None without a critic.
        group_ids: (N,) int64 ids of the group each env belongs to (GRPO: envs sharing a reset
            seed), or None.
        success: (T, N) bool task success per step, or None.
    """

    rewards: Tensor
    valid: Tensor
    terminations: Tensor
    truncations: Tensor
    values: Optional[Tensor] = None
    group_ids: Optional[Tensor] = None
    success: Optional[Tensor] = None

    @classmethod
    def from_trajectories(cls, batch: Mapping[str, Tensor]) -> "RolloutBatch":
        """From the trajectory dict the env workers send (keys as the attribute names)."""
        return cls(
            rewards=batch["rewards"],
            valid=batch["valid"].bool(),
            terminations=batch["terminations"].bool(),
            truncations=batch["truncations"].bool(),
            values=batch.get("values"),
            group_ids=batch.get("group_ids"),
            success=batch.get("success"),
        )


@dataclass
class Advantages:
    """What an advantage estimator returns.

    Attributes:
        advantages: (T, N) float32 (0 where not valid).
        returns: (T, N) float32 value targets (or raw scores for critic-free methods).
        valid: (T, N) bool, the steps that enter the loss (an estimator may drop more, e.g.
            dynamic sampling).
        minibatch_normalize: normalise advantages per minibatch before the loss (GAE with
            ``algorithm.normalize_advantages``); False where the estimator already normalised
            (GRPO, REINFORCE++).
    """

    advantages: Tensor
    returns: Tensor
    valid: Tensor
    minibatch_normalize: bool = False


@dataclass
class LossBatch:
    """One (micro-)batch of B samples for a loss.

    Attributes:
        logprobs: current log-probs (with grad) at ``granularity``: (B, K, A), (B, K), (B,)
            or (B, L).
        old_logprobs: rollout-time log-probs, same shape.
        advantages: (B,) or a prefix of the log-probs' shape.
        mask: bool, a prefix of the log-probs' shape; which entries count.
        granularity: ``token``, ``action`` or ``chunk``: what one entry of ``logprobs`` is
            (``policy.logprob_granularity``); ``algorithm.ratio_level`` may ask for a coarser
            importance ratio.
        entropy: per-entry entropy at ``granularity``, or None.
        values: (B,) current critic values, or None (critic-free).
        returns: (B,) value targets, required with ``values``.
        old_values: (B,) rollout-time values (value clipping), or None.
        ref_logprobs: reference-policy log-probs like ``logprobs`` (KL penalty), or None.
    """

    logprobs: Tensor
    old_logprobs: Tensor
    advantages: Tensor
    mask: Tensor
    granularity: str = "action"
    entropy: Optional[Tensor] = None
    values: Optional[Tensor] = None
    returns: Optional[Tensor] = None
    old_values: Optional[Tensor] = None
    ref_logprobs: Optional[Tensor] = None
