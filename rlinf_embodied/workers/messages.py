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
from typing import Any, Dict, Optional

import torch

__all__ = ["EndOfStream", "PolicyReply", "PolicyRequest"]


@dataclasses.dataclass
class PolicyRequest:
    """One policy query of one env stream (N envs).

    Attributes:
        obs: The observation batch of the stream (the BatchedEnv obs dict, N envs).
        seed: Sampling seed of this query (:func:`~rlinf_embodied.workers.env_worker.request_seed`),
            so the same query gets the same actions on any rank and in any batch.
        reply: Key of the reply on the ``actions`` channel.
        mode: ``"sample"`` or ``"greedy"``.
        values_only: Answer with the value estimates only (bootstrap after the last step).
    """

    obs: Dict[str, Any]
    seed: int
    reply: str
    mode: str = "sample"
    values_only: bool = False

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
            (None for ``values_only``).
    """

    actions: Optional[torch.Tensor] = None
    logprobs: Optional[torch.Tensor] = None
    values: Optional[torch.Tensor] = None
    forward_inputs: Optional[Dict[str, torch.Tensor]] = None


@dataclasses.dataclass(frozen=True)
class EndOfStream:
    """A producer sends nothing more on this key for the current call.

    Attributes:
        source: The producer, e.g. ``"env[0]"`` (in errors and traces).
    """

    source: str
