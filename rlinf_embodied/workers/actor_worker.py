"""ActorWorker: trains the policy (and its critic / value head) with FSDP2.

Each rank holds a shard of the parameters (``fully_shard``, gloo on CPU, nccl on GPU), receives
the trajectories of its env ranks from the ``trajectories`` channel, computes advantages with
the registered estimator and optimises the registered loss over ``update_epochs`` epochs of
``num_minibatches`` minibatches, each accumulated over micro-batches of
``trainer.micro_batch_size`` samples. All ranks take the same number of optimizer steps (the
sharded collectives require it), and minibatch order is seeded by (run seed, iteration, rank).
"""

from __future__ import annotations

import math
import random
from pathlib import Path
from typing import Dict, Optional

import numpy as np
import torch
import torch.distributed as dist

from rlinf_embodied.config import JobConfig
from rlinf_embodied.runtime import Channel, Worker
from rlinf_embodied.workers.env_worker import ChannelNames, cat_env_axis

__all__ = ["ActorWorker", "compute_advantages", "lr_lambda", "update_policy"]


def lr_lambda(schedule: str, total_iterations: int):
    """LR multiplier per scheduler step (one step per iteration)."""
    if schedule == "constant":
        return lambda it: 1.0
    if schedule == "linear":
        return lambda it: max(0.0, 1.0 - it / max(1, total_iterations))
    if schedule == "cosine":
        return lambda it: 0.5 * (1.0 + math.cos(math.pi * min(it, total_iterations) / max(1, total_iterations)))
    raise ValueError(f"Unknown trainer.lr_schedule {schedule!r}; use constant, linear or cosine.")


