"""Evaluation throughput: LIBERO episodes per hour with the random policy.

Runs ``rlinf_embodied.eval.run.evaluate`` on libero_spatial task 0 for state-only and rendered
(two cameras) observations, with 1 and 2 env processes (one env per process), and reports
episodes per hour measured from the moment the env is built to the last finished episode (env
construction excluded: it is paid once per evaluation). The random policy never succeeds, so
every episode runs to max steps.

Full mode uses the openvla_v1 settings (220 max steps, 256 px); ``--quick`` shortens episodes
(40 steps) and renders 128 px. Prints one JSON line last; ``libero_rgb_eph_2proc_vs_1`` is the
scaling of rendered evaluation from 1 to 2 processes (target >= 1.6 on an idle 2-core machine).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("MUJOCO_GL", "egl")
# One core per env process (ENVIRONMENT.md): Mesa's software rasteriser (llvmpipe) otherwise
# starts one render thread per CPU in every process, so a single process already uses every
# core and process scaling measures contention. Inherited by the pool workers.
os.environ.setdefault("LP_NUM_THREADS", "1")


def run_one(obs_mode: str, procs: int, episodes: int, max_steps: int, image_size: int,
            workdir: Path) -> float:
    """Episodes per hour of one configuration."""
    from rlinf_embodied.envs.registry import make_env
    from rlinf_embodied.eval.request import EvalRequest
    from rlinf_embodied.eval.run import evaluate

    built = {}

    def factory(cfg):
        env = make_env(cfg)
        built["t"] = time.perf_counter()
        return env

    out = workdir / f"{obs_mode}_{procs}.json"
    res = evaluate(EvalRequest(
        env="libero", suite="libero_spatial", tasks=[0], trials_per_task=episodes,
        num_envs=procs, num_processes=procs, obs_mode=obs_mode, policy="random",
        max_steps=max_steps, image_size=image_size if obs_mode == "rgb" else None,
        output=str(out), reports=False, env_factory=factory,
    ))
    elapsed = time.perf_counter() - built["t"]
    assert len(res.episodes) == episodes
    return episodes / elapsed * 3600.0


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="short episodes, 128 px")
    ap.add_argument("--episodes", type=int, default=None, help="episodes per configuration")
    args = ap.parse_args(argv)
    max_steps, size = (40, 128) if args.quick else (220, 256)
    episodes = args.episodes or 4
    result = {"bench": "eval", "quick": args.quick, "suite": "libero_spatial",
              "max_steps": max_steps, "image_size": size, "episodes": episodes,
              "cpus": os.cpu_count(), "load_avg_start": os.getloadavg()[0]}
    with tempfile.TemporaryDirectory() as tmp:
        for mode in ("state", "rgb"):
            for procs in (1, 2):
                eph = run_one(mode, procs, episodes, max_steps, size, Path(tmp))
                result[f"libero_{mode}_eph_{procs}proc"] = round(eph, 1)
                print(f"{mode} {procs} proc: {eph:.0f} episodes/hour", file=sys.stderr)
            result[f"libero_{mode}_eph_2proc_vs_1"] = round(
                result[f"libero_{mode}_eph_2proc"] / result[f"libero_{mode}_eph_1proc"], 3)
    result["load_avg_end"] = os.getloadavg()[0]
    result["target_rgb_2proc_vs_1"] = 1.6
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
