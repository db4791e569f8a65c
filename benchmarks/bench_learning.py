"""Learning benchmark: does the main job solve PushCube every time, and stay solved?

For each of 3 seeds, runs the main job (``configs/maniskill_pushcube_ppo_mlp.yaml``) through
the real CLI with ``trainer.target_success=null`` (it trains on after solving, so the end of
the run shows whether the policy stays solved) and reads its ``metrics.jsonl`` and
``eval/*.json``. Per seed: env steps and wall time to the first evaluation with
``success_once >= 0.95`` (the shipped job stops there), the final ``success_once`` /
``success_at_end``, and the lowest ``success_once`` of any evaluation after the first solve.
Wall times depend on the machine's speed (recorded: ``machine_env_step_ms``, one step of the
job's 16 envs in one process before training) and load (the mean 1-minute load average during
each run, sampled every 5 s); env steps do not.

Optional sections: ``--pickcube`` also runs ``configs/maniskill_pickcube_ppo_mlp.yaml``
(first eval success_once >= 0.8, 20-minute cap); ``--sft-rl DIR`` adds the ``summary.json`` of
an ``rlinf-embodied sft-rl`` run directory. ``--summarize DIR ...`` only reads existing main-job
run directories (no training). ``--quick``: one seed, at most 60 iterations (48k env steps).
Trailing ``key=value`` arguments override the main job's config (e.g. ``eval.num_episodes=128``).

Targets (issue 16, 2 cores): every seed reaches 0.95 within 6 minutes and ends with
success_once >= 0.95 and success_at_end >= 0.9. Prints one JSON line last.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAIN = "configs/maniskill_pushcube_ppo_mlp.yaml"
PICK = "configs/maniskill_pickcube_ppo_mlp.yaml"


class LoadSampler:
    """Samples the 1-minute load average every ``period`` seconds in a thread."""

    def __init__(self, period: float = 5.0):
        self.samples: list[float] = []
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, args=(period,), daemon=True)

    def _run(self, period: float) -> None:
        while not self._stop.is_set():
            self.samples.append(os.getloadavg()[0])
            self._stop.wait(period)

    def __enter__(self):
        self._t.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._t.join()

    @property
    def mean(self) -> float | None:
        return round(statistics.fmean(self.samples), 2) if self.samples else None


def summarize_run(run_dir: Path, target: float) -> dict:
    """Per-run learning numbers from a run directory's metrics.jsonl and eval/*.json."""
    evals = sorted((json.loads(p.read_text()) for p in (run_dir / "eval").glob("iter_*.json")),
                   key=lambda r: r["iteration"])
    times = {}
    metrics = run_dir / "metrics.jsonl"
    if metrics.exists():
        for line in metrics.read_text().splitlines():
            rec = json.loads(line)
            times[rec["iteration"]] = rec.get("time_s")
    first = next((r for r in evals if r["success_once"] >= target), None)
    after = [r for r in evals if first is not None and r["iteration"] >= first["iteration"]]
    out = {
        "run_dir": str(run_dir),
        "evals": len(evals),
        "curve": [[r["env_steps"], round(r["success_once"], 3), round(r["success_at_end"], 3)]
                  for r in evals],
        "solved": first is not None,
        "env_steps_to_target": first["env_steps"] if first else None,
        "train_wall_s_to_target": round(times.get(first["iteration"]), 1)
        if first and times.get(first["iteration"]) is not None else None,
        "final_success_once": evals[-1]["success_once"] if evals else None,
        "final_success_at_end": evals[-1]["success_at_end"] if evals else None,
        "min_success_once_after_solve": min(r["success_once"] for r in after) if after else None,
        "min_success_at_end_after_solve": min(r["success_at_end"] for r in after) if after else None,
        "final_env_steps": evals[-1]["env_steps"] if evals else None,
    }
    return out


