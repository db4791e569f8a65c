"""RolloutWorker: runs the policy without gradients for the env workers' requests."""

from __future__ import annotations

import time

import torch

from rlinf_embodied.config import JobConfig
from rlinf_embodied.policies.base import act_rows
from rlinf_embodied.runtime import Channel, Worker
from rlinf_embodied.workers.env_worker import ChannelNames
from rlinf_embodied.workers.messages import EndOfStream, PolicyReply, PolicyRequest, drop_echoes

__all__ = ["RolloutWorker", "StaleWeightsError"]


class StaleWeightsError(RuntimeError):
    """An on-policy rollout was asked to run with weights older than the actor's."""


class RolloutWorker(Worker):
    """One rank of the rollout (generation) group.

    Serves requests from its key ``"r<rank>"`` of the ``obs`` channel (bound here: requests come
    straight to this process) and replies on the ``actions`` channel (messages in
    :mod:`rlinf_embodied.workers.messages`). Each request carries a sampling seed, so the same
    observation gets the same action on any rank. Requests that arrive together are taken in
    one wake-up and answered back to back; with ``join_forwards`` those that draw no random
    numbers (greedy evaluation of a policy whose greedy mode draws none, bootstrap values)
    share one forward. A request with
    ``row_seeds`` (batch-invariant evaluation) is answered row by row
    (:func:`~rlinf_embodied.policies.base.act_rows`) and never joined.

    Args:
        cfg: the job config.
        spec: the env's SpaceSpec as a dict.
        channels: the run's channel names.
        num_env_ranks: env ranks that send requests (each ends every call with an EndOfStream).
        join_forwards: Join requests that arrive together into one forward. Off by default:
            a joined float32 forward differs from separate ones in the last bits (the BLAS
            kernel depends on the batch size; tests/workers/test_rollout_batching.py) and what
            arrives together depends on timing, so joining trades bitwise reproducibility for
            fewer, larger forwards.
    """

    def __init__(self, cfg: JobConfig, spec: dict, channels: ChannelNames, num_env_ranks: int = 1,
                 join_forwards: bool = False):
        from rlinf_embodied.policies import build_policy
        from rlinf_embodied.policies.base import SpaceSpec

        self.cfg = cfg
        self.spec = spec
        torch.manual_seed(cfg.run.seed)
        self.policy = build_policy(cfg.policy, SpaceSpec.from_dict(spec)).eval()
        self.version = -1
        self.obs_ch = Channel.connect(channels.obs)
        self.obs_ch.bind(self._key, caller_reads=True)  # serve() reads the requests itself
        self.act_ch = Channel.connect(channels.actions)
        self.channels = channels
        self.num_env_ranks = num_env_ranks
        self.join_forwards = join_forwards
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

    @property
    def _key(self) -> str:
        return f"r{self.rank}"

    def serve(self, expected_version: int | None = None) -> dict:
        """Answer requests until every env rank has sent its EndOfStream, then return.

        Returns:
            ``requests`` answered, ``batches`` (forwards run), ``version`` of the weights, and
            the hop breakdown in seconds: ``wait_s`` (for requests), ``forward_s``, ``put_s``,
            ``request_hops`` (:meth:`~rlinf_embodied.runtime.Channel.hop_profile` of the
            requests and end-of-stream messages).

        Raises:
            StaleWeightsError: if ``expected_version`` is given and the loaded weights are
                older (on-policy runs refuse stale weights).
        """
        if expected_version is not None and self.version != expected_version:
            raise StaleWeightsError(
                f"rollout rank {self.rank} holds weights v{self.version}, the actor is at "
                f"v{expected_version}; sync weights before the rollout."
            )
        served, batches, ended = 0, 0, 0
        hops = {"wait_s": 0.0, "forward_s": 0.0, "put_s": 0.0}
        with self.device_lock(consumes=[self.channels.obs], share="rollout"):
            while ended < self.num_env_ranks:
                t0 = time.perf_counter()
                arrived = self.obs_ch.get_batch(key=self._key)
                hops["wait_s"] += time.perf_counter() - t0
                requests = []
                for msg in arrived:
                    if isinstance(msg, EndOfStream):
                        ended += 1
                    elif isinstance(msg, PolicyRequest):
                        requests.append(msg)
                    else:
                        raise TypeError(f"{self.name} got {type(msg).__name__} on {self.channels.obs!r}; "
                                        f"expected PolicyRequest or EndOfStream.")
                groups = (_batches(requests, getattr(self.policy, "greedy_draws", False))
                          if self.join_forwards else [[r] for r in requests])
                for group in groups:
                    t1 = time.perf_counter()
                    answers = self._answer_batch(group)
                    t2 = time.perf_counter()
                    for req, answer in zip(group, answers):
                        self.act_ch.put(answer, key=req.reply)
                    hops["forward_s"] += t2 - t1
                    hops["put_s"] += time.perf_counter() - t2
                    batches += 1
                served += len(requests)
        self.requests += served
        return {"requests": served, "batches": batches, "version": self.version, **hops,
                "request_hops": self.obs_ch.hop_profile()}

    @torch.no_grad()
    def profile_act(self, batch: int) -> float:
        """One ``act`` on ``batch`` synthetic observations (scheduler profiling); peak bytes."""
        from rlinf_embodied.workers.common import peak_bytes, synthetic_obs

        self.policy.act(synthetic_obs(self.spec, batch), mode="sample")
        return peak_bytes()

    @torch.no_grad()
    def _answer_batch(self, group: list[PolicyRequest]) -> list[PolicyReply]:
        """Replies to ``group`` (one forward when it holds more than one request)."""
        if len(group) == 1:
            return [self._answer(group[0])]
        sizes = [req.num_envs for req in group]
        joint = PolicyRequest(_cat_obs([req.obs for req in group]), group[0].seed, "",
                              group[0].mode, group[0].values_only)
        return _split_reply(self._answer(joint), sizes)

    @torch.no_grad()
    def _answer(self, req: PolicyRequest) -> PolicyReply:
        obs = req.obs
        if req.values_only:  # bootstrap values after the last step (None without a critic)
            if not self._has_critic:
                return PolicyReply()
            try:
                return PolicyReply(values=self.policy.predict_values(obs))
            except NotImplementedError:
                self._has_critic = False
                return PolicyReply()
        torch.manual_seed(req.seed)
        if req.row_seeds is not None:  # batch-invariant: each env's row alone, its own seed
            out = act_rows(self.policy, obs, req.mode, req.row_seeds)
        else:
            out = self.policy.act(obs, mode=req.mode)
        return drop_echoes(PolicyReply(out.actions, out.logprobs, out.values, out.forward_inputs), obs)


