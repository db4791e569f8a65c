"""The embodied RL main loop: sync weights -> rollout -> advantages + train -> eval -> checkpoint.

The same code runs every placement (collocated, disaggregated, hybrid): where each group runs and
whether it context-switches is data (``configs/placement/*.yaml``), read by the runtime.
"""

from __future__ import annotations

import json
import shutil
import time
import uuid
from pathlib import Path
from typing import Optional

from rlinf_embodied.checkpoint import (
    atomic_write_json,
    checkpoint_dir,
    latest_loadable_checkpoint,
)
from rlinf_embodied.config import ConfigError, JobConfig, as_dict, save_config
from rlinf_embodied.metrics import MetricLogger, last_time_s, plot_curves
from rlinf_embodied.runners.branches import set_aside_after
from rlinf_embodied.runners.budget import over_budget
from rlinf_embodied.runners.restarts import (
    RANK_LOSS_ERRORS,
    RayGoneError,
    RunLostError,
    driver_node_gone,
    lost_nodes,
    lost_ranks,
    ray_head_gone,
    wait_for_capacity,
)
from rlinf_embodied.runners.setup import Groups, check_divisibility, group_ranks, launch_groups
from rlinf_embodied.runners.signals import StopSignals
from rlinf_embodied.runtime import PlacementError, wait_all

__all__ = ["EmbodiedRunner", "per_task_rates", "mixed_group_rates", "read_state"]


def _sum_per_task(stats: list, key: str) -> dict:
    """instruction -> [count, hits] summed over the env ranks' ``stats[key]``."""
    total: dict = {}
    for s in stats:
        for task, (n, k) in s.get(key, {}).items():
            t = total.setdefault(task, [0, 0])
            t[0] += n
            t[1] += k
    return total


def per_task_rates(prefix: str, stats: list) -> dict:
    """``{prefix/<task>: success rate}`` from the env ranks' ``per_task`` (instruction ->
    [episodes, successes]); empty when the envs serve one task (nothing to break down)."""
    total = _sum_per_task(stats, "per_task")
    if len(total) < 2:
        return {}
    return {f"{prefix}/{task.replace(' ', '_')}": k / n for task, (n, k) in sorted(total.items()) if n}


def mixed_group_rates(stats: list) -> dict:
    """``rollout/mixed_groups`` (and ``rollout/mixed_groups/<task>`` when the envs serve
    several tasks): the fraction of GRPO groups in which some envs succeeded and some did not,
    from the env ranks' ``per_task_groups`` (instruction -> [groups, mixed groups]). A group
    in which every env failed carries no gradient under a sparse reward (one in which all
    succeeded, only their difference in steps held); a task whose fraction stays near 0 gets
    little from GRPO."""
    total = _sum_per_task(stats, "per_task_groups")
    n_all = sum(n for n, _ in total.values())
    if not n_all:
        return {}
    out = {"rollout/mixed_groups": sum(k for _, k in total.values()) / n_all}
    if len(total) > 1:
        out.update({f"rollout/mixed_groups/{task.replace(' ', '_')}": k / n
                    for task, (n, k) in sorted(total.items()) if n})
    return out


def eval_record(stats: list, iteration: int, env_steps: int, batch_invariant: bool) -> tuple:
    """``(metrics, record)`` of one in-training evaluation from the env ranks' ``stats``
    (``episodes``, ``success_once`` / ``success_at_end`` counts, ``episode_return`` sum,
    ``per_task``, ``videos``, ``trials``). ``metrics`` has ``eval/<name>`` rates (and
    ``eval/success_once/<task>``); ``record``, written to ``eval/iter_*.json``, has the
    rates over all tasks (the best checkpoint is chosen by its ``success_once``) and
    ``success_once_per_task``."""
    n = sum(r["episodes"] for r in stats)
    overall = {k: sum(r[k] for r in stats) / n for k in ("success_once", "success_at_end", "episode_return")}
    per_task = per_task_rates("eval/success_once", stats)
    metrics = {**{f"eval/{k}": v for k, v in overall.items()}, **per_task}
    record = {"iteration": iteration, "env_steps": env_steps, "episodes": n, **overall,
              "success_once_per_task": {k.split("/", 2)[2]: v for k, v in per_task.items()},
              "videos": [v for r in stats for v in r["videos"]],
              # per trial, to pair with `rlinf-embodied eval --policy <this run's checkpoint
              # of this iteration> --run-trials` (equal trial by trial when batch-invariant)
              "batch_invariant": batch_invariant,
              "trials": sorted((t for r in stats for t in r["trials"]), key=lambda t: t["trial"])}
    return metrics, record


