"""Generation backends for the reasoning rollout worker: one interface, HF or vLLM underneath.

A backend owns a causal LM loaded from a local HF model directory and answers four requests:
sample responses to token prompts (all at once or streamed as each finishes), swap in new
weights by version without a restart, and score fixed sequences. Log-probs are always those of
the *untempered* model distribution (temperature 1, no top-p) under the backend's current
weights, which is what the actor recomputes for the importance ratio.

``make_backend("hf", ...)`` returns :class:`rlinf_embodied.llm.hf_backend.HFBackend`;
``make_backend("vllm", ...)`` imports ``rlinf_embodied.llm.vllm_backend:VLLMBackend``
lazily (that module lives in the vLLM venv only).
"""

from __future__ import annotations

import abc
import importlib
from dataclasses import dataclass
from typing import Dict, Iterator, List, Optional

__all__ = ["Generation", "GenerationBackend", "make_backend", "BACKENDS"]


@dataclass
class Generation:
    """One sampled response.

    Attributes:
        prompt_ids: the prompt's token ids, length P.
        response_ids: the generated token ids, length R (includes the EOS token when
            ``finish_reason == "stop"``).
        logprobs: length R, log-prob of each response token under the backend's current weights
            at temperature 1 (the untempered model distribution), float.
        finish_reason: ``"stop"`` (EOS emitted) or ``"length"`` (hit ``max_new_tokens``).
        version: weight version that produced it (see :meth:`GenerationBackend.update_weights`).
        index: position of the prompt in the request (streams yield out of order).
    """

    prompt_ids: List[int]
    response_ids: List[int]
    logprobs: List[float]
    finish_reason: str
    version: int
    index: int = -1


class GenerationBackend(abc.ABC):
    """A causal LM that samples, scores, and takes weight updates in place.

    Args:
        model_dir: local HF model directory (config.json, weights, tokenizer files).
        cfg: the rollout section (:class:`rlinf_embodied.reasoning.config.ReasoningRolloutConfig`).
    """

    name: str = "abstract"
    """Backend name (``hf`` or ``vllm``), recorded in results files and logs."""

    def __init__(self, model_dir: str, cfg):
        self.model_dir = str(model_dir)
        self.cfg = cfg

    @abc.abstractmethod
    def generate(
        self,
        prompt_ids: List[List[int]],
        *,
        max_new_tokens: int,
        temperature: float,
        top_p: float,
        seed: int,
        greedy: bool = False,
        response_lengths: Optional[List[int]] = None,
    ) -> List[Generation]:
        """Sample one response per prompt (B prompts -> B generations, in prompt order).

        Args:
            prompt_ids: B token-id lists (no padding).
            max_new_tokens: response length limit R_max; a response that reaches it ends with
                ``finish_reason="length"``.
            temperature: sampling temperature (> 0); log-probs are still reported at 1.
            top_p: nucleus mass in (0, 1].
            seed: sampling seed; the same seed, prompts and weights give the same responses.
            greedy: argmax decoding (evaluation); ``temperature``/``top_p``/``seed`` are then
                ignored and ``logprobs`` are still those of the temperature-1 distribution.
            response_lengths: per prompt, the response is exactly this many tokens (B ints,
                at most ``max_new_tokens``): EOS is suppressed before it and the response
                ends there (``finish_reason="length"``); None lets the model decide. Forced
                long-tailed lengths for benchmarks (``rollout.long_tail_alpha``).
        """

    @abc.abstractmethod
    def generate_stream(self, prompt_ids: List[List[int]], **kwargs) -> Iterator[Generation]:
        """Like :meth:`generate` (same keyword arguments, ``greedy`` included), but yield each
        generation as soon as it finishes.

        Yields B generations in completion order (``Generation.index`` is the prompt position);
        for the same arguments the multiset of results equals :meth:`generate`'s.
        """

    @abc.abstractmethod
    def update_weights(self, state_dict: Dict[str, "object"], version: int) -> None:
        """Load ``state_dict`` (HF parameter names -> tensors) in place and set the version."""

    @abc.abstractmethod
    def score(self, sequences: List[List[int]], prompt_lens: List[int]) -> List[List[float]]:
        """Per-token log-probs of the response part of fixed sequences.

        Args:
            sequences: B token-id lists, prompt followed by response.
            prompt_lens: B prompt lengths P_b (>= 1).

        Returns:
            B lists; list b has ``len(sequences[b]) - prompt_lens[b]`` floats, the log-prob of
            each response token given everything before it, at temperature 1.
        """

    @property
    @abc.abstractmethod
    def version(self) -> int:
        """Weight version currently loaded (0 = the model directory's weights)."""

    def sleep(self) -> None:
        """Free device memory for another worker group on the same devices (collocated
        placement: called when the rollout worker offloads). Weights and version survive.
        Default: nothing."""

    def wake_up(self) -> None:
        """Undo :meth:`sleep` (called when the rollout worker onloads). Default: nothing."""

    def close(self) -> None:
        """Release the engine (no-op by default)."""


BACKENDS = {
    "hf": "rlinf_embodied.llm.hf_backend:HFBackend",
    "vllm": "rlinf_embodied.llm.vllm_backend:VLLMBackend",
}


def make_backend(name: str, model_dir: str, cfg) -> GenerationBackend:
    """Build backend ``name`` (``hf`` or ``vllm``, or a ``module:Class`` path) for ``model_dir``.

    Raises:
        ValueError: for an unknown name, listing the valid ones.
        ImportError: when the backend's library is missing, naming the venv to use.
    """
    path = BACKENDS.get(name, name if ":" in name else None)
    if path is None:
        raise ValueError(
            f"Unknown rollout backend {name!r}. Set rollout.backend to one of "
            f"{', '.join(sorted(BACKENDS))} or a module:Class path."
        )
    module, cls = path.split(":")
    try:
        mod = importlib.import_module(module)
    except ImportError as e:
        if name == "vllm":
            raise ImportError(
                f"rollout.backend=vllm needs vLLM ({e}); run inside the vLLM venv (see docs/reasoning.md) "
                f"or set rollout.backend=hf."
            ) from e
        raise
    return getattr(mod, cls)(model_dir, cfg)
