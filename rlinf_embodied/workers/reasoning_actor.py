"""ReasoningActorWorker: trains the causal LM with GRPO/DAPO under FSDP2.

Each rank holds a shard (``fully_shard`` per decoder layer, then the root; gloo on CPU, nccl
on GPU) and receives the scored responses of the groups it owns (``group % actor ranks``) on
its ``scored`` key, micro-batch by micro-batch. While the stream is still running it computes
the reference model's log-probs of each arriving micro-batch (an unsharded frozen copy, so no
collective is needed: elastic pipelining); after every reward rank's :class:`EndOfStream` it
computes group-normalised advantages (registered estimator), applies the DAPO filters and runs
``update_epochs`` x ``num_minibatches`` optimizer steps. Ranks may own different numbers of
responses: micro-batch counts are equalised across ranks (padding with zero-weight dummy
passes) and loss denominators are global, so the sharded collectives line up and the result is
the mean over the whole minibatch.
"""

from __future__ import annotations

import math
import time
from typing import Dict, List, Optional

import torch
import torch.distributed as dist

from rlinf_embodied.llm.messages import EndOfStream, Response
from rlinf_embodied.runtime import Channel, Worker

__all__ = ["ReasoningActorWorker", "pack_responses", "token_logprobs"]


def pack_responses(seqs: List[List[int]], prompt_lens: List[int], pad_id: int, device="cpu"):
    """Right-pad B sequences for one forward pass.

    Returns:
        ``(ids (B, L) long, attention (B, L) long, response_mask (B, L-1) bool)``; position
        ``j`` of the shifted arrays predicts token ``j + 1``, so the response of sequence b
        occupies ``[prompt_lens[b] - 1, len_b - 1)``.
    """
    L = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), L), pad_id, dtype=torch.long)
    attn = torch.zeros((len(seqs), L), dtype=torch.long)
    mask = torch.zeros((len(seqs), L - 1), dtype=torch.bool)
    for b, (s, p) in enumerate(zip(seqs, prompt_lens)):
        ids[b, :len(s)] = torch.tensor(s)
        attn[b, :len(s)] = 1
        mask[b, p - 1:len(s) - 1] = True
    return ids.to(device), attn.to(device), mask.to(device)


def token_logprobs(model, ids, attn, with_entropy: bool = False):
    """Log-probs (B, L-1) of tokens 1..L-1 given their prefix (temperature 1), and the
    per-position entropy (B, L-1) when ``with_entropy``."""
    logits = model(input_ids=ids, attention_mask=attn).logits[:, :-1].float()
    logp = torch.log_softmax(logits, -1)
    lp = logp.gather(-1, ids[:, 1:, None]).squeeze(-1)
    ent = -(logp.exp() * logp).sum(-1) if with_entropy else None
    return lp, ent


def _scatter(values: List[List[float]], mask: torch.Tensor) -> torch.Tensor:
    """Place per-response lists into a (B, L-1) tensor at ``mask``'s True positions."""
    out = torch.zeros(mask.shape, dtype=torch.float32)
    flat = [v for row in values for v in row]
    out[mask.cpu()] = torch.tensor(flat, dtype=torch.float32)
    return out.to(mask.device)