def train_in_process(config: str, run_dir: Path, overrides: list[str]) -> dict:
    """The main job's learning loop in one process, without Ray (``--in-process``).

    Same env settings, policy, ``update_policy`` and LR schedule as the job, and the job's
    evaluation semantics (greedy, fixed-length episodes on the held-out seeds
    ``eval.seed_offset + run.seed * 1000 + i``); only the workers, channels and placement are
    left out. For measuring env steps to a success level on a machine too loaded to start
    Ray reliably. Writes ``eval/iter_*.json`` and ``metrics.jsonl`` like a run directory.
    """
    import dataclasses

    import torch

    from rlinf_embodied.algorithms.update import make_optimizer, update_policy
    from rlinf_embodied.runners.single_process import rollout_batch
    from rlinf_embodied.config import load_config
    from rlinf_embodied.envs import make_env
    from rlinf_embodied.policies import build_policy
    from rlinf_embodied.policies.base import SpaceSpec

    cfg = load_config(config, overrides)
    t, e = cfg.trainer, cfg.eval
    torch.set_num_threads(1)
    env = make_env(dataclasses.replace(cfg.env, num_processes=0))
    ev_env = make_env(dataclasses.replace(cfg.env, num_envs=e.num_episodes, num_processes=0,
                                          ignore_terminations=True))
    obs, _ = env.reset(seed=0)
    spec = SpaceSpec.from_env(env, obs)
    torch.manual_seed(cfg.run.seed)
    policy = build_policy(cfg.policy, spec)
    opt, sched = make_optimizer(policy, t)
    (run_dir / "eval").mkdir(parents=True, exist_ok=True)
    log = open(run_dir / "metrics.jsonl", "w")
    steps, t0 = 0, time.perf_counter()
    for it in range(t.iterations):
        env.set_success_hold_steps(cfg.env.hold_steps_at(it))
        obs, _ = env.reset(seed=cfg.run.seed * 1_000_000 + it * 1_000)
        batch, obs, n = rollout_batch(policy, env, obs, t.rollout_steps)
        steps += n
        train_metrics = update_policy(policy, opt, batch, cfg, it)
        sched.step()
        m = {"iteration": it + 1, "env_steps": steps, "time_s": time.perf_counter() - t0,
             "rollout/success_once": float(batch["success"].any(0).float().mean()),
             **{k: round(v, 4) for k, v in train_metrics.items()
                if k in ("train/entropy", "train/approx_kl", "train/minibatches")}}
        if t.eval_every and (it + 1) % t.eval_every == 0:
            o, _ = ev_env.reset(seed=e.seed_offset + cfg.run.seed * 1000)
            once = torch.zeros(ev_env.num_envs, dtype=torch.bool)
            for _ in range(ev_env.max_episode_steps):
                with torch.no_grad():
                    act = policy.act(o, mode="greedy").actions
                o, r, term, trunc, info = ev_env.chunk_step(act)
                once |= info["success_once"].bool()
            at_end = info["success"].bool()
            res = {"iteration": it + 1, "env_steps": steps, "episodes": ev_env.num_envs,
                   "success_once": float(once.float().mean()),
                   "success_at_end": float(at_end.float().mean())}
            (run_dir / "eval" / f"iter_{it + 1:06d}.json").write_text(json.dumps(res))
            m.update({f"eval/{k}": res[k] for k in ("success_once", "success_at_end")})
            print(json.dumps(m), flush=True)
        log.write(json.dumps(m) + "\n")
        log.flush()
    env.close()
    ev_env.close()
    return {"process_wall_s": round(time.perf_counter() - t0, 1)}


def machine_env_step_ms(config: str, steps: int = 30) -> float:
    """Median ms of one step of the job's env batch (its ``env.num_envs``, stepped in this
    process with zero actions, one torch thread), timed before training: how fast this
    machine is, so that wall times of runs on different machines can be compared (env
    steps can be compared as they are)."""
    import dataclasses

    import torch

    from rlinf_embodied.config import load_config
    from rlinf_embodied.envs import make_env

    cfg = load_config(config, [])
    torch.set_num_threads(1)
    env = make_env(dataclasses.replace(cfg.env, num_processes=0))
    env.reset(seed=0)
    zeros = torch.zeros(env.num_envs, 1, env.action_dim)
    times = []
    for _ in range(steps + 1):
        t0 = time.perf_counter()
        env.chunk_step(zeros)
        times.append(time.perf_counter() - t0)
    env.close()
    return round(1000 * statistics.median(times[1:]), 2)


def layered(base: list[str], overrides: list[str]) -> list[str]:
    """``base`` overrides without the keys ``overrides`` set, then ``overrides`` (the CLI
    refuses a key given twice)."""
    keys = {o.split("=", 1)[0] for o in overrides}
    return [o for o in base if o.split("=", 1)[0] not in keys] + list(overrides)


