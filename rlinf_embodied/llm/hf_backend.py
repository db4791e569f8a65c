"""HF transformers generation backend (works everywhere; the default on CPU).

Decoding is a plain KV-cache loop over ``Qwen2ForCausalLM``-style models instead of
``model.generate``: ``generate`` has no per-sequence streaming for batches, and the loop lets a
finished response leave as soon as it emits EOS (elastic pipelining) while the others go on.
Prompts are left-padded with explicit position ids, so a batched prompt sees the same
positions as an unpadded one.
"""

from __future__ import annotations

from typing import Dict, Iterator, List

import torch

from rlinf_embodied.llm.backends import Generation, GenerationBackend

__all__ = ["HFBackend", "position_seed", "response_logprobs"]


def response_logprobs(model, sequences: List[List[int]], prompt_lens: List[int], pad_id: int,
                      device="cpu") -> List[List[float]]:
    """Per-token log-probs (temperature 1) of each sequence's response part, one forward.

    Sequences are right-padded, so every real token sees exactly its unpadded context.
    Shapes: B sequences of length L_b; returns B lists of length ``L_b - prompt_lens[b]``.
    """
    ids, mask = _right_pad(sequences, pad_id, device)
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask).logits.float()
    lp = torch.log_softmax(logits[:, :-1], -1).gather(-1, ids[:, 1:, None]).squeeze(-1)
    return [lp[b, p - 1:len(s) - 1].tolist() for b, (s, p) in enumerate(zip(sequences, prompt_lens))]


def _right_pad(seqs: List[List[int]], pad_id: int, device):
    L = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), L), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), L), dtype=torch.long)
    for b, s in enumerate(seqs):
        ids[b, :len(s)] = torch.tensor(s)
        mask[b, :len(s)] = 1
    return ids.to(device), mask.to(device)