def read_state(ckpt: Path, run_dir: Path) -> tuple:
    """``(runner state, elapsed seconds)`` of checkpoint ``ckpt`` of ``run_dir``: its
    ``runner_state.json`` without ``elapsed_s``, and ``elapsed_s`` (for a checkpoint saved
    without it: the ``time_s`` of the run's last metric record at or before its iteration)."""
    state = json.loads((ckpt / "runner_state.json").read_text())
    elapsed = state.pop("elapsed_s", None)
    if elapsed is None:
        elapsed = last_time_s(run_dir, state["iteration"])
    return state, float(elapsed)


class EmbodiedRunner:
    """Runs one training job in ``run_dir``.

    With ``resume`` it continues from ``checkpoint``, by default the newest checkpoint of the
    run that passes :func:`~rlinf_embodied.checkpoint.checkpoint_problem` (damaged ones are
    skipped with a warning). ``signals`` handles Ctrl-C / SIGTERM (the CLI installs it before
    the workers start, so a signal during startup is handled too).
    """

    actor_cls = None
    """Actor worker class (None: ActorWorker); the elastic runner swaps in its own."""

    def __init__(self, cfg: JobConfig, run_dir: Path, resume: bool = False,
                 signals: Optional[StopSignals] = None, checkpoint: Optional[Path] = None):
        self.cfg, self.run_dir = cfg, Path(run_dir)
        self.signals = signals or StopSignals()
        self.saved: Optional[Path] = None
        """The newest checkpoint of the run (written by this process or resumed from)."""
        ckpt = (checkpoint or latest_loadable_checkpoint(self.run_dir)) if resume else None
        if resume and ckpt is None:
            print(f"no loadable checkpoint in {self.run_dir}: starting from iteration 0")
        if not resume:  # a resumed run keeps its config.yaml until its workers have started
            save_config(cfg, self.run_dir)
        self.state = {"iteration": 0, "env_steps": 0}
        elapsed = 0.0  # seconds trained before this command: time_s goes on from them
        if ckpt is not None:
            self.state, elapsed = read_state(ckpt, self.run_dir)
            self.saved = ckpt
            print(f"resuming from {ckpt} (iteration {self.state['iteration']}, "
                  f"{elapsed:.0f} s trained)")
            later = set_aside_after(self.run_dir, self.state["iteration"])
            if later:  # trained again now: their old records would mix two histories
                print(f"warning: the run had gone on past iteration {self.state['iteration']}; "
                      f"its records of those iterations ({', '.join(later)}) moved to "
                      f"{self.run_dir / 'abandoned'}")
        self.restarts = 0
        """Restarts so far (``trainer.max_restarts``)."""
        self.ray_gone = False
        """The driver's own Ray node or the cluster's head died (:class:`RayGoneError`): no
        restart, and no shutdown calls (they would block on the dead processes)."""
        self._eval_s = 0.0
        """Seconds the last in-training evaluation took (``trainer.max_time_s``'s forecast)."""
        try:
            self.g = self._launch(ckpt)
        except BaseException:
            if not resume and [p.name for p in self.run_dir.iterdir()] == ["config.yaml"]:
                shutil.rmtree(self.run_dir)  # nothing ran: leave no empty run directory behind
            raise
        if resume or self.g.cfg != cfg:  # placement=auto may have chosen the granularity
            self.cfg = cfg = self.g.cfg
            save_config(cfg, self.run_dir)
        self.log = MetricLogger(self.run_dir, cfg.logging.tensorboard, cfg.logging.wandb,
                                cfg.logging.console, cfg.logging.wandb_project, as_dict(cfg),
                                elapsed_s=elapsed)
        self._saved_at = self.state["iteration"] if ckpt is not None else -1
        self.interrupted = False

    @property
    def _stop(self) -> bool:
        return self.signals.requested

    def _launch(self, ckpt: Optional[Path], cluster=None, plan=None) -> Groups:
        """Start the worker groups (set up from ``ckpt``; on ``cluster`` with ``plan`` when
        restarting). The elastic runner adds its pool."""
        return launch_groups(self.cfg, self.run_dir, f"run-{uuid.uuid4().hex[:8]}", ckpt,
                             plan=plan, actor_cls=self.actor_cls, cluster=cluster)

    def run(self) -> dict:
        """Train until ``trainer.iterations`` (or ``max_time_s`` / ``target_success``, or a
        stop signal: then the current iteration finishes and a checkpoint is saved).
        ``trainer.max_time_s`` budgets this command's seconds (from this call, a resumed run's
        too), while ``time_s`` in ``metrics.jsonl`` goes on from the resumed run's. A lost
        rank or node of the placed groups restarts them from the newest checkpoint (at most
        ``trainer.max_restarts`` times, :mod:`~rlinf_embodied.runners.restarts`). Returns the
        runner state (``iteration``, ``env_steps``, ...); ``self.saved`` names the last
        checkpoint and ``self.interrupted`` / ``self.signals.aborted`` say how it ended.

        Raises:
            RunLostError: restarts used up, or no reserved capacity fits the placement.
        """
        start = time.time()
        owns_handlers = not self.signals._prev
        self.signals.install()
        self.signals.phase = "training"
        try:
            while self.state["iteration"] < self.cfg.trainer.iterations and not self._stop:
                try:
                    if self._iteration(start):
                        break
                except RANK_LOSS_ERRORS as err:
                    try:
                        self._restart(err)
                    except RayGoneError:
                        self.ray_gone = True  # the shutdown below would wait on dead processes
                        raise
            self.interrupted = self._stop
            if self._stop and self.state["iteration"] > 0 and self._saved_at != self.state["iteration"]:
                print("interrupted: saving a final checkpoint")
                self.save()
        except KeyboardInterrupt:
            self.interrupted = True  # aborted (a second Ctrl-C): nothing more is saved
        finally:
            self.signals.phase = "exiting"
            try:
                self.log.close()
                plot_curves(self.run_dir)
            finally:
                if not self.ray_gone:
                    self.g.shutdown()
                if owns_handlers:
                    self.signals.restore()
        return self.state

    def _iteration(self, start: float) -> bool:
        """One iteration: weights, rollout, update, metrics, evaluation and checkpoint when
        due. Returns True when the run is done (last iteration, time or target reached)."""
        cfg, g, t = self.cfg, self.g, self.cfg.trainer
        it = self.state["iteration"]
        t_iter = time.time()
        m = {"time/weight_sync_s": g.sync.push(it)}
        env_stats, tm = self._rollout_and_train(it, m)
        m["time/context_switch_s"] = max(
            sum(grp.context_switch_seconds().wait()) for grp in (g.env, g.rollout, g.actor))
        m.update({k: sum(d[k] for d in tm) / len(tm) for k in tm[0]})
        steps = sum(s["env_steps"] for s in env_stats)
        eps = sum(s["episodes"] for s in env_stats)
        self.state["env_steps"] += steps
        self.state["iteration"] = it + 1
        m["time/env_steps_per_s"] = steps / max(1e-9, m["time/rollout_s"] + m["time/train_s"] + m["time/weight_sync_s"])
        if eps:
            m["rollout/success_once"] = sum(s["success_once"] for s in env_stats) / eps
            m.update(per_task_rates("rollout/success_once", env_stats))
            if cfg.algorithm.advantage == "grpo":
                m.update(mixed_group_rates(env_stats))
            m["rollout/episode_return"] = sum(s["episode_return"] for s in env_stats) / eps
            m["rollout/episodes"] = eps
        m["rollout/env_errors"] = sum(s["env_errors"] for s in env_stats)
        if cfg.env.success_hold_ramp is not None:
            m["rollout/success_hold_steps"] = cfg.env.hold_steps_at(it)
        evaluating = bool(t.eval_every) and self.state["iteration"] % t.eval_every == 0
        now = time.time()
        # stop before an iteration that would end past the budget: the next one is predicted
        # to take as long as this one, after this one's evaluation (as long as the last one)
        timed_out = over_budget(now - start, now - t_iter, t.max_time_s,
                                due_s=self._eval_s if evaluating else 0.0)
        done = self.state["iteration"] == t.iterations or timed_out
        videos = cfg.eval.num_videos
        if t.eval_every and (evaluating or done):
            t_eval = time.time()
            if cfg.logging.console:  # the iteration's line comes after it: say what runs now
                filming = f" and filming {videos}" if done and videos else ""
                last = f" (the last one took {self._eval_s:.0f} s)" if self._eval_s else ""
                print(f"iteration {self.state['iteration']}: evaluating {cfg.eval.num_episodes} "
                      f"episodes{filming}{last} ...", flush=True)
            m.update(self.evaluate(self.state["iteration"], videos=videos if done else 0))
            self._eval_s = time.time() - t_eval
            if not done and t.target_success is not None and m["eval/success_once"] >= t.target_success:
                print(f"eval success_once {m['eval/success_once']:.3f} >= "
                      f"trainer.target_success={t.target_success}: solved, stopping.")
                done = True  # same seeds, greedy: re-evaluating adds the videos
                m.update(self.evaluate(self.state["iteration"], videos=videos))
        self.log.log(m, self.state["env_steps"], self.state["iteration"])
        if t.save_every and (self.state["iteration"] % t.save_every == 0 or done):
            self.save()
        if timed_out:
            print(f"trainer.max_time_s={t.max_time_s}: stopped after iteration "
                  f"{self.state['iteration']}, trained by {now - start:.1f} s in this command: "
                  f"another would end past the budget (checkpoint and final evaluation saved, "
                  f"{time.time() - start:.1f} s in this command, {self.log.elapsed():.1f} s in "
                  f"the whole run).")
        return done

    def _restart(self, err: BaseException) -> None:
        """After a failed iteration: when ranks of the placed groups are lost, stop the groups
        and start them again from the newest complete checkpoint on the reserved capacity
        there is (waiting up to ``trainer.restart_wait_s`` for the devices they had). Logged
        to the console and as a ``restart`` event row in ``metrics.jsonl``; the records of
        the iterations that run again (after the checkpoint) are set aside as a resume sets
        them aside (:func:`~rlinf_embodied.runners.branches.set_aside_after`).

        Raises:
            err: when no rank is lost (the failure is not a lost process: a bug).
            RunLostError: ``trainer.max_restarts`` used up, or no capacity fits.
        """
        g, t = self.g, self.cfg.trainer
        why = ray_head_gone()  # before any Ray call: those block once the GCS is gone
        if why:
            raise RayGoneError(f"iteration {self.state['iteration'] + 1} failed: {why}") from err
        groups = {"env": g.env, "rollout": g.rollout, "actor": g.actor}
        lost = lost_ranks(groups)
        if not lost:
            raise err
        reached = self.state["iteration"]
        what = f"lost {', '.join(lost)} during iteration {reached + 1}"
        t0 = time.monotonic()
        gone = lost_nodes(groups)
        why = driver_node_gone(gone)
        if why:
            raise RayGoneError(f"{what}: {why}") from err
        if self.restarts >= t.max_restarts:
            raise RunLostError(f"{what}; trainer.max_restarts={t.max_restarts} restart(s) "
                               f"used up") from err
        self.restarts += 1
        ckpt = latest_loadable_checkpoint(self.run_dir)
        # the logger's clock goes on: time_s counts the lost iterations' time too
        state = (read_state(ckpt, self.run_dir)[0] if ckpt is not None
                 else {"iteration": 0, "env_steps": 0})
        since = (f"checkpoint {ckpt.name} (iteration {state['iteration']})" if ckpt is not None
                 else "the start (no checkpoint saved yet)")
        again = (f"iteration {reached + 1} runs again" if reached == state["iteration"] else
                 f"iterations {state['iteration'] + 1}-{reached + 1} run again")
        print(f"restart {self.restarts}/{t.max_restarts}: {what} ({type(err).__name__}); "
              f"restarting the placed groups from {since}: {again}", flush=True)
        if reached > state["iteration"]:  # as a resume does: one history, not two
            later = self.log.with_file_closed(lambda: set_aside_after(self.run_dir, state["iteration"]))
            if later:
                print(f"restart {self.restarts}/{t.max_restarts}: the records of the iterations "
                      f"run again ({', '.join(later)}) moved to {self.run_dir / 'abandoned'}",
                      flush=True)
        wanted = group_ranks(g.plan, g.cluster.num_devices)
        g.shutdown(keep_cluster=True, close_timeout=5.0)
        t_wait = time.monotonic()

        def shape(devices: int):
            try:
                g.plan.validate(devices)
                ranks = group_ranks(g.plan, devices)
                check_divisibility(self.cfg, ranks["env"], ranks["actor"])
            except (PlacementError, ConfigError):
                return None
            return ranks

        # the run stands at its checkpoint now: what a Ctrl-C during the wait reports
        self.state, self.saved = state, ckpt
        self._saved_at = state["iteration"] if ckpt is not None else -1
        self.signals.phase = "waiting"  # a stop ends the run here (nothing runs to finish)
        try:
            wait_for_capacity(g.cluster, shape, wanted, t.restart_wait_s, gone)
        finally:
            self.signals.phase = "training"
        t_launch = time.monotonic()
        self.g = self._launch(ckpt, cluster=g.cluster, plan=g.plan)
        now = time.monotonic()
        self.log.event("restart", self.state["env_steps"], state["iteration"], **{
            "restart/count": self.restarts, "restart/from_iteration": state["iteration"],
            "restart/lost_iterations": reached - state["iteration"],
            "restart/seconds": now - t0, "restart/stop_s": t_wait - t0,
            "restart/capacity_wait_s": t_launch - t_wait, "restart/launch_s": now - t_launch,
            "restart/lost": lost, "restart/error": str(err).splitlines()[0][:300]})
        print(f"restart {self.restarts}/{t.max_restarts}: groups up again after {now - t0:.1f} s "
              f"(finding and stopping the lost ones {t_wait - t0:.1f} s, waiting for capacity "
              f"{t_launch - t_wait:.1f} s, starting {now - t_launch:.1f} s); continuing with "
              f"iteration {state['iteration'] + 1}", flush=True)

    def _rollout_and_train(self, it: int, m: dict):
        """Iteration ``it``'s rollout, then one update; adds ``time/...`` entries to ``m``.

        The hook the elastic runner (rlinf_embodied/elastic/runner.py) overrides.

        Returns:
            (per-env-rank rollout stats, per-actor-rank train metrics).
        """
        g = self.g
        t0 = time.perf_counter()
        serve = g.rollout.serve(it)
        env = g.env.rollout(it)
        env_stats, _ = wait_all(env, serve)
        m["time/rollout_s"] = time.perf_counter() - t0
        m["time/env_step_s"] = max(s["env_time_s"] for s in env_stats)
        m["time/generate_s"] = serve.timing.max
        t0 = time.perf_counter()
        tm = g.actor.train(it).wait()
        m["time/train_s"] = time.perf_counter() - t0
        return env_stats, tm

    def evaluate(self, iteration: int, videos: int = 0) -> dict:
        """Greedy, fixed-length evaluation on seeds disjoint from training; writes eval JSON."""
        g, e = self.g, self.cfg.eval
        g.sync.push(iteration)  # the weights just trained (the next iteration reuses them)
        res = g.env.evaluate(iteration, e.num_episodes, videos)
        srv = g.rollout.serve()
        out, _ = wait_all(res, srv)
        metrics, record = eval_record(out, iteration, self.state["env_steps"], e.batch_invariant)
        atomic_write_json(self.run_dir / "eval" / f"iter_{iteration:06d}.json", record)
        atomic_write_json(self.run_dir / "eval" / "latest.json", record)
        if record["success_once"] >= self.state.get("best_success_once", -1.0):
            self.state["best_success_once"] = record["success_once"]
            self.state["best_iteration"] = iteration
            self.save("best")  # checkpoints/best: the policy with the best eval so far
        return metrics

    def save(self, name: Optional[str] = None) -> Path:
        """Checkpoint ``iter_<iteration>`` (or ``name``, e.g. ``best``, outside the rotation);
        its ``runner_state.json`` holds the runner state and ``elapsed_s``, the seconds the run
        has trained (``time_s`` of ``metrics.jsonl``), from which a resumed run's time goes on."""
        periodic = name is None
        name = name or f"iter_{self.state['iteration']:06d}"
        with checkpoint_dir(self.run_dir, name, keep=self.cfg.trainer.keep_checkpoints,
                            update_latest=periodic) as d:
            self.g.actor.save(str(d)).wait()
            atomic_write_json(d / "runner_state.json", {**self.state, "elapsed_s": self.log.elapsed()})
        if periodic:
            self._saved_at = self.state["iteration"]
            self.saved = self.run_dir / "checkpoints" / name
        return self.run_dir / "checkpoints" / name
