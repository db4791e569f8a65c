"""Env throughput: pool overhead on ManiSkill PushCube-v1 (state), LIBERO step rates, suite chunks.

Measurements, not tests. Prints human-readable lines, then one JSON line last:

Rates are the best of several interleaved rounds (the machine's cores may be shared).

* ``raw_sps``: env steps/s of N raw single-env physx_cpu ManiSkill instances stepped in this
  process (torch 1 thread), the baseline;
* ``pool1_sps`` / ``pool2_sps``: the same N envs through ``ManiSkillEnv`` with a 1- and a 2-process
  pool; ``pool1_vs_raw`` (target >= 0.85) and ``pool2_vs_pool1`` (target >= 1.6 on 2 cores);
* ``pool1_vs_raw_cpu``: the same ratio in env steps per CPU second (pool workers included),
  which other load on the machine does not distort; ``load_avg_1m_at_start`` says how busy the
  machine was (the wall-clock ratios need free cores: 2 for ``pool2_vs_pool1``);
* ``libero_state_sps`` / ``libero_rgb_sps``: one LIBERO libero_spatial task-0 env in a 1-process
  pool, without rendering and with two 256x256 cameras; ``libero_rgb_chunk8_sps``: the same
  in action chunks of 8 (OFT's LIBERO K), whose 7 inner steps render no camera, and
  ``libero_chunk8_vs_step`` its speed-up;
* ``suite_rgb_step_sps`` / ``suite_rgb_chunk4_sps``: env steps/s of the ``maniskill_lang3``
  suite (64 px camera, ``num_envs`` envs, 2-process pool) stepped one observed step at a time
  and in action chunks of 4 whose inner steps skip rendering (``SubBatch.step_unobserved``);
  ``suite_chunk4_vs_step`` is the speed-up of a chunked rollout (OFT's K = 4);
  ``suite_render_ms`` / ``suite_physics_ms``: one raw suite env's camera capture and its
  step without observation, per step.

Usage: ``python benchmarks/bench_envs.py [--quick] [--skip-libero] [--skip-maniskill] [--skip-suite]``
"""

from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np
import torch


def _cpu_seconds(pids) -> float:
    """User + system CPU seconds of this process and of ``pids`` so far."""
    import psutil

    total = time.process_time()
    for pid in pids:
        t = psutil.Process(pid).cpu_times()
        total += t.user + t.system
    return total


def _rate(step, actions: np.ndarray, warmup: int, pids=()) -> tuple:
    """(env steps per wall second, env steps per CPU second) of ``step(actions[t])``.

    The CPU-second rate counts this process and the pool workers ``pids``: it measures the
    pool's overhead independently of other load on the machine.
    """
    for t in range(warmup):
        step(actions[t])
    c0, t0 = _cpu_seconds(pids), time.perf_counter()
    for t in range(warmup, len(actions)):
        step(actions[t])
    wall, cpu = time.perf_counter() - t0, _cpu_seconds(pids) - c0
    n = (len(actions) - warmup) * actions.shape[1]
    return n / wall, n / max(cpu, 1e-9)