def _nucleus(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """Zero the tail of each row of ``probs`` (B, V) outside the top-p mass, renormalise."""
    if top_p >= 1.0:
        return probs
    sorted_p, idx = probs.sort(-1, descending=True)
    drop = sorted_p.cumsum(-1) - sorted_p > top_p
    sorted_p = sorted_p.masked_fill(drop, 0.0)
    out = torch.zeros_like(probs).scatter(-1, idx, sorted_p)
    return out / out.sum(-1, keepdim=True)


def position_seed(seed: int, position: int) -> int:
    """Seed of the sampling generator for response token ``position`` (0-based) of a response
    whose own seed is ``seed``: a pure function of both, so a response continued from its first
    ``position`` tokens on any worker draws the same next token as one that never stopped."""
    return (int(seed) * 1_000_003 + int(position) * 7_919 + 1) % (2**63 - 1)


class HFBackend(GenerationBackend):
    """transformers ``AutoModelForCausalLM`` decoded by a batched KV-cache loop.

    Args:
        model_dir: local HF model directory.
        cfg: :class:`~rlinf_embodied.reasoning.config.ReasoningRolloutConfig` (``dtype``,
            ``max_batch_size``; ``device`` attribute if present, else CUDA when visible).
    """

    name = "hf"

    def __init__(self, model_dir: str, cfg):
        super().__init__(model_dir, cfg)
        from transformers import AutoConfig, AutoModelForCausalLM

        self.device = torch.device(getattr(cfg, "device", None)
                                   or ("cuda:0" if torch.cuda.is_available() else "cpu"))
        dtype = getattr(torch, getattr(cfg, "dtype", "float32"))
        self.model = AutoModelForCausalLM.from_pretrained(
            model_dir, dtype=dtype, attn_implementation="eager").to(self.device).eval()
        mc = AutoConfig.from_pretrained(model_dir)
        eos = self.model.generation_config.eos_token_id
        if eos is None:
            eos = mc.eos_token_id
        self.eos_ids = set(eos if isinstance(eos, (list, tuple)) else [eos])
        pad = self.model.generation_config.pad_token_id
        self.pad_id = int(pad if pad is not None else min(self.eos_ids))
        self.max_batch_size = int(getattr(cfg, "max_batch_size", 256))
        import inspect  # transformers >= 5.24 renamed past_key_values to cache

        params = inspect.signature(type(self.model).forward).parameters
        self._cache_kw = "cache" if "cache" in params else "past_key_values"
        self._version = 0

    @property
    def version(self) -> int:
        return self._version

    def sleep(self) -> None:
        if self.device.type != "cpu":
            self.model.to("cpu")

    def wake_up(self) -> None:
        if self.device.type != "cpu":
            self.model.to(self.device)

    def update_weights(self, state_dict: Dict[str, torch.Tensor], version: int) -> None:
        missing, unexpected = self.model.load_state_dict(
            {k: v.to(self.device) for k, v in state_dict.items()}, strict=False)
        unexpected = [k for k in unexpected if k != "lm_head.weight"]
        missing = [k for k in missing if k != "lm_head.weight"]
        if missing or unexpected:
            raise KeyError(f"weights do not match the rollout model: missing {missing[:5]}, "
                           f"unexpected {unexpected[:5]}")
        if getattr(self.model.config, "tie_word_embeddings", False):
            self.model.tie_weights()
        self._version = int(version)

    def score(self, sequences: List[List[int]], prompt_lens: List[int]) -> List[List[float]]:
        out: List[List[float]] = []
        for i in range(0, len(sequences), self.max_batch_size):
            out += response_logprobs(self.model, sequences[i:i + self.max_batch_size],
                                     prompt_lens[i:i + self.max_batch_size], self.pad_id,
                                     self.device)
        return out

    def generate(self, prompt_ids, *, max_new_tokens, temperature, top_p, seed, greedy=False,
                 response_lengths=None):
        gens = list(self.generate_stream(prompt_ids, max_new_tokens=max_new_tokens,
                                         temperature=temperature, top_p=top_p, seed=seed,
                                         greedy=greedy, response_lengths=response_lengths))
        return sorted(gens, key=lambda g: g.index)

    def generate_stream(self, prompt_ids, *, max_new_tokens, temperature, top_p, seed,
                        greedy: bool = False, response_lengths=None) -> Iterator[Generation]:
        for start in range(0, len(prompt_ids), self.max_batch_size):
            chunk = prompt_ids[start:start + self.max_batch_size]
            lengths = None if response_lengths is None else response_lengths[start:start + len(chunk)]
            for g in self._decode(chunk, max_new_tokens, temperature, top_p, seed + start, greedy,
                                  lengths):
                g.index += start
                yield g

    @torch.no_grad()
    def _decode(self, prompts: List[List[int]], max_new_tokens: int, temperature: float,
                top_p: float, seed: int, greedy: bool, lengths=None) -> Iterator[Generation]:
        from transformers import DynamicCache

        B, L, dev = len(prompts), max(len(p) for p in prompts), self.device
        ids = torch.full((B, L), self.pad_id, dtype=torch.long)
        mask = torch.zeros((B, L), dtype=torch.long)
        for b, p in enumerate(prompts):
            ids[b, L - len(p):] = torch.tensor(p)
            mask[b, L - len(p):] = 1
        ids, mask = ids.to(dev), mask.to(dev)
        pos = (mask.cumsum(-1) - 1).clamp(min=0)
        gen = torch.Generator(device=dev).manual_seed(int(seed))
        cache = DynamicCache()
        logits = self.model(input_ids=ids, attention_mask=mask, position_ids=pos,
                            use_cache=True, **{self._cache_kw: cache}).logits[:, -1].float()
        next_pos = pos[:, -1:] + 1
        done = [False] * B
        resp: List[List[int]] = [[] for _ in range(B)]
        lps: List[List[float]] = [[] for _ in range(B)]
        eos = torch.tensor(sorted(self.eos_ids), device=dev)
        lens_t = None if lengths is None else torch.tensor(lengths, device=dev)
        for t in range(max_new_tokens):
            logp = torch.log_softmax(logits, -1)
            if lens_t is not None:  # forced lengths: no EOS before the response's length
                logits = logits.clone()
                logits[(lens_t > t).nonzero()[:, :1], eos[None]] = float("-inf")
            if greedy:
                tok = logits.argmax(-1)
            else:
                probs = _nucleus(torch.softmax(logits / temperature, -1), top_p)
                tok = torch.multinomial(probs, 1, generator=gen).squeeze(-1)
            tok_lp = logp.gather(-1, tok[:, None]).squeeze(-1).tolist()
            toks = tok.tolist()
            for b in range(B):
                if done[b]:
                    continue
                resp[b].append(toks[b])
                lps[b].append(tok_lp[b])
                stop = toks[b] in self.eos_ids
                if stop or t == max_new_tokens - 1 or (lengths is not None and t == lengths[b] - 1):
                    done[b] = True
                    yield Generation(list(prompts[b]), resp[b], lps[b],
                                     "stop" if stop else "length", self._version, b)
            if all(done):
                return
            mask = torch.cat([mask, torch.ones((B, 1), dtype=mask.dtype, device=dev)], -1)
            logits = self.model(input_ids=tok[:, None], attention_mask=mask,
                                position_ids=next_pos, use_cache=True,
                                **{self._cache_kw: cache}).logits[:, -1].float()
            next_pos = next_pos + 1

    @torch.no_grad()
    def continue_response(self, prompt_ids: List[int], prefix_ids: List[int], *, num_tokens: int,
                          max_new_tokens: int, temperature: float, top_p: float, seed: int,
                          greedy: bool = False):
        """Generate up to ``num_tokens`` more tokens of one response, continuing ``prefix_ids``.

        Batch-invariant and resumable: the response decodes alone (batch of 1, no padding;
        prompt + prefix in one prefill forward) and token t is drawn with a generator seeded
        by :func:`position_seed` ``(seed, t)``. Continuing a response in pieces of any sizes on
        any process with the same weights, dtype and thread count therefore gives the same
        tokens and bit-identical log-probs, provided every piece starts at the same positions
        (a piece boundary changes the prefill, which changes the last bits of the logits).

        Args:
            prompt_ids: the prompt's P token ids.
            prefix_ids: the R0 response tokens generated so far (may be empty; must not end with
                EOS, and R0 < ``max_new_tokens``).
            num_tokens: most tokens to generate now (>= 1).
            max_new_tokens: response length limit R_max.
            temperature, top_p, greedy: as :meth:`generate`.
            seed: the response's own sampling seed.

        Returns:
            ``(new_ids, new_logprobs, finish_reason)``: the new tokens, their temperature-1
            log-probs (floats), and ``"stop"`` / ``"length"`` if the response ended, else None.

        Raises:
            ValueError: if the prefix is already finished or ``num_tokens < 1``.
        """
        from transformers import DynamicCache

        r0 = len(prefix_ids)
        if num_tokens < 1 or r0 >= max_new_tokens or (prefix_ids and prefix_ids[-1] in self.eos_ids):
            raise ValueError(f"nothing to continue: num_tokens={num_tokens}, prefix of {r0} tokens "
                             f"(max_new_tokens={max_new_tokens}); only pass unfinished responses.")
        dev = self.device
        ids = torch.tensor([list(prompt_ids) + list(prefix_ids)], dtype=torch.long, device=dev)
        cache = DynamicCache()
        logits = self.model(input_ids=ids, use_cache=True,
                            **{self._cache_kw: cache}).logits[:, -1].float()
        pos = ids.shape[1]
        new, lps = [], []
        for t in range(r0, min(max_new_tokens, r0 + num_tokens)):
            logp = torch.log_softmax(logits, -1)
            if greedy:
                tok = logits.argmax(-1)
            else:
                gen = torch.Generator(device=dev).manual_seed(position_seed(seed, t))
                probs = _nucleus(torch.softmax(logits / temperature, -1), top_p)
                tok = torch.multinomial(probs, 1, generator=gen).squeeze(-1)
            new.append(int(tok))
            lps.append(float(logp[0, new[-1]]))
            if new[-1] in self.eos_ids:
                return new, lps, "stop"
            if t == max_new_tokens - 1:
                return new, lps, "length"
            if t + 1 < r0 + num_tokens:
                logits = self.model(input_ids=tok[:, None],
                                    position_ids=torch.tensor([[pos]], device=dev), use_cache=True,
                                    **{self._cache_kw: cache}).logits[:, -1].float()
                pos += 1
        return new, lps, None
