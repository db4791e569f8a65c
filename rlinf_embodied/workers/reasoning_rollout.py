"""ReasoningRolloutWorker: samples G responses per prompt with a generation backend.

Responses leave in micro-batches of ``rollout.micro_batch_size`` on the ``responses`` channel,
keyed by the reward rank that scores them, then one :class:`EndOfStream`. With
``rollout.pipelining`` they leave as soon as each finishes (the backend's
``generate_stream``), so reward and actor work on short responses while long ones are still
generating (elastic pipelining, RLinf paper 2.2/3.3); without it, after the whole batch.
"""

from __future__ import annotations

import time
from typing import Dict, List

from rlinf_embodied.llm.messages import EndOfStream, PromptRequest, Response, ResponseBatch
from rlinf_embodied.runtime import Channel, Worker, flush_puts

__all__ = ["ReasoningRolloutWorker", "long_tail_lengths", "rollout_seed"]


def rollout_seed(run_seed: int, step: int, rank: int) -> int:
    """Sampling seed of rollout rank ``rank`` at ``step`` (distinct per step and rank)."""
    return (run_seed * 1_000_003 + step * 7_919 + rank * 104_729) % (2**31 - 1)


def long_tail_lengths(n: int, alpha: float, max_len: int, seed: int) -> List[int]:
    """``n`` forced response lengths ``floor(X)``, ``X ~ Pareto(alpha)`` with scale 1 token
    (``P(len >= k) = k^-alpha``: alpha 1 gives half the responses 1 token, one in 48 at 48),
    clipped to ``[1, max_len]`` (``rollout.long_tail_alpha``)."""
    import numpy as np

    x = np.random.default_rng(seed).pareto(alpha, size=n) + 1.0
    return np.clip(np.floor(x), 1, max_len).astype(int).tolist()


class ReasoningRolloutWorker(Worker):
    """One rank of the reasoning rollout group.

    Args:
        cfg: :class:`~rlinf_embodied.reasoning.config.ReasoningJobConfig`.
        model_dir: local HF model directory.
        responses: name of the channel to the reward workers.
        num_reward_ranks: reward ranks; rollout rank k feeds reward rank ``k % num_reward_ranks``.
    """

    def __init__(self, cfg, model_dir: str, responses: str, num_reward_ranks: int):
        import dataclasses

        import torch

        from rlinf_embodied.llm.backends import make_backend

        self.cfg = cfg
        torch.manual_seed(cfg.run.seed)
        rc = cfg.rollout
        if rc.device is None:  # the worker's own device (placement), not "any visible GPU"
            rc = dataclasses.replace(rc, device=self.torch_device)
        self.backend = make_backend(rc.backend, model_dir, rc)
        self.out = Channel.connect(responses)
        self.key = f"w{self.rank % num_reward_ranks}"
        self.responses_name = responses

    @property
    def backend_name(self) -> str:
        return self.backend.name

    def responses_channel(self) -> str:
        """Name of the channel this rank sends its responses on (elastic rollout feeds it too)."""
        return self.responses_name

    def info(self) -> Dict[str, object]:
        """Backend name and loaded weight version."""
        return {"backend": self.backend.name, "version": self.backend.version}

    def load_weights(self, payload: list, version: int) -> int:
        """Load weights pulled through the object store (``payload = [ObjectRef]``); the
        backend updates in place. Returns the new version."""
        import ray

        state = payload[0]
        if isinstance(state, ray.ObjectRef):
            state = ray.get(state)
        self.backend.update_weights(state, version)
        return self.backend.version

    def generate(self, step: int, requests: List[PromptRequest]) -> Dict[str, float]:
        """Answer each request ``algorithm.group_size`` times; stream the responses out.

        Returns:
            ``responses``, ``tokens`` (generated), ``truncated``, ``generate_s`` (seconds).
        """
        r, G = self.cfg.rollout, self.cfg.algorithm.group_size
        prompts = [q.prompt_ids for q in requests for _ in range(G)]
        kw = dict(max_new_tokens=r.max_new_tokens, temperature=r.temperature, top_p=r.top_p,
                  seed=rollout_seed(self.cfg.run.seed, step, self.rank))
        if r.long_tail_alpha is not None:
            kw["response_lengths"] = long_tail_lengths(len(prompts), r.long_tail_alpha,
                                                     r.max_new_tokens, kw["seed"])
        stats = {"responses": 0.0, "tokens": 0.0, "truncated": 0.0}
        t0 = time.perf_counter()
        with self.device_lock():
            gens = (self.backend.generate_stream(prompts, **kw) if r.pipelining
                    else self.backend.generate(prompts, **kw))
            buf: List[Response] = []
            for g in gens:
                q = requests[g.index // G]
                buf.append(Response(q.group, q.uid, q.answer, g.index % G, g.prompt_ids,
                                    g.response_ids, g.logprobs, g.finish_reason, g.version))
                stats["responses"] += 1
                stats["tokens"] += len(g.response_ids)
                stats["truncated"] += g.finish_reason == "length"
                if len(buf) == r.micro_batch_size:
                    self.out.put(ResponseBatch(step, buf), key=self.key)
                    buf = []
            if buf:
                self.out.put(ResponseBatch(step, buf), key=self.key)
            self.out.put(EndOfStream(step, self.name, int(stats["responses"])), key=self.key)
            flush_puts()
        stats["generate_s"] = time.perf_counter() - t0
        return stats

    def evaluate(self, requests: List[PromptRequest], greedy: bool = True,
                 max_new_tokens: int | None = None) -> List[Response]:
        """One response per request (greedy by default), returned to the caller."""
        r = self.cfg.rollout
        with self.device_lock():
            gens = list(self.backend.generate_stream(
                [q.prompt_ids for q in requests], max_new_tokens=max_new_tokens or r.max_new_tokens,
                temperature=r.temperature, top_p=r.top_p, seed=12345, greedy=greedy))
        return [Response(requests[g.index].group, requests[g.index].uid, requests[g.index].answer,
                         0, g.prompt_ids, g.response_ids, g.logprobs, g.finish_reason, g.version)
                for g in sorted(gens, key=lambda g: g.index)]

    def score(self, sequences: List[List[int]], prompt_lens: List[int]) -> List[List[float]]:
        """The backend's per-token log-probs of fixed sequences (see GenerationBackend.score)."""
        with self.device_lock():
            return self.backend.score(sequences, prompt_lens)

    def profile_generate(self, batch: int) -> float:
        """Generate for ``batch`` synthetic prompts (scheduler profiling); peak device bytes."""
        from rlinf_embodied.workers.common import peak_bytes

        r = self.cfg.rollout
        prompts = [[1 + (i % 7)] * 8 for i in range(batch)]
        lengths = (None if r.long_tail_alpha is None else  # the lengths the job will generate
                   long_tail_lengths(batch, r.long_tail_alpha, r.max_new_tokens, 0))
        with self.device_lock():
            self.backend.generate(prompts, max_new_tokens=r.max_new_tokens, temperature=1.0,
                                  top_p=1.0, seed=0, response_lengths=lengths)
        return peak_bytes()

    def onload(self) -> None:
        self.backend.wake_up()

    def offload(self) -> None:
        self.backend.sleep()
