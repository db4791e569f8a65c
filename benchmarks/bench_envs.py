"""Env throughput: pool overhead on ManiSkill PushCube-v1 (state) and LIBERO step rates.

Measurements, not tests. Prints human-readable lines, then one JSON line last:

* ``raw_sps``: env steps/s of N raw single-env physx_cpu ManiSkill instances stepped in this
  process (torch 1 thread), the baseline;
* ``pool1_sps`` / ``pool2_sps``: the same N envs through ``ManiSkillEnv`` with a 1- and a 2-process
  pool; ``pool1_vs_raw`` (target >= 0.85) and ``pool2_vs_pool1`` (target >= 1.6 on 2 cores);
* ``libero_state_sps`` / ``libero_rgb_sps``: one LIBERO libero_spatial task-0 env in a 1-process
  pool, without rendering and with two 256x256 cameras.

Usage: ``python benchmarks/bench_envs.py [--quick] [--skip-libero]``
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import torch


def _rate(step, actions: np.ndarray, warmup: int) -> float:
    """Env steps/s of ``step(actions[t])`` over the steps after ``warmup``."""
    for t in range(warmup):
        step(actions[t])
    t0 = time.perf_counter()
    for t in range(warmup, len(actions)):
        step(actions[t])
    return (len(actions) - warmup) * actions.shape[1] / (time.perf_counter() - t0)


def bench_maniskill(num_envs: int, steps: int) -> dict:
    from rlinf_embodied.envs.maniskill import _make
    from rlinf_embodied.envs.registry import make_env
    from rlinf_embodied.config import ManiSkillEnvConfig

    torch.set_num_threads(1)
    rng = np.random.default_rng(0)
    actions = rng.uniform(-1, 1, (steps, num_envs, 8)).astype(np.float32)
    warmup = max(5, steps // 10)
    cfg = ManiSkillEnvConfig(env_id="PushCube-v1", num_envs=num_envs, sim_backend="physx_cpu",
                             max_episode_steps=10**6)
    raw = [_make(cfg, 1, "physx_cpu", "none") for _ in range(num_envs)]
    for i, e in enumerate(raw):
        e.reset(seed=i)

    def raw_step(a):
        for i, e in enumerate(raw):
            e.step(a[i : i + 1])

    out = {"raw_sps": _rate(raw_step, actions, warmup)}
    for e in raw:
        e.close()
    for procs in (1, 2):
        env = make_env(cfg, num_processes=procs)
        env.reset(seed=0)
        out[f"pool{procs}_sps"] = _rate(env.step, actions, warmup)
        env.close()
    out["pool1_vs_raw"] = out["pool1_sps"] / out["raw_sps"]
    out["pool2_vs_pool1"] = out["pool2_sps"] / out["pool1_sps"]
    return out


def bench_libero(steps: int) -> dict:
    from rlinf_embodied.envs.registry import make_env

    out = {}
    for mode in ("state", "rgb"):
        n = steps if mode == "state" else max(5, steps // 10)
        env = make_env("libero/libero_spatial", num_envs=1, obs_mode=mode, max_episode_steps=10**6)
        env.reset(seed=0)
        actions = np.zeros((n, 1, 7), np.float32)
        actions[..., -1] = -1.0
        out[f"libero_{mode}_sps"] = _rate(env.step, actions, warmup=2)
        env.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer steps (about a minute)")
    parser.add_argument("--skip-libero", action="store_true")
    parser.add_argument("--num-envs", type=int, default=8)
    args = parser.parse_args()
    result = {"num_envs": args.num_envs}
    result.update(bench_maniskill(args.num_envs, 300 if args.quick else 1500))
    if not args.skip_libero:
        result.update(bench_libero(60 if args.quick else 300))
    for key, value in result.items():
        print(f"{key:>18}: {value:.3f}" if isinstance(value, float) else f"{key:>18}: {value}")
    print(json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in result.items()}))


if __name__ == "__main__":
    main()
