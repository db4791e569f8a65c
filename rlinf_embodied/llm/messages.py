"""Typed messages between the reasoning workers (rollout -> reward -> actor).

Streams end with an explicit :class:`EndOfStream` per producer, never with an item count
agreed in advance; the consumer knows how many producers feed it (topology), not how many
responses will come.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional

__all__ = ["PromptRequest", "Response", "ResponseBatch", "EndOfStream"]


@dataclass
class PromptRequest:
    """One prompt of a step, to be answered ``group_size`` times.

    Attributes:
        group: group id within the step (the prompt's index among the step's prompts).
        uid: problem id.
        prompt_ids: token ids of the formatted prompt.
        answer: reference answer.
    """

    group: int
    uid: str
    prompt_ids: List[int]
    answer: str


@dataclass
class Response:
    """One sampled response with everything the reward and actor workers need.

    Attributes:
        group, uid, answer: from the :class:`PromptRequest`.
        sample: index within its group, 0..G-1.
        prompt_ids, response_ids, logprobs, finish_reason, version: from the backend's
            :class:`~rlinf_embodied.llm.backends.Generation` (logprobs at temperature 1).
        reward: verifier score (NaN until the reward worker sets it).
        text: decoded response text (set by the reward worker).
        ref_logprobs: reference-model log-probs of the response tokens (set by the actor as
            the micro-batch arrives, when ``algorithm.kl_coef > 0``).
    """

    group: int
    uid: str
    answer: str
    sample: int
    prompt_ids: List[int]
    response_ids: List[int]
    logprobs: List[float]
    finish_reason: str
    version: int
    reward: float = float("nan")
    text: str = ""
    ref_logprobs: Optional[List[float]] = None

    def key(self) -> tuple:
        """Order-independent identity (group, sample)."""
        return (self.group, self.sample)


@dataclass
class ResponseBatch:
    """A micro-batch of responses of step ``step``."""

    step: int
    responses: List[Response] = field(default_factory=list)


@dataclass
class EndOfStream:
    """The producer ``producer`` sent everything it had for step ``step`` (``count`` responses)."""

    step: int
    producer: str
    count: int
