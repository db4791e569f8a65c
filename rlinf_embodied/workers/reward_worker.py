"""RewardWorker: scores responses with the rule-based verifier and forwards them to the actor.

It consumes its key ``"w<rank>"`` of the ``responses`` channel micro-batch by micro-batch until
every rollout rank that feeds it has sent its :class:`EndOfStream`, decodes and verifies each
response (math-verify), adds the DAPO overlong penalty when configured, and puts each group's
responses on the ``scored`` channel under the key of the actor rank that trains that group
(``"a<group % actor ranks>"``), so a group's G responses always meet on one actor rank. It
needs no accelerator and never takes the device lock, so under collocated placement it scores
while the rollout still holds the devices.
"""

from __future__ import annotations

import time
from typing import Dict, List

from rlinf_embodied.llm.messages import EndOfStream, Response, ResponseBatch
from rlinf_embodied.runtime import Channel, Worker, flush_puts

__all__ = ["RewardWorker"]


class RewardWorker(Worker):
    """One rank of the reward group.

    Args:
        cfg: the reasoning job config.
        model_dir: model directory (its tokenizer decodes the responses).
        responses: channel name from the rollout workers.
        scored: channel name to the actor workers.
        num_producers: rollout ranks feeding this rank (each ends with one EndOfStream).
        num_actor_ranks: actor ranks (destination keys ``a0 ...``).
    """

    def __init__(self, cfg, model_dir: str, responses: str, scored: str, num_producers: int,
                 num_actor_ranks: int):
        from transformers import AutoTokenizer

        self.cfg = cfg
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        self.inp = Channel.connect(responses)
        self.out = Channel.connect(scored)
        self.num_producers = num_producers
        self.num_actor_ranks = num_actor_ranks

    def set_num_producers(self, n: int) -> None:
        """Rollout ranks that feed this rank (set by the launcher from the topology)."""
        self.num_producers = int(n)

    def score_responses(self, responses: List[Response]) -> List[Response]:
        """Set ``text`` and ``reward`` of each response (in place) and return them."""
        import torch

        from rlinf_embodied.algorithms.dapo import overlong_reward_penalty
        from rlinf_embodied.llm.verifier import verify

        a = self.cfg.algorithm
        for r in responses:
            r.text = self.tokenizer.decode(r.response_ids, skip_special_tokens=True)
            r.reward = verify(r.text, r.answer)
        if a.overlong_buffer > 0 and responses:
            lengths = torch.tensor([len(r.response_ids) for r in responses])
            pen = overlong_reward_penalty(lengths, self.cfg.rollout.max_new_tokens,
                                          a.overlong_buffer, a.overlong_penalty_factor)
            for r, p in zip(responses, pen.tolist()):
                r.reward += p
        return responses

    def profile_score(self, batch: int) -> float:
        """Verify ``batch`` synthetic responses (scheduler profiling). Returns 0 (no device)."""
        fake = [Response(i, "p", str(i), 0, [1], [2, 3], [0.0, 0.0], "stop", 0) for i in range(batch)]
        self.score_responses(fake)
        return 0.0

    def score(self, step: int) -> Dict[str, float]:
        """Score this step's stream and forward it. Returns ``responses``, ``reward_sum``,
        ``correct`` and ``verify_s``."""
        done, n, total, correct, busy = 0, 0, 0.0, 0, 0.0
        sent = [0] * self.num_actor_ranks
        while done < self.num_producers:
            msg = self.inp.get(key=f"w{self.rank}")
            if isinstance(msg, EndOfStream):
                done += 1
                continue
            t0 = time.perf_counter()
            self.score_responses(msg.responses)
            busy += time.perf_counter() - t0
            by_actor: Dict[int, List[Response]] = {}
            for r in msg.responses:
                by_actor.setdefault(r.group % self.num_actor_ranks, []).append(r)
                n += 1
                total += r.reward
                correct += r.reward > 0.5
            for a, rs in by_actor.items():
                self.out.put(ResponseBatch(step, rs), key=f"a{a}")
                sent[a] += len(rs)
        for a in range(self.num_actor_ranks):
            self.out.put(EndOfStream(step, self.name, sent[a]), key=f"a{a}")
        flush_puts()
        return {"responses": float(n), "reward_sum": total, "correct": float(correct),
                "verify_s": busy}