def _batches(requests: list[PolicyRequest], greedy_draws: bool = False) -> list[list[PolicyRequest]]:
    """Requests answered by one forward each: consecutive requests that draw no random numbers
    (greedy or values-only, same kind, same observation keys) are joined; a sampling request is
    answered alone under its own seed, so its actions never depend on what arrived with it, and
    so is a batch-invariant one (``row_seeds``), which runs row by row anyway. With
    ``greedy_draws`` (a policy whose greedy mode draws noise: π0 with ``policy.greedy_noise:
    fresh``) greedy requests are answered alone too."""
    out: list[list[PolicyRequest]] = []
    for req in requests:
        joinable = ((req.values_only or (req.mode == "greedy" and not greedy_draws))
                    and req.row_seeds is None)
        prev = out[-1][-1] if out else None
        if (joinable and prev is not None and (prev.values_only, prev.mode) == (req.values_only, req.mode)
                and prev.obs.keys() == req.obs.keys()):
            out[-1].append(req)
        else:
            out.append([req])
    return out


def _cat_obs(parts: list[dict]) -> dict:
    """Observation batches joined along the env axis (tensors concatenated, lists chained)."""
    return {k: torch.cat([p[k] for p in parts]) if isinstance(parts[0][k], torch.Tensor)
            else [x for p in parts for x in p[k]] for k in parts[0]}


def _split_reply(reply: PolicyReply, sizes: list[int]) -> list[PolicyReply]:
    """A joint reply cut back into one reply per request (env axis 0)."""
    def cut(t):
        return [None] * len(sizes) if t is None else list(torch.split(t, sizes))

    inputs = reply.forward_inputs or {}
    fi = {k: cut(v) for k, v in inputs.items()}
    return [PolicyReply(a, lp, v, {k: fi[k][i] for k in fi} if reply.forward_inputs is not None else None,
                        reply.echoed)  # each part echoes its own request's observation
            for i, (a, lp, v) in enumerate(zip(cut(reply.actions), cut(reply.logprobs), cut(reply.values)))]
