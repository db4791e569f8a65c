"""ActorWorker: trains the policy (and its critic / value head) with FSDP2.

Each rank holds a shard of the parameters (``fully_shard``, gloo on CPU, nccl on GPU), receives
the trajectories of its env ranks from the ``trajectories`` channel and runs
:func:`rlinf_embodied.algorithms.update.update_policy` on them (registered advantage estimator,
then ``update_epochs`` x ``num_minibatches`` steps of the registered loss). All ranks take the
same number of optimizer steps (the sharded collectives require it).
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Dict, Optional

import numpy as np
import torch
import torch.distributed as dist

from rlinf_embodied.algorithms.update import make_optimizer, param_groups, update_policy
from rlinf_embodied.config import JobConfig
from rlinf_embodied.runtime import Channel, Worker
from rlinf_embodied.workers.common import cat_env_axis, move_optimizer
from rlinf_embodied.workers.env_worker import ChannelNames

__all__ = ["ActorWorker"]


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
        self.optimizer, self.scheduler = make_optimizer(self.policy, t)
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
            # running observation statistics change every update, like trainable weights
            names |= {n for n, _ in self.policy.named_buffers() if ".obs_norm." in f".{n}"}
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
            lr = self.optimizer.param_groups[0]["lr"]  # the rate this update trained at
            metrics = self._update(batch, iteration)
            self.scheduler.step()
            self.version += 1
        metrics["train/lr"] = lr
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
        from rlinf_embodied.algorithms import LossBatch, get_loss
        from rlinf_embodied.workers.common import peak_bytes, synthetic_obs

        with torch.no_grad():
            out = self.policy.act(synthetic_obs(self.spec.to_dict(), batch), mode="sample")
        ev = self.policy.evaluate(out.forward_inputs, out.actions)
        adv = torch.randn(batch)
        mb = LossBatch(logprobs=ev.logprobs, old_logprobs=out.logprobs, advantages=adv,
                       mask=torch.ones(batch, dtype=torch.bool),
                       granularity=self.cfg.policy.logprob_granularity, entropy=ev.entropy,
                       values=ev.values, returns=adv if ev.values is not None else None)
        loss, _ = get_loss(self.cfg.algorithm.loss)(mb, self.cfg.algorithm)
        loss.backward()
        self.optimizer.zero_grad(set_to_none=True)
        return peak_bytes()

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
        """Restore optimizer, LR schedule, version and RNG states saved by :meth:`save`.

        Parameters that had no gradient before the save (a Prismatic ViT's last block, whose
        output no VLA uses) have no Adam state in the checkpoint; they start without one, as
        they would have in the uninterrupted run. torch >= 2.14 refuses such a load unless
        ``strict=False``, which is used only then, after checking the saved state belongs to
        this policy.

        Raises:
            RuntimeError: the checkpoint's optimizer state names none of this policy's
                parameters (another model).
        """
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

        st = torch.load(directory / "actor_state.pt", weights_only=False)
        saved = set(st["optimizer"].get("state", {}))
        trained = {n for n, p in self.policy.named_parameters() if p.requires_grad}
        if saved and not saved & trained:
            raise RuntimeError(
                f"{directory / 'actor_state.pt'} holds optimizer state for parameters this "
                f"policy does not have (e.g. {min(saved)!r}); resume with the run's own policy.")
        set_optimizer_state_dict(
            self.policy, self.optimizer, st["optimizer"],
            options=StateDictOptions(full_state_dict=True, cpu_offload=True,
                                     strict=trained <= saved),
        )
        self.scheduler.load_state_dict(st["scheduler"])
        # This config's schedule at the restored step. The optimizer state holds the rate of
        # the step it was saved at (0 at the end of a linear schedule), and LambdaLR would
        # apply a changed schedule (trainer.iterations extended on --resume) only from its next
        # step, one iteration late. Unchanged schedules give the same float (same formula).
        t = self.cfg.trainer
        self.scheduler.base_lrs = [g["lr"] for g in param_groups(self.policy, t)]
        for g, base, lam in zip(self.optimizer.param_groups, self.scheduler.base_lrs,
                                self.scheduler.lr_lambdas):
            g["lr"] = base * lam(self.scheduler.last_epoch)
        self.scheduler._last_lr = [g["lr"] for g in self.optimizer.param_groups]
        self.version = int(st["version"])
        rng = directory / f"actor_rng_rank{self.rank}.pt"
        if rng.exists():
            _set_rng_state(torch.load(rng, weights_only=False))

    def onload(self) -> None:
        if self.torch_device != "cpu" and not self.cfg.trainer.offload:
            self.policy.to(self.torch_device)
            move_optimizer(self.optimizer, self.torch_device)

    def offload(self) -> None:
        if self.torch_device != "cpu" and not self.cfg.trainer.offload:
            self.policy.to("cpu")
            move_optimizer(self.optimizer, "cpu")


def _rng_state() -> dict:
    return {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}


def _set_rng_state(st: dict) -> None:
    torch.set_rng_state(st["torch"])
    np.random.set_state(st["numpy"])
    random.setstate(st["python"])
