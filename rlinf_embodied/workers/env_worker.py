"""EnvWorker: owns a shard of the batched environments and assembles trajectories.

Elastic pipelining (RLinf paper, section 3.3): the worker's ``num_envs / world_size`` envs are
split into ``trainer.pipeline_stages`` equal micro-batches ("streams"), each its own
:class:`~rlinf_embodied.envs.base.BatchedEnv`. While stream s waits for its actions from a
rollout worker, stream s+1's observations are already queued, so env stepping and policy
generation overlap.

Protocol over the runtime's channels (names in :class:`ChannelNames`, messages in
:mod:`rlinf_embodied.workers.messages`):

* the worker puts a :class:`~rlinf_embodied.workers.messages.PolicyRequest` on ``obs`` with key
  ``"r<k>"`` (rollout rank k serves a fixed set of streams, see :func:`stream_assignment`) and,
  when its rollout or evaluation is over, one ``EndOfStream`` to every rollout rank;
* it gets the ``PolicyReply`` from ``actions`` with the request's ``reply`` key, which this
  worker binds (the replies come straight to its process, see
  :meth:`~rlinf_embodied.runtime.Channel.bind`);
* at the end of a rollout it puts the assembled trajectory on ``trajectories`` with key
  ``"a<j>"`` for actor rank j. The runner never holds trajectory tensors.

Every rollout starts from fresh resets seeded by (run seed, iteration, stream), and every
request carries a sampling seed, so a run is reproducible whatever the placement and resumes
exactly from a checkpoint.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional

import torch

from rlinf_embodied.config import JobConfig
from rlinf_embodied.runtime import Channel, Worker
from rlinf_embodied.workers.common import cat_env_axis, peak_bytes, request_seed
from rlinf_embodied.workers.messages import EndOfStream, PolicyReply, PolicyRequest, restore_echoes

__all__ = ["ChannelNames", "EnvWorker", "actor_slices", "stream_assignment"]


@dataclass(frozen=True)
class ChannelNames:
    """Names of the channels of one training run."""

    obs: str
    actions: str
    trajectories: str


def stream_assignment(num_env_ranks: int, stages: int, num_rollout_ranks: int) -> Dict[int, List]:
    """Rollout rank -> streams ``(env_rank, stage)`` it serves (round robin, balanced)."""
    out: Dict[int, List] = {k: [] for k in range(num_rollout_ranks)}
    for i in range(num_env_ranks * stages):
        out[i % num_rollout_ranks].append(divmod(i, stages))
    return out


def actor_slices(first: int, count: int, num_envs: int, num_actor_ranks: int) -> List[tuple]:
    """Which actor rank trains which of envs ``[first, first + count)``.

    Actor rank a owns the contiguous envs ``[a * N / A, (a + 1) * N / A)``. Returns
    ``(actor_rank, lo, hi)`` with local env indices ``[lo, hi)`` of this range.
    """
    per = num_envs // num_actor_ranks
    out = []
    for a in range(first // per, -(-(first + count) // per)):
        lo, hi = max(first, a * per), min(first + count, (a + 1) * per)
        if lo < hi:
            out.append((a, lo - first, hi - first))
    return out


def _slice_envs(traj: dict, lo: int, hi: int) -> dict:
    """Envs ``[lo, hi)`` of a trajectory dict (env axis 1; ``group_ids`` axis 0)."""
    out = {}
    for k, v in traj.items():
        if isinstance(v, dict):
            out[k] = {kk: vv[:, lo:hi] for kk, vv in v.items()}
        else:
            out[k] = v[lo:hi] if k == "group_ids" else v[:, lo:hi]
    return out


class EnvWorker(Worker):
    """One rank of the env group.

    Args:
        cfg: the job config.
        channels: the run's channel names.
        num_rollout_ranks: size of the rollout group (for request routing).
        num_actor_ranks: size of the actor group (see :func:`actor_slices` for who trains
            which envs).
        video_dir: where evaluation videos go (None: no videos).
    """

    def __init__(
        self,
        cfg: JobConfig,
        channels: ChannelNames,
        num_rollout_ranks: int,
        num_actor_ranks: int,
        video_dir: Optional[str] = None,
    ):
        from rlinf_embodied.envs import make_env

        self.cfg = cfg
        self.stages = cfg.trainer.pipeline_stages
        self.n_stream = cfg.env.num_envs // (self.world_size * self.stages)
        env_cfg = dataclasses.replace(cfg.env, num_envs=self.n_stream, video=False)
        self.envs = [make_env(env_cfg) for _ in range(self.stages)]
        self.obs_ch = Channel.connect(channels.obs)
        self.act_ch = Channel.connect(channels.actions)
        self.traj_ch = Channel.connect(channels.trajectories)
        self.channels = channels
        for s in range(self.stages):  # replies come straight to this process, read by the
            self.act_ch.bind(self._reply_key(s), caller_reads=True)  # thread that waits for them
        self.act_ch.bind(self._eval_reply_key(), caller_reads=True)
        self._asked: Dict[str, dict] = {}  # reply key -> the observation batch it answers
        self.num_rollout_ranks = num_rollout_ranks
        assign = stream_assignment(self.world_size, self.stages, num_rollout_ranks)
        self.route = {s: k for k, streams in assign.items() for (r, s) in streams if r == self.rank}
        self.num_actor_ranks = num_actor_ranks
        self.video_dir = video_dir
        self._eval_envs: Dict[tuple, Any] = {}
        self._profile_envs: Dict[int, Any] = {}
        self.env_time_s = 0.0

    # -- facts ------------------------------------------------------------------------------
    def max_episode_steps(self) -> Optional[int]:
        """The envs' time limit in env steps (None: none)."""
        return self.envs[0].max_episode_steps

    def space_spec(self) -> dict:
        """The :class:`~rlinf_embodied.policies.base.SpaceSpec` of the envs, as a dict."""
        from rlinf_embodied.policies.base import SpaceSpec

        env = self.envs[0]
        obs, _ = env.reset(seed=0)
        spec = SpaceSpec.from_env(env, obs)
        return spec.to_dict()

    def _stream_id(self, stage: int) -> int:
        return self.rank * self.stages + stage

    def _reply_key(self, stage: int) -> str:
        return f"e{self.rank}s{stage}"

    def _eval_reply_key(self) -> str:
        return f"e{self.rank}eval"

    def _request(self, stage: int, obs: dict, seed: int, mode: str, values_only: bool,
                 reply: Optional[str] = None, row_seeds: Optional[tuple] = None) -> str:
        """Queue a policy query of stream ``stage`` for its rollout rank; returns the reply key.
        ``row_seeds`` asks for a batch-invariant answer (:class:`PolicyRequest`)."""
        reply = reply or self._reply_key(stage)
        self._asked[reply] = obs  # the reply's echoed forward_inputs come from here
        t0 = time.perf_counter()
        self.obs_ch.put(
            PolicyRequest(obs=obs, seed=seed, reply=reply, mode=mode, values_only=values_only,
                          row_seeds=row_seeds),
            key=f"r{self.route[stage]}",
            weight=self.n_stream,
        )
        hops = getattr(self, "_hops", None)
        if hops is not None:
            hops["put_s"] += time.perf_counter() - t0
            hops["queries"] += 1
        return reply

    def _end_streams(self) -> None:
        """Tell every rollout rank that this rank sends no more requests in this call."""
        for k in range(self.num_rollout_ranks):
            self.obs_ch.put(EndOfStream(self.name), key=f"r{k}", weight=0.0)

    def _reset_all(self, envs, iteration: int, phase: int) -> List[dict]:
        """Fresh resets; GRPO groups of G consecutive envs share one seed (initial state)."""
        out = []
        base = self.cfg.run.seed * 1_000_000 + phase * 500_000 + iteration * 1_000
        G = max(1, self.cfg.algorithm.group_size)
        for s, env in enumerate(envs):
            first = self._stream_id(s) * env.num_envs
            if G == 1:
                obs, _ = env.reset(seed=base + first)
            else:
                obs, _ = env.reset(seed=[base + (first + i) // G for i in range(env.num_envs)])
            out.append(obs)
        return out

    # -- training rollout -------------------------------------------------------------------
    def rollout(self, iteration: int) -> dict:
        """Collect ``trainer.rollout_steps`` policy queries from every env of this rank.

        Returns:
            Episode statistics of episodes that finished in this rollout plus timings:
            ``episodes``, ``success_once`` (sum), ``episode_return`` (sum), ``per_task``
            (instruction -> [episodes, successes], for envs serving several tasks),
            ``per_task_groups`` (instruction -> [groups, mixed groups]: GRPO groups, envs sharing
            a reset seed, in which some env succeeded in this rollout and some did not: the
            groups whose success contrast carries a policy gradient), ``env_steps``,
            ``env_time_s``; the hop breakdown ``put_s``, ``wait_s``, ``queries`` and
            ``reply_hops`` (:meth:`~rlinf_embodied.runtime.Channel.hop_profile` of the replies).
        """
        T = self.cfg.trainer.rollout_steps
        seed = self.cfg.run.seed
        stats = {"episodes": 0, "success_once": 0.0, "episode_return": 0.0, "env_steps": 0,
                 "env_errors": 0, "per_task": {}}
        t_env = 0.0
        self._hops = {"wait_s": 0.0, "put_s": 0.0, "queries": 0}
        with self.device_lock(consumes=[self.channels.actions], share="rollout"):
            if self.cfg.env.success_hold_ramp is not None:
                for env in self.envs:
                    env.set_success_hold_steps(self.cfg.env.hold_steps_at(iteration))
            obs = self._reset_all(self.envs, iteration, phase=0)
            bufs = [_Trajectory(T) for _ in self.envs]
            ep_ret = [torch.zeros(env.num_envs) for env in self.envs]
            succeeded = [torch.zeros(env.num_envs, dtype=torch.bool) for env in self.envs]
            tasks = [list(o.get("task_descriptions") or [""] * env.num_envs)
                     for o, env in zip(obs, self.envs)]  # a group's task: set at its reset
            replies = [
                self._request(s, obs[s], request_seed(seed, iteration, self._stream_id(s), 0), "sample", False)
                for s in range(self.stages)
            ]
            for t in range(T):
                for s, env in enumerate(self.envs):
                    out = self._reply(replies[s])
                    t0 = time.perf_counter()
                    o, r, term, trunc, info = env.chunk_step(out.actions)
                    t_env += time.perf_counter() - t0
                    valid = ~info["autoreset"].cpu().bool()
                    rew = r.sum(-1).float().cpu()
                    term_t, trunc_t = term.any(-1).cpu(), trunc.any(-1).cpu()
                    bufs[s].add(out, rew, term_t, trunc_t, valid, info)
                    stats["env_steps"] += int(info["num_substeps"].sum())
                    if "env_error" in info:  # a crashed/hung env process: episode truncated
                        stats["env_errors"] += int(info["env_error"].sum())
                    ep_ret[s] += torch.where(valid, rew, torch.zeros_like(rew))
                    done = (term_t | trunc_t) & valid
                    if done.any():
                        stats["episodes"] += int(done.sum())
                        stats["success_once"] += float(info["success_once"].cpu()[done].float().sum())
                        _count_tasks(stats["per_task"], o["task_descriptions"], done,
                                     info["success_once"].cpu())
                        stats["episode_return"] += float(ep_ret[s][done].sum())
                        succeeded[s] |= done & info["success_once"].cpu().bool()
                        ep_ret[s][done] = 0.0
                    last = t == T - 1
                    sd = request_seed(seed, iteration, self._stream_id(s), t + 1)
                    replies[s] = self._request(s, o, sd, "sample", values_only=last)
            self._end_streams()
            for s in range(self.stages):
                bufs[s].bootstrap = self._reply(replies[s]).values
            group = torch.arange(self.rank * self.stages * self.n_stream,
                                 (self.rank + 1) * self.stages * self.n_stream)
            traj = cat_env_axis([b.to_dict() for b in bufs])
            traj["group_ids"] = group // max(1, self.cfg.algorithm.group_size)
            stats["per_task_groups"] = _count_groups(
                torch.cat(succeeded), [x for t in tasks for x in t], traj["group_ids"])
            first = self.rank * self.stages * self.n_stream
            for a, lo, hi in actor_slices(first, self.stages * self.n_stream,
                                          self.cfg.env.num_envs, self.num_actor_ranks):
                part = _slice_envs(traj, lo, hi)
                self.traj_ch.put(part, key=f"a{a}", weight=part["rewards"].numel())
        stats["env_time_s"] = t_env
        stats.update(self._hops)
        stats["reply_hops"] = self.act_ch.hop_profile()
        return stats

    def _reply(self, reply: str) -> PolicyReply:
        """Wait for the reply ``reply`` (timed: ``wait_s`` of the hop breakdown)."""
        t0 = time.perf_counter()
        out = self.act_ch.get(key=reply)
        self._hops["wait_s"] += time.perf_counter() - t0
        return restore_echoes(out, self._asked.pop(reply))

    # -- evaluation -------------------------------------------------------------------------
    def evaluate(self, iteration: int, num_episodes: int, num_videos: int = 0) -> dict:
        """Fair evaluation: fixed-length episodes (terminations ignored), greedy actions
        (``eval.greedy``).

        Uses the same trials at every evaluation, on seeds disjoint from training
        (``eval.seed_offset``; training resets use seeds below it): each rank runs
        n = ``num_episodes / world_size`` episodes in one batch, trials ``rank * n`` to
        ``rank * n + n - 1``, trial j reset with seed :meth:`EvalConfig.trial_seed`
        (``seed_offset + run.seed * 1000 + j``). With ``eval.batch_invariant`` the rollout
        workers answer row by row, sampled rows seeded by
        :func:`~rlinf_embodied.eval.acting.episode_seed` (``run.seed``, the env id, the trial,
        the query), so each trial's result is that of ``rlinf-embodied eval --policy RUN
        --run-trials`` of the same checkpoint. With ``num_videos``, the first envs' episodes
        are written as MP4s (state-only ManiSkill envs render their camera for it; other envs
        without images get no videos).

        Returns:
            ``episodes``, ``success_once`` and ``success_at_end`` (sums), ``episode_return``
            (sum), ``per_task`` (instruction -> [episodes, successes once]), ``videos`` (paths),
            and ``trials``: per episode ``trial``, ``seed``, ``instruction`` (the task's
            language instruction, or the env id), ``success_once``, ``success_at_end``,
            ``episode_return``.
        """
        from rlinf_embodied.eval.acting import episode_seed

        n = max(1, num_episodes // self.world_size)
        first = self.rank * n
        ev, run_seed = self.cfg.eval, self.cfg.run.seed
        task = getattr(self.cfg.env, "env_id", None) or self.cfg.env.type
        env = self._eval_env_for(n, videos=num_videos > 0)
        recorder = None
        if num_videos and self.video_dir:
            from rlinf_embodied.envs.wrappers.video import VideoRecorder

            try:
                recorder = VideoRecorder(env, Path(self.video_dir) / f"iter_{iteration:06d}",
                                         env_ids=range(min(n, num_videos)), prefix=f"rank{self.rank}_episode")
                env = recorder
            except ValueError:  # no images to record (state-only, non-rendering env)
                recorder = None
        steps = env.max_episode_steps or self.cfg.trainer.rollout_steps
        queries = -(-steps // max(1, self.cfg.policy.action_chunk))
        with self.device_lock(consumes=[self.channels.actions], share="rollout"):
            # the same held-out seeds at every evaluation, so evaluations compare across iterations
            obs, _ = env.reset(seed=ev.trial_seed(run_seed, first))
            # float64 sums of the float64 rewards of each chunk, as `rlinf-embodied eval` adds them
            ret = torch.zeros(n, dtype=torch.float64)
            succ_once = torch.zeros(n, dtype=torch.bool)
            success = torch.zeros(n, dtype=torch.bool)
            for q in range(queries):
                sd = request_seed(run_seed, iteration, self.rank, q, phase=1)
                mode = "greedy" if ev.greedy else "sample"
                rows = (tuple(episode_seed(run_seed, task, first + i, q) for i in range(n))
                        if ev.batch_invariant else None)
                reply = self._request(0, obs, sd, mode, False, reply=self._eval_reply_key(),
                                      row_seeds=rows)
                out = restore_echoes(self.act_ch.get(key=reply), self._asked.pop(reply))
                obs, r, term, trunc, info = env.chunk_step(out.actions)
                ret += r.detach().cpu().double().reshape(n, -1).sum(-1)
                success = info["success"].cpu().bool()
                succ_once |= info["success_once"].cpu().bool()
            self._end_streams()
        per_task: Dict[str, list] = {}
        _count_tasks(per_task, obs["task_descriptions"], torch.ones(n, dtype=torch.bool), succ_once)
        return {
            "episodes": n,
            "per_task": per_task,
            "success_once": float(succ_once.float().sum()),
            "success_at_end": float(success.float().sum()),
            "episode_return": float(ret.sum()),
            "videos": [str(p) for p in recorder.videos] if recorder is not None else [],
            "trials": [{"trial": first + i, "seed": ev.trial_seed(run_seed, first + i),
                        "instruction": str(obs["task_descriptions"][i]),
                        "success_once": bool(succ_once[i]), "success_at_end": bool(success[i]),
                        "episode_return": float(ret[i])} for i in range(n)],
        }

    def _eval_env_for(self, n: int, videos: bool):
        """Cached evaluation env of n envs (a rendering one when videos need it)."""
        from rlinf_embodied.envs import make_env

        render = videos and getattr(self.cfg.env, "obs_mode", None) == "state" and hasattr(self.cfg.env, "render_images")
        key = (n, render)
        if key not in self._eval_envs:
            extra = {"render_images": True} if render else {}
            # fixed-length for every env (a training-only ignore_terminations_fraction does not apply)
            env_cfg = dataclasses.replace(self.cfg.env, num_envs=n, ignore_terminations=True,
                                          ignore_terminations_fraction=0.0, video=False, **extra)
            self._eval_envs[key] = make_env(env_cfg)
        return self._eval_envs[key]

    # -- profiling (scheduler, placement=auto) ----------------------------------------------
    def profile_step(self, batch: int) -> float:
        """One env step of ``batch`` envs (built once per size) with random actions, for the
        scheduler's profiler. Returns peak device memory in bytes (0 on CPU)."""
        from rlinf_embodied.envs import make_env

        if batch not in self._profile_envs:
            cfg = dataclasses.replace(self.cfg.env, num_envs=batch, video=False)
            self._profile_envs[batch] = env = make_env(cfg)
            env.reset(seed=0)
        env = self._profile_envs[batch]
        a = env.action_spec
        if a.discrete:
            actions = torch.randint(0, a.n, (batch, 1, 1))
        else:
            low, high = torch.as_tensor(a.low), torch.as_tensor(a.high)
            actions = low + (high - low) * torch.rand(batch, 1, a.dim)
        env.chunk_step(actions)
        return peak_bytes()

    def profile_close(self) -> None:
        """Close the envs built for profiling."""
        for env in self._profile_envs.values():
            env.close()
        self._profile_envs.clear()

    def close(self) -> None:
        """Close every env (their processes and files)."""
        self.profile_close()
        for env in [*self.envs, *self._eval_envs.values()]:
            env.close()


def _count_tasks(per_task: Dict[str, list], tasks, done: torch.Tensor, success: torch.Tensor) -> None:
    """Add the finished episodes (``done`` (n,) bool) to ``per_task``: instruction ->
    [episodes, successes]."""
    for i in torch.nonzero(done).reshape(-1).tolist():
        entry = per_task.setdefault(str(tasks[i]), [0, 0.0])
        entry[0] += 1
        entry[1] += float(success[i])


def _count_groups(succeeded: torch.Tensor, tasks: List[Any], group_ids: torch.Tensor) -> Dict[str, list]:
    """instruction -> [groups, mixed groups] from each env's ``succeeded`` ((n,) bool: an episode
    of it succeeded in this rollout), its instruction (``tasks``, n) and ``group_ids`` ((n,)
    int64). A group is mixed when some of its envs succeeded and some did not; a group is
    counted under its first env's instruction (a group shares its reset seed, so its task)."""
    out: Dict[str, list] = {}
    for g in torch.unique(group_ids).tolist():
        members = torch.nonzero(group_ids == g).reshape(-1)
        hits = succeeded[members]
        entry = out.setdefault(str(tasks[int(members[0])]), [0, 0])
        entry[0] += 1
        entry[1] += int(bool(hits.any()) and not bool(hits.all()))
    return out


class _Trajectory:
    """Time-major buffers of one stream: T policy queries of n envs."""

    def __init__(self, T: int):
        self.T = T
        self.steps: List[dict] = []
        self.bootstrap: Optional[torch.Tensor] = None

    def add(self, out: PolicyReply, rew, term, trunc, valid, info) -> None:
        self.steps.append(
            {
                "actions": out.actions,
                "logprobs": out.logprobs,
                "values": out.values,
                "forward_inputs": out.forward_inputs,
                "rewards": rew,
                "terminations": term,
                "truncations": trunc,
                "valid": valid,
                "success": info["success_once"].cpu().bool(),
            }
        )

    def to_dict(self) -> dict:
        st = self.steps
        d = {k: torch.stack([s[k] for s in st]) for k in st[0] if k not in ("forward_inputs", "values")}
        d["forward_inputs"] = {k: torch.stack([s["forward_inputs"][k] for s in st]) for k in st[0]["forward_inputs"]}
        if st[0]["values"] is not None:
            d["values"] = torch.stack([s["values"] for s in st] + [self.bootstrap])
        return d