def compute_advantages(batch: dict, cfg: JobConfig) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Advantages, returns and the (T, N) valid mask of a time-major batch.

    GAE bootstraps from ``values`` (T+1, N) under NEXT_STEP autoreset; GRPO scores each env
    column (one fixed-length episode) and, with ``algorithm.filter_low/high``, drops groups
    outside the success band (dynamic sampling).
    """
    from rlinf_embodied.algorithms import get_advantage, get_filter

    a = cfg.algorithm
    valid = batch["valid"].bool()
    fn = get_advantage(a.advantage)
    if a.advantage == "gae":
        term, trunc = batch["terminations"], batch["truncations"]
        if a.bootstrap_terminations:  # every episode end bootstraps from its final observation
            term, trunc = torch.zeros_like(term), term | trunc
        adv, ret = fn(batch["rewards"], batch["values"], term, trunc,
                      valid=valid, gamma=a.gamma, gae_lambda=a.gae_lambda)
    elif a.advantage == "grpo":
        groups = batch["group_ids"]
        adv, ret = fn(batch["rewards"], groups, valid=valid, std_normalize=a.grpo_std_normalize)
        if a.filter_low is not None or a.filter_high is not None:
            success = batch["success"].any(0).float()
            keep = get_filter("dynamic_sampling")(
                success, groups, low=a.filter_low if a.filter_low is not None else 0.0,
                high=a.filter_high if a.filter_high is not None else 1.0,
            )
            valid = valid & keep.bool().unsqueeze(0)
        if adv.dim() == 1:
            adv = adv.unsqueeze(0).expand_as(batch["rewards"])
            ret = ret.unsqueeze(0).expand_as(batch["rewards"])
    else:
        adv, ret = fn(batch["rewards"], batch["terminations"], batch["truncations"], valid=valid, gamma=a.gamma)
    return adv, ret, valid


def update_policy(policy, optimizer, batch: dict, cfg: JobConfig, iteration: int, rank: int = 0,
                  device: str = "cpu", mean_across_ranks=lambda x: x) -> Dict[str, float]:
    """One RL update of ``policy`` on a time-major batch (T, N): advantages, then
    ``update_epochs`` x ``num_minibatches`` optimizer steps with micro-batch accumulation,
    gradient clipping and the optional ``target_kl`` early stop (mean over ranks).

    Shared by :class:`ActorWorker` (sharded) and the single-process baseline of
    ``benchmarks/bench_train.py`` (unsharded), so both run the same math.

    Returns:
        Metrics averaged over the minibatches (``train/...``).
    """
    from rlinf_embodied.algorithms import get_loss

    t, a = cfg.trainer, cfg.algorithm
    dev = device
    adv, ret, valid = compute_advantages(batch, cfg)
    T, N = batch["rewards"].shape
    flat = lambda x: x.reshape(T * N, *x.shape[2:]).to(dev)  # noqa: E731
    data = {
        "fi": {k: flat(v) for k, v in batch["forward_inputs"].items()},
        "actions": flat(batch["actions"]),
        "old_logprobs": flat(batch["logprobs"]),
        "adv": flat(adv),
        "ret": flat(ret),
        "valid": flat(valid),
    }
    if "values" in batch:
        data["old_values"] = flat(batch["values"][:-1])
    B = T * N
    n_mb = max(1, min(t.num_minibatches, B))
    mb_size = B // n_mb
    micro = t.micro_batch_size or mb_size
    loss_fn = get_loss(a.loss)
    gen = torch.Generator().manual_seed(cfg.run.seed * 100_003 + iteration * 101 + rank)
    sums: Dict[str, float] = {}
    count = 0
    stop = False
    for epoch in range(t.update_epochs):
        perm = torch.randperm(B, generator=gen)
        for m in range(n_mb):
            idx = perm[m * mb_size:(m + 1) * mb_size]
            n_valid = max(1, int(data["valid"][idx].sum()))
            optimizer.zero_grad(set_to_none=True)
            mb_metrics: Dict[str, float] = {}
            for s in range(0, len(idx), micro):
                sub = idx[s:s + micro]
                mask = data["valid"][sub]
                adv_mb = data["adv"][sub]
                if a.normalize_advantages and a.advantage == "gae":
                    sel = data["adv"][idx][data["valid"][idx]]
                    if sel.numel() > 1:
                        adv_mb = (adv_mb - sel.mean()) / (sel.std() + 1e-8)
                ev = policy.evaluate({k: v[sub] for k, v in data["fi"].items()}, data["actions"][sub])
                loss, met = loss_fn(
                    logprobs=ev.logprobs, old_logprobs=data["old_logprobs"][sub], advantages=adv_mb,
                    mask=mask, entropy=ev.entropy, values=ev.values,
                    returns=data["ret"][sub] if ev.values is not None else None,
                    old_values=data.get("old_values", torch.empty(0))[sub] if ev.values is not None and "old_values" in data else None,
                    clip_ratio_low=a.clip_ratio_low, clip_ratio_high=a.clip_ratio_high,
                    dual_clip=a.dual_clip, value_clip=a.value_clip, value_coef=a.value_coef,
                    entropy_coef=a.entropy_coef, ratio_level=cfg.policy.logprob_granularity,
                )
                share = int(mask.sum()) / n_valid
                (loss * share).backward()
                for k, v in met.items():
                    mb_metrics[k] = mb_metrics.get(k, 0.0) + float(v) * share
            grad_norm = torch.nn.utils.clip_grad_norm_(
                [p for p in policy.parameters() if p.requires_grad], t.max_grad_norm
            )
            if hasattr(grad_norm, "full_tensor"):
                grad_norm = grad_norm.full_tensor()
            optimizer.step()
            mb_metrics["grad_norm"] = float(grad_norm)
            for k, v in mb_metrics.items():
                sums[k] = sums.get(k, 0.0) + v
            count += 1
            if a.target_kl is not None and mean_across_ranks(mb_metrics.get("approx_kl", 0.0)) > a.target_kl:
                stop = True
                break
        if stop:
            break
    out = {f"train/{k}": v / max(1, count) for k, v in sums.items()}
    out["train/minibatches"] = float(count)
    out["train/valid_fraction"] = float(valid.float().mean())
    return out


class ActorWorker(Worker):
    """One rank of the actor (training) group.

    Args:
        cfg: the job config.
        spec: the env's SpaceSpec as a dict.
        channels: the run's channel names.
        num_streams: trajectories this rank receives per iteration (its env ranks).
    """

    def __init__(self, cfg: JobConfig, spec: dict, channels: ChannelNames, num_streams: int):
        from rlinf_embodied.policies import build_policy
        from rlinf_embodied.policies.base import SpaceSpec

        self.cfg = cfg
        torch.manual_seed(cfg.run.seed)  # identical initial weights on every rank and placement
        self.spec = SpaceSpec.from_dict(spec)
        self.policy = build_policy(cfg.policy, self.spec)
        self.traj_ch = Channel.connect(channels.trajectories)
        self.traj_ch.bind(f"a{self.rank}")  # trajectories come straight to this process
        self.channels = channels
        self.num_streams = num_streams
        self.optimizer: Optional[torch.optim.Optimizer] = None
        self.scheduler = None
        self.version = 0

    # -- setup ------------------------------------------------------------------------------
    def set_num_streams(self, n: int) -> None:
        """Trajectories (env ranks) this rank receives per iteration."""
        self.num_streams = int(n)

    def setup(self, checkpoint: Optional[str] = None) -> int:
        """Shard the policy, build optimizer and LR schedule, optionally restore a checkpoint.

        Must run after the group's process group exists. Returns the weight version.
        """
        from torch.distributed.fsdp import CPUOffloadPolicy, fully_shard, register_fsdp_forward_method

        t = self.cfg.trainer
        if checkpoint:
            from safetensors.torch import load_file

            state = load_file(str(Path(checkpoint) / "policy" / "model.safetensors"))
            self.policy.load_state_dict(state)
        self.policy.to(self.torch_device)
        # One FSDP2 unit per transformer block (VLAs), then the root; act/evaluate/predict_values
        # are driven like forward() so they gather the root's parameters.
        kw = {"offload_policy": CPUOffloadPolicy()} if t.offload else {}
        for unit in self.policy.fsdp_units():
            fully_shard(unit, **kw)
        fully_shard(self.policy, **kw)
        for name in ("evaluate", "act", "predict_values"):
            register_fsdp_forward_method(self.policy, name)
        params = [p for p in self.policy.parameters() if p.requires_grad]
        self.optimizer = torch.optim.Adam(params, lr=t.lr, eps=1e-5)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lr_lambda(t.lr_schedule, t.iterations)
        )
        if checkpoint:
            self._load_training_state(Path(checkpoint))
        return self.version

    # -- weights ----------------------------------------------------------------------------
    def full_state_dict(self, trainable_only: bool = False) -> Optional[dict]:
        """Gather the unsharded weights (collective: call on every rank); rank 0 gets them."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        sd = get_model_state_dict(
            self.policy, options=StateDictOptions(full_state_dict=True, cpu_offload=True)
        )
        if self.rank != 0:
            return None
        if trainable_only:
            names = {n for n, p in self.policy.named_parameters() if p.requires_grad}
            sd = {k: v for k, v in sd.items() if k in names}
        return sd

    def publish_weights(self, trainable_only: bool = False) -> Optional[list]:
        """Put the full weights in the object store; rank 0 returns ``[ObjectRef]``."""
        import ray

        sd = self.full_state_dict(trainable_only)
        return None if sd is None else [ray.put(sd)]

    # -- training ---------------------------------------------------------------------------
    def train(self, iteration: int) -> Dict[str, float]:
        """One policy update on this iteration's trajectories. Returns mean metrics."""
        with self.device_lock(consumes=[self.channels.trajectories]):
            parts = [self.traj_ch.get(key=f"a{self.rank}") for _ in range(self.num_streams)]
            batch = cat_env_axis(parts)
            metrics = self._update(batch, iteration)
            self.scheduler.step()
            self.version += 1
        metrics["train/lr"] = self.scheduler.get_last_lr()[0]
        return metrics

    def _update(self, batch: dict, iteration: int) -> Dict[str, float]:
        return update_policy(self.policy, self.optimizer, batch, self.cfg, iteration,
                             rank=self.rank, device=self.torch_device,
                             mean_across_ranks=self._mean_across_ranks)

    def profile_train(self, batch: int) -> float:
        """Forward + backward of the loss on ``batch`` synthetic samples (scheduler profiling).

        The gradients are discarded and no optimizer step is taken, so the weights the run
        starts from are unchanged. Returns peak device memory in bytes (0 on CPU).
        """
        from rlinf_embodied.algorithms import get_loss
        from rlinf_embodied.workers.env_worker import _peak_bytes, synthetic_obs

        with torch.no_grad():
            out = self.policy.act(synthetic_obs(self.spec.to_dict(), batch), mode="sample")
        ev = self.policy.evaluate(out.forward_inputs, out.actions)
        adv = torch.randn(batch)
        loss, _ = get_loss(self.cfg.algorithm.loss)(
            logprobs=ev.logprobs, old_logprobs=out.logprobs, advantages=adv, entropy=ev.entropy,
            values=ev.values, returns=adv if ev.values is not None else None,
            ratio_level=self.cfg.policy.logprob_granularity)
        loss.backward()
        self.optimizer.zero_grad(set_to_none=True)
        return _peak_bytes()

    def _mean_across_ranks(self, value: float) -> float:
        if not dist.is_initialized() or dist.get_world_size() == 1:
            return value
        t = torch.tensor([value], dtype=torch.float64)
        dist.all_reduce(t)
        return float(t) / dist.get_world_size()

    # -- checkpoint -------------------------------------------------------------------------
    def save(self, directory: str) -> None:
        """Write policy weights (+config), optimizer, LR schedule and RNG states (collective)."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

        opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
        sd = self.full_state_dict()
        osd = get_optimizer_state_dict(self.policy, self.optimizer, options=opts)
        if self.rank == 0:
            from rlinf_embodied.policies import build_policy, save_policy

            plain = build_policy(self.cfg.policy, self.spec)
            plain.load_state_dict(sd)
            save_policy(plain, Path(directory) / "policy")
            torch.save(
                {"optimizer": osd, "scheduler": self.scheduler.state_dict(), "version": self.version},
                Path(directory) / "actor_state.pt",
            )
        torch.save(_rng_state(), Path(directory) / f"actor_rng_rank{self.rank}.pt")

    def _load_training_state(self, directory: Path) -> None:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

        st = torch.load(directory / "actor_state.pt", weights_only=False)
        set_optimizer_state_dict(
            self.policy, self.optimizer, st["optimizer"],
            options=StateDictOptions(full_state_dict=True, cpu_offload=True),
        )
        self.scheduler.load_state_dict(st["scheduler"])
        self.version = int(st["version"])
        rng = directory / f"actor_rng_rank{self.rank}.pt"
        if rng.exists():
            _set_rng_state(torch.load(rng, weights_only=False))

    def onload(self) -> None:
        if self.torch_device != "cpu" and not self.cfg.trainer.offload:
            self.policy.to(self.torch_device)
            _move_optimizer(self.optimizer, self.torch_device)

    def offload(self) -> None:
        if self.torch_device != "cpu" and not self.cfg.trainer.offload:
            self.policy.to("cpu")
            _move_optimizer(self.optimizer, "cpu")


def _move_optimizer(opt: Optional[torch.optim.Optimizer], device: str) -> None:
    if opt is None:
        return
    for state in opt.state.values():
        for k, v in state.items():
            if isinstance(v, torch.Tensor):
                state[k] = v.to(device, non_blocking=True)


def _rng_state() -> dict:
    return {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}


def _set_rng_state(st: dict) -> None:
    torch.set_rng_state(st["torch"])
    np.random.set_state(st["numpy"])
    random.setstate(st["python"])
