"""RolloutWorker: runs the policy without gradients for the env workers' requests."""

from __future__ import annotations

import time
from typing import Any

import torch

from rlinf_embodied.config import JobConfig
from rlinf_embodied.runtime import Channel, Worker
from rlinf_embodied.workers.env_worker import ChannelNames

__all__ = ["RolloutWorker", "StaleWeightsError"]


class StaleWeightsError(RuntimeError):
    """An on-policy rollout was asked to run with weights older than the actor's."""


class RolloutWorker(Worker):
    """One rank of the rollout (generation) group.

    Serves requests from its key ``"r<rank>"`` of the ``obs`` channel and replies on the
    ``actions`` channel (see :mod:`rlinf_embodied.workers.env_worker`). Each request carries a
    sampling seed, so the same observation gets the same action on any rank.

    Args:
        cfg: the job config.
        spec: the env's SpaceSpec as a dict.
        channels: the run's channel names.
    """

    def __init__(self, cfg: JobConfig, spec: dict, channels: ChannelNames):
        from rlinf_embodied.policies import build_policy
        from rlinf_embodied.policies.base import SpaceSpec

        self.cfg = cfg
        self.spec = spec
        torch.manual_seed(cfg.run.seed)
        self.policy = build_policy(cfg.policy, SpaceSpec.from_dict(spec)).eval()
        self.version = -1
        self.obs_ch = Channel.connect(channels.obs)
        self.act_ch = Channel.connect(channels.actions)
        self.channels = channels
        self.requests = 0
        self._has_critic = True

    def onload(self) -> None:
        self.policy.to(self.torch_device)

    def offload(self) -> None:
        if self.torch_device != "cpu":
            self.policy.to("cpu")

    def load_weights(self, payload: list, version: int) -> int:
        """Load weights pulled through the object store (``payload = [ObjectRef]``).

        A state dict that covers only part of the model (e.g. LoRA adapters) updates just
        those tensors. Returns the new version.
        """
        import ray

        state = payload[0]
        if isinstance(state, ray.ObjectRef):
            state = ray.get(state)
        missing = set(state) - set(self.policy.state_dict())
        if missing:
            raise KeyError(f"weights for unknown parameters: {sorted(missing)[:5]}")
        self.policy.load_state_dict(state, strict=False)
        self.version = int(version)
        return self.version

    def serve(self, num_requests: int, expected_version: int | None = None) -> dict:
        """Answer exactly ``num_requests`` requests, then return.

        Raises:
            StaleWeightsError: if ``expected_version`` is given and the loaded weights are
                older (on-policy runs refuse stale weights).
        """
        if expected_version is not None and self.version != expected_version:
            raise StaleWeightsError(
                f"rollout rank {self.rank} holds weights v{self.version}, the actor is at "
                f"v{expected_version}; sync weights before the rollout."
            )
        served = 0
        hops = {"wait_s": 0.0, "forward_s": 0.0, "put_s": 0.0}
        with self.device_lock(consumes=[self.channels.obs], share="rollout"):
            while served < num_requests:
                t0 = time.perf_counter()
                req = self.obs_ch.get(key=f"r{self.rank}")
                t1 = time.perf_counter()
                answer = self._answer(req)
                t2 = time.perf_counter()
                self.act_ch.put(answer, key=req["reply"])
                t3 = time.perf_counter()
                hops["wait_s"] += t1 - t0
                hops["forward_s"] += t2 - t1
                hops["put_s"] += t3 - t2
                served += 1
        self.requests += served
        return {"requests": served, "version": self.version, **hops}

    @torch.no_grad()
    def profile_act(self, batch: int) -> float:
        """One ``act`` on ``batch`` synthetic observations (scheduler profiling); peak bytes."""
        from rlinf_embodied.workers.env_worker import _peak_bytes, synthetic_obs

        self.policy.act(synthetic_obs(self.spec, batch), mode="sample")
        return _peak_bytes()

    @torch.no_grad()
    def _answer(self, req: dict) -> dict[str, Any]:
        obs = req["obs"]
        if req["values_only"]:  # bootstrap values after the last step (None without a critic)
            if not self._has_critic:
                return {"values": None}
            try:
                return {"values": self.policy.predict_values(obs)}
            except NotImplementedError:
                self._has_critic = False
                return {"values": None}
        torch.manual_seed(req["seed"])
        out = self.policy.act(obs, mode=req["mode"])
        return {
            "actions": out.actions,
            "logprobs": out.logprobs,
            "values": out.values,
            "forward_inputs": out.forward_inputs,
        }