class ReasoningActorWorker(Worker):
    """One rank of the reasoning actor group.

    Args:
        cfg: the reasoning job config.
        model_dir: local HF model directory (initial weights).
        scored: channel name from the reward workers.
        num_producers: reward ranks (each ends this rank's stream with one EndOfStream).
    """

    def __init__(self, cfg, model_dir: str, scored: str, num_producers: int):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.cfg, self.model_dir = cfg, model_dir
        torch.manual_seed(cfg.run.seed)
        dtype = getattr(torch, cfg.model.dtype)
        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype)
        if cfg.model.gradient_checkpointing:
            self.model.gradient_checkpointing_enable()
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        gc = self.model.generation_config
        self.pad_id = int(gc.pad_token_id if gc.pad_token_id is not None else self.tokenizer.eos_token_id)
        self.ref = None
        self.inp = Channel.connect(scored)
        self.scored_name = scored
        self.num_producers = num_producers
        self.optimizer: Optional[torch.optim.Optimizer] = None
        self.version = 0

    # -- setup / weights --------------------------------------------------------------------
    def setup(self) -> int:
        """Shard the model (FSDP2), build the optimizer and, with ``kl_coef > 0``, the frozen
        reference model. Call after the group's process group exists. Returns the version."""
        from torch.distributed.fsdp import CPUOffloadPolicy, fully_shard

        t = self.cfg.trainer
        self.model.to(self.torch_device)
        kw = {"offload_policy": CPUOffloadPolicy()} if t.offload else {}
        for layer in self.model.model.layers:
            fully_shard(layer, **kw)
        fully_shard(self.model, **kw)
        self.optimizer = self._new_optimizer(t.lr)
        if self.cfg.algorithm.kl_coef > 0:
            from transformers import AutoModelForCausalLM

            self.ref = AutoModelForCausalLM.from_pretrained(
                self.model_dir, dtype=getattr(torch, self.cfg.model.dtype)).to(self.torch_device).eval()
            self.ref.requires_grad_(False)
        return self.version

    def _new_optimizer(self, lr: float):
        return torch.optim.AdamW([p for p in self.model.parameters() if p.requires_grad], lr=lr,
                                 weight_decay=self.cfg.trainer.weight_decay)

    def full_state_dict(self) -> Optional[dict]:
        """Gather the unsharded weights (collective: call on every rank); rank 0 gets them."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        sd = get_model_state_dict(self.model, options=StateDictOptions(full_state_dict=True,
                                                                       cpu_offload=True))
        return sd if self.rank == 0 else None

    def publish_weights(self, trainable_only: bool = False) -> Optional[list]:
        """Put the full weights in the object store; rank 0 returns ``[ObjectRef]``."""
        import ray

        sd = self.full_state_dict()
        return None if sd is None else [ray.put(sd)]

    def save(self, directory: str) -> None:
        """Write the model in the HF layout (config, safetensors, tokenizer) to ``directory``."""
        sd = self.full_state_dict()
        if self.rank == 0:
            from transformers import AutoConfig, AutoModelForCausalLM

            plain = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(self.model_dir))
            plain.load_state_dict(sd, strict=False)
            plain.save_pretrained(directory, safe_serialization=True)
            self.tokenizer.save_pretrained(directory)

    # -- forward passes ---------------------------------------------------------------------
    def logprobs(self, sequences: List[List[int]], prompt_lens: List[int]) -> List[List[float]]:
        """Per-token log-probs of the response part of fixed sequences under the current
        (sharded) weights; collective, call on every rank with the same arguments."""
        with self.device_lock(), torch.no_grad():
            ids, attn, mask = pack_responses(sequences, prompt_lens, self.pad_id, self.torch_device)
            lp, _ = token_logprobs(self.model, ids, attn)
            return [lp[b][mask[b]].tolist() for b in range(len(sequences))]

    def _set_ref_logprobs(self, responses: List[Response]) -> None:
        with torch.no_grad():
            ids, attn, mask = pack_responses([r.prompt_ids + r.response_ids for r in responses],
                                             [len(r.prompt_ids) for r in responses], self.pad_id,
                                             self.torch_device)
            lp, _ = token_logprobs(self.ref, ids, attn)
            for b, r in enumerate(responses):
                r.ref_logprobs = lp[b][mask[b]].tolist()

    # -- training ---------------------------------------------------------------------------
    def train(self, step: int) -> Dict[str, float]:
        """Receive this step's scored responses (reference log-probs per micro-batch as they
        arrive), then update. Returns mean metrics (``train/...``)."""
        key = f"a{self.rank}"
        t0 = time.perf_counter()
        msg = self.inp.get(key=key)  # wait outside the lock: the rollout may still hold it
        parts: List[Response] = []
        done = 0
        with self.device_lock(consumes=[self.scored_name]):
            t_lock = time.perf_counter()
            while True:
                if isinstance(msg, EndOfStream):
                    done += 1
                else:
                    if self.ref is not None:
                        self._set_ref_logprobs(msg.responses)
                    parts.extend(msg.responses)
                if done == self.num_producers:
                    break
                msg = self.inp.get(key=key)
            t_update = time.perf_counter()
            metrics = self._update(parts, step)
            self.version += 1
        metrics["time/actor_stream_s"] = t_update - t_lock
        metrics["time/actor_update_s"] = time.perf_counter() - t_update
        metrics["time/actor_wait_s"] = t_lock - t0
        return metrics

    def _global(self, x: float, op=None) -> float:
        if not dist.is_initialized() or dist.get_world_size() == 1:
            return x
        t = torch.tensor([x], dtype=torch.float64)
        dist.all_reduce(t, op=op or dist.ReduceOp.SUM)
        return float(t)

    def _update(self, responses: List[Response], step: int) -> Dict[str, float]:
        from rlinf_embodied.algorithms import RolloutBatch, get_advantage, get_filter, get_loss
        from rlinf_embodied.algorithms.dapo import TokenLossBatch

        a, t = self.cfg.algorithm, self.cfg.trainer
        responses = sorted(responses, key=Response.key)  # arrival order never matters
        world = dist.get_world_size() if dist.is_initialized() else 1
        stats: Dict[str, float] = {"responses": float(len(responses))}
        batch: List[Response] = []
        adv = torch.zeros(0)
        if responses:
            rewards = torch.tensor([r.reward for r in responses], dtype=torch.float32)
            gids = torch.tensor([r.group for r in responses])
            n = len(responses)
            rb = RolloutBatch(rewards=rewards[None], valid=torch.ones(1, n, dtype=torch.bool),
                              terminations=torch.ones(1, n, dtype=torch.bool),
                              truncations=torch.zeros(1, n, dtype=torch.bool), group_ids=gids,
                              success=(rewards > 0.5)[None])
            est = get_advantage(a.advantage)(rb, a)  # one response = one one-step episode
            adv, keep = est.advantages[0], est.valid[0].clone()
            if a.dynamic_sampling:
                keep &= get_filter("nonuniform_groups")(rewards, gids)
            if a.overlong_filter:
                keep &= get_filter("complete")(torch.tensor([r.finish_reason == "length" for r in responses]))
            batch = [r for r, k in zip(responses, keep.tolist()) if k]
            adv = adv[keep]
            stats["kept"] = float(len(batch))
        if a.recompute_logprobs:
            old = self._equalised_logprobs(batch)
        else:
            old = [r.logprobs for r in batch]
        loss_fn = get_loss(a.loss)
        dev = self.torch_device
        gen = torch.Generator().manual_seed(self.cfg.run.seed * 100_003 + step * 101 + self.rank)
        sums: Dict[str, float] = {}
        n_steps = 0
        for _ in range(t.update_epochs):
            perm = torch.randperm(len(batch), generator=gen).tolist()
            for m in range(t.num_minibatches):
                idx = perm[m::t.num_minibatches]
                lens = [len(batch[i].response_ids) for i in idx]
                local_den = sum(lens) if a.loss_agg == "token_mean" else len(idx)
                den = self._global(float(local_den))
                micro = t.micro_batch_size
                n_micro = int(self._global(float(math.ceil(len(idx) / micro)), dist.ReduceOp.MAX)
                              if world > 1 else math.ceil(len(idx) / micro))
                self.optimizer.zero_grad(set_to_none=True)
                mb: Dict[str, float] = {}
                for k in range(n_micro):
                    sub = idx[k * micro:(k + 1) * micro]
                    if not sub:  # this rank has fewer: a zero-weight pass keeps collectives aligned
                        ids = torch.tensor([[self.pad_id, self.pad_id]], device=dev)
                        out = self.model(input_ids=ids).logits
                        (out.sum() * 0.0).backward()
                        continue
                    rs = [batch[i] for i in sub]
                    ids, attn, mask = pack_responses([r.prompt_ids + r.response_ids for r in rs],
                                                     [len(r.prompt_ids) for r in rs], self.pad_id, dev)
                    lp, ent = token_logprobs(self.model, ids, attn, with_entropy=a.entropy_coef > 0)
                    ref = _scatter([r.ref_logprobs for r in rs], mask) if self.ref is not None else None
                    loss, met = loss_fn(TokenLossBatch(
                        logprobs=lp, old_logprobs=_scatter([old[i] for i in sub], mask),
                        advantages=adv[sub].to(dev), mask=mask, ref_logprobs=ref, entropy=ent,
                        denominator=den), a)
                    (loss * world).backward()
                    w = len(sub) / max(1, len(idx))
                    for key, v in met.items():
                        mb[key] = mb.get(key, 0.0) + float(v) * (1.0 if key in ("policy_loss", "loss") else w)
                gn = torch.nn.utils.clip_grad_norm_(
                    [p for p in self.model.parameters() if p.requires_grad], t.max_grad_norm)
                gn = gn.full_tensor() if hasattr(gn, "full_tensor") else gn
                self.optimizer.step()
                mb["grad_norm"] = float(gn)
                for key, v in mb.items():
                    sums[key] = sums.get(key, 0.0) + v
                n_steps += 1
        out = {f"train/{k}": v / max(1, n_steps) for k, v in sums.items()}
        out.update({f"train/{k}": v for k, v in stats.items()})
        return out

    def _equalised_logprobs(self, batch: List[Response]) -> List[List[float]]:
        """Current-weight log-probs of ``batch`` in micro-batches, counts equalised over ranks."""
        micro = self.cfg.trainer.micro_batch_size
        world = dist.get_world_size() if dist.is_initialized() else 1
        n = math.ceil(len(batch) / micro)
        n = int(self._global(float(n), dist.ReduceOp.MAX)) if world > 1 else n
        out: List[List[float]] = []
        with torch.no_grad():
            for k in range(n):
                rs = batch[k * micro:(k + 1) * micro]
                if not rs:
                    self.model(input_ids=torch.tensor([[self.pad_id] * 2], device=self.torch_device))
                    continue
                ids, attn, mask = pack_responses([r.prompt_ids + r.response_ids for r in rs],
                                                 [len(r.prompt_ids) for r in rs], self.pad_id,
                                                 self.torch_device)
                lp, _ = token_logprobs(self.model, ids, attn)
                out += [lp[b][mask[b]].tolist() for b in range(len(rs))]
        return out

    # -- supervised warm-up -----------------------------------------------------------------
    def sft(self, steps: int) -> Dict[str, float]:
        """``trainer.sft_steps`` steps of next-token cross-entropy on the task's training
        solutions (prompt tokens masked out), before RL. Returns the first/last losses."""
        from rlinf_embodied.llm.tasks import format_prompt, load_problems

        t = self.cfg.trainer
        world = dist.get_world_size() if dist.is_initialized() else 1
        probs = load_problems(self.cfg.task, "train")
        eos = self.tokenizer.eos_token_id
        data = []
        for p in probs:
            prompt = format_prompt(self.tokenizer, self.cfg.task, p.question)
            target = list(self.tokenizer(p.solution, add_special_tokens=False)["input_ids"]) + [eos]
            data.append((prompt + target, len(prompt)))
        opt = self._new_optimizer(t.sft_lr)
        gen = torch.Generator().manual_seed(self.cfg.run.seed * 7 + 1)
        losses = []
        with self.device_lock():
            for s in range(steps):
                idx = torch.randint(len(data), (t.sft_batch_size,), generator=gen).tolist()
                mine = idx[self.rank::world]
                ids, attn, mask = pack_responses([data[i][0] for i in mine], [data[i][1] for i in mine],
                                                 self.pad_id, self.torch_device)
                den = self._global(float(mask.sum()))
                lp, _ = token_logprobs(self.model, ids, attn)
                loss = -(lp * mask).sum() / den
                opt.zero_grad(set_to_none=True)
                (loss * world).backward()
                torch.nn.utils.clip_grad_norm_(self.model.parameters(), t.max_grad_norm)
                opt.step()
                losses.append(self._global(loss.item()))
        return {"sft/loss_first": losses[0] if losses else float("nan"),
                "sft/loss_last": float(sum(losses[-10:]) / max(1, len(losses[-10:])))}

    def profile_train(self, batch: int) -> float:
        """Forward + backward of the loss on ``batch`` synthetic responses (scheduler
        profiling); no optimizer step. Returns peak device bytes (0 on CPU)."""
        from rlinf_embodied.workers.common import peak_bytes

        R = self.cfg.rollout.max_new_tokens
        seqs = [[1 + (i % 7)] * 8 + [2 + (i % 5)] * R for i in range(batch)]
        with self.device_lock():
            ids, attn, mask = pack_responses(seqs, [8] * batch, self.pad_id, self.torch_device)
            lp, _ = token_logprobs(self.model, ids, attn)
            (lp * mask).sum().backward()
            self.optimizer.zero_grad(set_to_none=True)
        return peak_bytes()

    def onload(self) -> None:
        if self.torch_device != "cpu" and not self.cfg.trainer.offload:
            from rlinf_embodied.workers.common import move_optimizer

            self.model.to(self.torch_device)
            move_optimizer(self.optimizer, self.torch_device)

    def offload(self) -> None:
        if self.torch_device != "cpu" and not self.cfg.trainer.offload:
            from rlinf_embodied.workers.common import move_optimizer

            self.model.to("cpu")
            move_optimizer(self.optimizer, "cpu")
