"""ElasticRolloutWorker: one rollout instance of the elastic pool (envs + a policy copy).

A *shard* is the unit of work: ``shard_envs`` envs reset from seeds that are a pure function of
(run seed, iteration, shard) and stepped for ``trainer.rollout_steps`` policy queries whose
sampling seeds are pure functions of (run seed, iteration, shard, step). Any worker holding
weights version v therefore produces the same trajectory for a shard, so a shard lost with its
worker is re-run elsewhere with an identical result (LIBERO / gym: from its seeds; ManiSkill:
from its seeds too, since CPU physics is deterministic; restoring saved sim state mid-shard is
not done: with ManiSkill 3.0.1 a restored ``get_state_dict`` state, elapsed steps and RNGs
included, diverges from the uninterrupted run at the first step, see docs/elastic.md). The seeding matches :class:`~rlinf_embodied.workers.env_worker.EnvWorker`'s
streams: shard k of n envs is seeded like stream k of n envs.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Dict, List, Optional

import torch

from rlinf_embodied.config import JobConfig
from rlinf_embodied.elastic.weights import PullsWeights
from rlinf_embodied.runtime import Worker
from rlinf_embodied.runtime import device as dev
from rlinf_embodied.workers.common import request_seed

__all__ = ["ElasticRolloutWorker", "shard_reset"]


def shard_reset(env, run_seed: int, iteration: int, first: int, group_size: int):
    """Reset ``env`` (n envs: global envs ``first .. first + n - 1``) for a training rollout.

    Env i gets seed ``run_seed * 10**6 + iteration * 1000 + first + i``; with GRPO groups of
    ``group_size`` G > 1, the G envs of a group share one initial state. Same formula as the
    env workers' streams.

    Returns:
        The first observation (dict, see :class:`~rlinf_embodied.envs.base.BatchedEnv`).
    """
    base = run_seed * 1_000_000 + iteration * 1_000
    if group_size <= 1:
        return env.reset(seed=base + first)[0]
    return env.reset(seed=[base + (first + i) // group_size for i in range(env.num_envs)])[0]


class ElasticRolloutWorker(PullsWeights, Worker):
    """Runs whole shards: reset, ``trainer.rollout_steps`` queries of its own policy copy, env
    chunk steps, bootstrap values.

    Args:
        cfg: the job config.
        spec: the env's SpaceSpec as a dict.
        store_name: name of the run's :class:`~rlinf_embodied.elastic.weights.WeightStore`.
        shard_envs: envs per shard (n).
        kind: ``"reserved"`` or ``"preemptible"`` (reported back, for the split).
    """

    def __init__(self, cfg: JobConfig, spec: dict, store_name: str, shard_envs: int, kind: str):

        from rlinf_embodied.envs import make_env
        from rlinf_embodied.policies import build_policy
        from rlinf_embodied.policies.base import SpaceSpec

        self.cfg, self.kind, self.n = cfg, kind, shard_envs
        self.env = make_env(dataclasses.replace(cfg.env, num_envs=shard_envs, video=False))
        torch.manual_seed(cfg.run.seed)
        self.policy = build_policy(cfg.policy, SpaceSpec.from_dict(spec)).eval()
        self.policy.to(self.torch_device)
        self._connect_weights(store_name)

    def node_id(self) -> str:
        """Ray node id of this worker's process."""
        import ray

        return ray.get_runtime_context().get_node_id()

    def _load_weights(self, state: dict, version: int) -> None:
        self.policy.load_state_dict(state)

    @torch.no_grad()
    def run_shard(self, iteration: int, shard: int, version: int) -> dict:
        """Roll out shard ``shard`` of ``iteration`` with weights ``version`` (pulled if needed).

        Returns:
            ``{"shard", "version", "kind", "traj", "episodes", "stats"}``: ``traj`` is the
            time-major trajectory of the shard's envs (T queries, n envs) in the actor's batch
            format; ``episodes`` one record per episode that ended in this rollout
            (``iteration, shard, env, ordinal, step, return, success_once``, ``env`` the global
            env index); ``stats`` sums as the env workers report them (``episodes``,
            ``success_once``, ``episode_return``, ``env_steps``, ``env_errors``,
            ``env_time_s``).
        """
        self._ensure_version(version)
        cfg, n, T = self.cfg, self.n, self.cfg.trainer.rollout_steps
        seed, first = cfg.run.seed, shard * n
        G = max(1, cfg.algorithm.group_size)
        stats = {"episodes": 0, "success_once": 0.0, "episode_return": 0.0, "env_steps": 0,
                 "env_errors": 0, "env_time_s": 0.0}
        episodes: List[Dict] = []
        ordinal = [0] * n
        steps: List[dict] = []
        with self.device_lock():
            if cfg.env.success_hold_ramp is not None:
                self.env.set_success_hold_steps(cfg.env.hold_steps_at(iteration))
            obs = shard_reset(self.env, seed, iteration, first, G)
            ep_ret = torch.zeros(n)
            for t in range(T):
                torch.manual_seed(request_seed(seed, iteration, shard, t))
                out = self.policy.act(dev.to_worker_device(obs, self.devices), mode="sample")
                t0 = time.perf_counter()
                obs, r, term, trunc, info = self.env.chunk_step(out.actions)
                stats["env_time_s"] += time.perf_counter() - t0
                valid = ~info["autoreset"].cpu().bool()
                rew = r.sum(-1).float().cpu()
                term_t, trunc_t = term.any(-1).cpu(), trunc.any(-1).cpu()
                success = info["success_once"].cpu().bool()
                steps.append({"actions": out.actions, "logprobs": out.logprobs, "values": out.values,
                              "forward_inputs": out.forward_inputs, "rewards": rew,
                              "terminations": term_t, "truncations": trunc_t, "valid": valid,
                              "success": success})
                stats["env_steps"] += int(info["num_substeps"].sum())
                if "env_error" in info:
                    stats["env_errors"] += int(info["env_error"].sum())
                ep_ret += torch.where(valid, rew, torch.zeros_like(rew))
                done = (term_t | trunc_t) & valid
                if done.any():  # sums as the env workers take them (float32 per step)
                    stats["episodes"] += int(done.sum())
                    stats["success_once"] += float(success[done].float().sum())
                    stats["episode_return"] += float(ep_ret[done].sum())
                for j in done.nonzero().flatten().tolist():
                    episodes.append({"iteration": iteration, "shard": shard, "env": first + j,
                                     "ordinal": ordinal[j], "step": t, "return": float(ep_ret[j]),
                                     "success_once": bool(success[j])})
                    ordinal[j] += 1
                ep_ret[done] = 0.0
            bootstrap = self._bootstrap(obs) if steps[0]["values"] is not None else None
        traj = _stack(steps, bootstrap)
        traj["group_ids"] = torch.arange(first, first + n) // G
        return {"shard": shard, "version": self.version, "kind": self.kind,
                "traj": dev.to_host(traj), "episodes": episodes, "stats": stats}

    def _bootstrap(self, obs) -> Optional[torch.Tensor]:
        try:
            return self.policy.predict_values(dev.to_worker_device(obs, self.devices))
        except NotImplementedError:
            return None


def _stack(steps: List[dict], bootstrap: Optional[torch.Tensor]) -> dict:
    """Time-major trajectory dict of T steps, the env workers' format: (T, n, ...) tensors,
    ``forward_inputs`` a dict of them, ``values`` (T + 1, n) with the bootstrap last."""
    d = {k: torch.stack([s[k] for s in steps]) for k in steps[0] if k not in ("forward_inputs", "values")}
    d["forward_inputs"] = {k: torch.stack([s["forward_inputs"][k] for s in steps])
                           for k in steps[0]["forward_inputs"]}
    if steps[0]["values"] is not None:
        d["values"] = torch.stack([s["values"] for s in steps] + [bootstrap])
    return d