def bench_maniskill(num_envs: int, steps: int, rounds: int) -> dict:
    """Best-of-``rounds`` rates, the three setups interleaved (the CPUs may be shared)."""
    from rlinf_embodied.envs.configuration_maniskill import ManiSkillEnvConfig
    from rlinf_embodied.envs.maniskill import _make
    from rlinf_embodied.envs.registry import make_env

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

    setups = {"raw": (raw_step, [])}
    pools = [make_env(cfg, num_processes=p) for p in (1, 2)]
    for p, env in zip((1, 2), pools):
        env.reset(seed=0)
        setups[f"pool{p}"] = (env.step, env.worker_pids())
    out = {}
    for _ in range(rounds):
        for key, (step, pids) in setups.items():
            wall, cpu = _rate(step, actions, warmup, pids)
            out[f"{key}_sps"] = max(out.get(f"{key}_sps", 0.0), wall)
            out[f"{key}_sps_per_cpu"] = max(out.get(f"{key}_sps_per_cpu", 0.0), cpu)
    for e in raw:
        e.close()
    for env in pools:
        env.close()
    out["pool1_vs_raw"] = out["pool1_sps"] / out["raw_sps"]
    out["pool2_vs_pool1"] = out["pool2_sps"] / out["pool1_sps"]
    out["pool1_vs_raw_cpu"] = out["pool1_sps_per_cpu"] / out["raw_sps_per_cpu"]
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
        out[f"libero_{mode}_sps"] = _rate(env.step, actions, 2, env.worker_pids())[0]
        if mode == "rgb":  # OFT's LIBERO chunk: the 7 inner steps skip the cameras
            chunks = torch.zeros(max(4, n // 8), 1, 8, 7)  # (chunks, envs, K, A)
            chunks[..., -1] = -1.0
            out["libero_rgb_chunk8_sps"] = _rate(env.chunk_step, chunks, 2, env.worker_pids())[0] * 8
            out["libero_chunk8_vs_step"] = out["libero_rgb_chunk8_sps"] / out["libero_rgb_sps"]
        env.close()
    return out


def bench_suite(num_envs: int, steps: int, rounds: int) -> dict:
    """Chunked vs single-step rates of the language-conditioned suite, plus one raw env's
    per-step breakdown (camera vs physics + reward)."""
    from rlinf_embodied.envs.configuration_maniskill import ManiSkillEnvConfig
    from rlinf_embodied.envs.maniskill import _make, step_without_obs
    from rlinf_embodied.envs.registry import make_env

    torch.set_num_threads(1)
    cfg = ManiSkillEnvConfig(suite="maniskill_lang3", obs_mode="rgb", num_envs=num_envs,
                             sensor_size=64, control_mode="pd_ee_delta_pose",
                             max_episode_steps=10**6)
    rng = np.random.default_rng(0)
    actions = rng.uniform(-0.3, 0.3, (steps, num_envs, 7)).astype(np.float32)
    env = make_env(cfg, num_processes=2)
    env.reset(seed=0)
    chunks = torch.as_tensor(actions.reshape(steps // 4, 4, num_envs, 7).transpose(0, 2, 1, 3))
    out = {}
    for _ in range(rounds):
        wall = _rate(env.step, actions, 4, env.worker_pids())[0]
        out["suite_rgb_step_sps"] = max(out.get("suite_rgb_step_sps", 0.0), wall)
        wall = _rate(env.chunk_step, chunks, 1, env.worker_pids())[0] * 4
        out["suite_rgb_chunk4_sps"] = max(out.get("suite_rgb_chunk4_sps", 0.0), wall)
    env.close()
    out["suite_chunk4_vs_step"] = out["suite_rgb_chunk4_sps"] / out["suite_rgb_step_sps"]
    raw = _make(cfg, 1, "physx_cpu", "cpu", env_id="PushCube-v1")
    raw.reset(seed=0)
    info, n = raw.get_info(), 50
    t0 = time.perf_counter()
    for _ in range(n):
        raw.get_obs(info)
    out["suite_render_ms"] = (time.perf_counter() - t0) / n * 1e3
    t0 = time.perf_counter()
    for t in range(n):
        step_without_obs(raw, actions[t, :1])
    out["suite_physics_ms"] = (time.perf_counter() - t0) / n * 1e3
    raw.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer steps (about a minute)")
    parser.add_argument("--skip-libero", action="store_true", help="no LIBERO step rates")
    parser.add_argument("--skip-maniskill", action="store_true",
                        help="no PushCube pool-overhead rates")
    parser.add_argument("--skip-suite", action="store_true",
                        help="no maniskill_lang3 chunked vs single-step rates")
    parser.add_argument("--num-envs", type=int, default=8)
    args = parser.parse_args()
    if args.num_envs < 1:
        parser.error(f"--num-envs must be >= 1 (got {args.num_envs})")
    result = {"num_envs": args.num_envs, "load_avg_1m_at_start": os.getloadavg()[0],
              "cpu_count": os.cpu_count()}
    if not args.skip_maniskill:
        result.update(bench_maniskill(args.num_envs, 300 if args.quick else 1000,
                                      2 if args.quick else 3))
    if not args.skip_libero:
        result.update(bench_libero(60 if args.quick else 300))
    if not args.skip_suite:
        result.update(bench_suite(args.num_envs, 80 if args.quick else 240, 2 if args.quick else 3))
    for key, value in result.items():
        print(f"{key:>21}: {value:.3f}" if isinstance(value, float) else f"{key:>21}: {value}")
    print(json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in result.items()}))


if __name__ == "__main__":
    main()
