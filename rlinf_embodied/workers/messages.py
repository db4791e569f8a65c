"""Messages between the env and rollout workers of the embodied workflow (one module, typed).

Channels of one run (names in :class:`~rlinf_embodied.workers.env_worker.ChannelNames`):

* ``obs``, key ``"r<k>"`` (bound by rollout rank k): :class:`PolicyRequest` from the env ranks,
  closed by one :class:`EndOfStream` from every env rank at the end of each rollout or
  evaluation, so a rollout rank serves until every env rank is done instead of counting
  requests agreed in advance;
* ``actions``, key :attr:`PolicyRequest.reply` (bound by the asking env rank): one
  :class:`PolicyReply` per request;
* ``trajectories``, key ``"a<j>"`` (bound by actor rank j): trajectory dicts (see
  :mod:`rlinf_embodied.workers.env_worker`).

Shape vocabulary: N envs of the stream, K action chunk, A action dim.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, Optional, Tuple

import torch

__all__ = ["EndOfStream", "PolicyReply", "PolicyRequest", "drop_echoes", "restore_echoes"]


@dataclasses.dataclass
class PolicyRequest:
    """One policy query of one env stream (N envs).

    Attributes:
        obs: The observation batch of the stream (the BatchedEnv obs dict, N envs).
        seed: Sampling seed of this query (:func:`~rlinf_embodied.workers.common.request_seed`),
            so the same query gets the same actions on any rank and in any batch.
        reply: Key of the reply on the ``actions`` channel.
        mode: ``"sample"`` or ``"greedy"``.
        values_only: Answer with the value estimates only (bootstrap after the last step).
        row_seeds: Batch-invariant answer (evaluation, ``eval.batch_invariant``): the policy
            runs on each env's row alone (a batch of 1), row i under
            ``torch.manual_seed(row_seeds[i])``, so an env's actions do not depend on the
            batch it came in (:func:`~rlinf_embodied.policies.base.act_rows`); None answers
            the batch with one forward under ``seed``.
    """

    obs: Dict[str, Any]
    seed: int
    reply: str
    mode: str = "sample"
    values_only: bool = False
    row_seeds: Optional[Tuple[int, ...]] = None

    @property
    def num_envs(self) -> int:
        """N, the batch size of ``obs``."""
        for v in self.obs.values():
            return len(v)
        return 0


@dataclasses.dataclass
class PolicyReply:
    """The policy's answer to one :class:`PolicyRequest`.

    Attributes:
        actions: (N, K, A) in env units (None for a ``values_only`` request).
        logprobs: (N, K, A) or (N, K), float32 (None for ``values_only``).
        values: (N,) float32 value estimates, or None without a critic.
        forward_inputs: Tensors ``evaluate`` needs to recompute the log-probs, each (N, ...)
            (None for ``values_only``). On the wire it lacks the ``echoed`` keys.
        echoed: ``forward_inputs`` keys that are the request's own observation tensors (a state
            MLP's ``states``, a CNN's uint8 images): left out of the message and filled in by
            the asking env worker from the observation it sent (:func:`restore_echoes`), so an
            observation crosses the channel once per query, not twice. Safe because returned
            observations are never modified in place (the env contract, envs/vector.py).
    """

    actions: Optional[torch.Tensor] = None
    logprobs: Optional[torch.Tensor] = None
    values: Optional[torch.Tensor] = None
    forward_inputs: Optional[Dict[str, torch.Tensor]] = None
    echoed: Tuple[str, ...] = ()


def drop_echoes(reply: PolicyReply, obs: Dict[str, Any]) -> PolicyReply:
    """``reply`` without the ``forward_inputs`` entries that are ``obs``'s own tensors (the
    same objects), their keys listed in ``echoed``; the rollout side of :func:`restore_echoes`."""
    inputs = reply.forward_inputs
    if not inputs:
        return reply
    echoed = tuple(k for k, v in inputs.items() if obs.get(k) is v)
    if not echoed:
        return reply
    kept = {k: v for k, v in inputs.items() if k not in echoed}
    return dataclasses.replace(reply, forward_inputs=kept, echoed=echoed)


def restore_echoes(reply: PolicyReply, obs: Dict[str, Any]) -> PolicyReply:
    """``reply`` with its ``echoed`` entries put back from ``obs``, the observation batch of
    the request it answers (the env side of :func:`drop_echoes`).

    Raises:
        KeyError: If ``obs`` lacks an echoed key (a reply matched to the wrong request).
    """
    if not reply.echoed:
        return reply
    missing = [k for k in reply.echoed if k not in obs]
    if missing:
        raise KeyError(f"PolicyReply echoes observation keys {missing} that its request did not send.")
    inputs = {**{k: obs[k] for k in reply.echoed}, **(reply.forward_inputs or {})}
    return dataclasses.replace(reply, forward_inputs=inputs, echoed=())


@dataclasses.dataclass(frozen=True)
class EndOfStream:
    """A producer sends nothing more on this key for the current call.

    Attributes:
        source: The producer, e.g. ``"env[0]"`` (in errors and traces).
    """

    source: str