def train(config: str, run_dir: Path, overrides: list[str], timeout_s: float) -> dict:
    """Run ``rlinf-embodied train`` as a subprocess; returns wall time and mean load."""
    cmd = [sys.executable, "-m", "rlinf_embodied.cli", "train", config,
           *layered([f"run.dir={run_dir}", "eval.num_videos=0"], overrides)]
    t0 = time.perf_counter()
    with LoadSampler() as load:
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout_s)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-8:])
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{tail}")
    return {"process_wall_s": round(wall, 1), "mean_load": load.mean}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="one seed, at most 60 iterations (48k env steps)")
    ap.add_argument("--seeds", type=int, nargs="+", default=None)
    ap.add_argument("--target", type=float, default=0.95)
    ap.add_argument("--summarize", type=Path, nargs="+", default=None,
                    help="existing main-job run directories to summarise instead of training")
    ap.add_argument("--pickcube", action="store_true", help="also run the PickCube config")
    ap.add_argument("--pickcube-run", type=Path, default=None, help="existing PickCube run dir")
    ap.add_argument("--sft-rl", type=Path, default=None, help="an sft-rl run directory")
    ap.add_argument("--workdir", type=Path, default=None)
    ap.add_argument("--in-process", action="store_true",
                    help="the job's learning loop without Ray (env steps on a loaded machine)")
    ap.add_argument("overrides", nargs="*", default=[],
                    help="config overrides for the main job (key=value), e.g. eval.num_episodes=128")
    args = ap.parse_args(argv)
    seeds = args.seeds or ([1] if args.quick else [1, 2, 3])
    work = args.workdir or Path(tempfile.mkdtemp(prefix="bench_learning_"))
    load_start = os.getloadavg()[0]
    runs = []
    step_ms = None if args.summarize else machine_env_step_ms(MAIN)
    if args.summarize:
        runs = [summarize_run(d, args.target) for d in args.summarize]
    else:
        extra = ["trainer.target_success=null", "trainer.max_time_s=null"]
        if args.quick:
            extra.append("trainer.iterations=60")
        extra = layered(extra, args.overrides)
        for s in seeds:
            d = work / f"pushcube_seed{s}"
            if args.in_process:
                with LoadSampler() as load:
                    info = train_in_process(MAIN, d, layered([f"run.seed={s}"], extra))
                info["mean_load"] = load.mean
            else:
                info = train(MAIN, d, layered([f"run.seed={s}"], extra), timeout_s=3600)
            runs.append({"seed": s, **info, **summarize_run(d, args.target)})
            print(json.dumps({k: v for k, v in runs[-1].items() if k != "curve"}), flush=True)
    solved = [r for r in runs if r["solved"]]
    result = {
        "bench": "learning",
        "quick": args.quick,
        "mode": "summarize" if args.summarize else ("in_process" if args.in_process else "cli"),
        "main_job": MAIN,
        "target_success_once": args.target,
        "seeds": len(runs),
        "all_solved": len(solved) == len(runs) and bool(runs),
        "env_steps_to_target": [r["env_steps_to_target"] for r in runs],
        "train_wall_s_to_target": [r["train_wall_s_to_target"] for r in runs],
        "final_success_once": [r["final_success_once"] for r in runs],
        "final_success_at_end": [r["final_success_at_end"] for r in runs],
        "min_success_once_after_solve": [r["min_success_once_after_solve"] for r in runs],
        "mean_load": [r.get("mean_load") for r in runs],
        "process_wall_s": [r.get("process_wall_s") for r in runs],
        "load_at_start": round(load_start, 2),
        "machine_env_step_ms": step_ms,
        "runs": runs,
    }
    if args.pickcube or args.pickcube_run:
        d = args.pickcube_run or work / "pickcube"
        info = {} if args.pickcube_run else train(PICK, d, ["trainer.target_success=null"], 3600)
        pc = summarize_run(d, 0.8)
        result["pickcube"] = {**info, **pc}
    if args.sft_rl:
        result["sft_rl"] = json.loads((args.sft_rl / "summary.json").read_text())
    result["load_at_end"] = round(os.getloadavg()[0], 2)
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
