"""VLA learning benchmark: does SFT -> RL make a miniature OpenVLA / OpenVLA-OFT / π0 / π0.5 better?

Per family (``--family openvla|openvla_oft|pi0|pi05|all``, families named by their ``policy.type``; ``oft`` is accepted for ``openvla_oft``; ``all``: every family) it runs the family's whole pipeline through the real
CLI (``rlinf-embodied sft-rl configs/sft/maniskill_lang3_sft_rl_<family>.yaml``: motion-planning
demos, SFT, the step-0 gate, RL, evaluation) in a fresh run directory (demos are shared between
families and reused when present) and reads its ``summary.json`` and the RL run's
``metrics.jsonl``. Per family:

* ``sft_success`` / ``rl_success``: success over every held-out trial of the suite's protocol
  (``maniskill_lang3_v1``, the same trials for both), with Wilson 95% intervals, and per task;
* ``mcnemar_p``: McNemar's exact paired test of the two on the same trials;
* ``stages``: wall seconds and env steps of demos, SFT, SFT evaluation, gate, RL, RL evaluation;
* ``rollout_vs_train_logprob_max_abs_diff``: the largest |rollout log-prob - recomputed
  log-prob| of the first minibatch of every update (``train/rollout_logprob_diff_max``; about 0
  when rollout and training compute the same distribution);
* ``load_avg``: mean 1-minute load average during the run (other processes share the cores:
  wall times are noisy, env steps are not).

``--quick`` (``make bench``): tiny settings that check the chain end to end in a few minutes
(1 demo per task, 2 tasks, 32 px (π0 / π0.5: the 32 px ``tiny`` preset), 30 SFT steps, 2 RL
iterations, 2 trials per task); its success rates mean nothing. ``--summarize DIR ...`` reads finished pipeline directories
instead of running. Prints one JSON line last: ``{"families": {"<name>": {...}}, ...}``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from bench_learning import LoadSampler  # noqa: E402  (benchmarks/ is the script's directory)

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = {"openvla": "configs/sft/maniskill_lang3_sft_rl_openvla.yaml",
           "openvla_oft": "configs/sft/maniskill_lang3_sft_rl_oft.yaml",
           "pi0": "configs/sft/maniskill_lang3_sft_rl_pi0.yaml",
           "pi05": "configs/sft/maniskill_lang3_sft_rl_pi05.yaml"}
#: ``--quick``'s 32 px images per family: OpenVLA / OFT's tiny arch, π0's tiny preset
QUICK_IMAGE = {"openvla": "policy.tiny.image_size=32", "openvla_oft": "policy.tiny.image_size=32",
               "pi0": "policy.preset=tiny", "pi05": "policy.preset=tiny"}
QUICK = ["demos.num_trajectories=1", "env.task_ids=[0,1]", "env.sensor_size=32", "bc.steps=30", "bc.batch_size=16", "eval.episodes=2",
         "eval.gate_episodes=1", "env.max_episode_steps=24",
         "rl.overrides=[trainer.iterations=2,trainer.eval_every=0,trainer.save_every=2,"
         "env.num_envs=4,algorithm.group_size=2,algorithm.filter_low=null,algorithm.filter_high=null]"]


ALIASES = {"oft": "openvla_oft"}


def family_of(run_dir: str | Path) -> str:
    """The family whose name (or alias) a pipeline directory's name contains, the longest
    first: pi05 before pi0, openvla_oft / oft before openvla."""
    name = Path(run_dir).name
    for key in sorted([*CONFIGS, *ALIASES], key=len, reverse=True):
        if key in name:
            return ALIASES.get(key, key)
    return "openvla"


def run_family(family: str, run_dir: Path, demos_dir: str, extra: list[str]) -> dict:
    """Run the family's ``sft-rl`` pipeline in ``run_dir``; returns :func:`summarize_run`."""
    cmd = [sys.executable, "-m", "rlinf_embodied.cli", "sft-rl", CONFIGS[family],
           f"run.dir={run_dir}", f"demos.dir={demos_dir}", *extra]
    env = {**os.environ, "OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY", "PASSIVE")}
    t0 = time.perf_counter()
    with LoadSampler() as load:
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    load_avg = round(sum(load.samples) / len(load.samples), 2) if load.samples else None
    (run_dir / "bench_log.txt").parent.mkdir(parents=True, exist_ok=True)
    (run_dir / "bench_log.txt").write_text(proc.stdout + proc.stderr)
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-8:])
        return {"error": f"sft-rl exited {proc.returncode}: {tail}", "wall_s": wall,
                "load_avg": load_avg}
    out = summarize_run(run_dir)
    out.update(wall_s=round(wall, 1), load_avg=load_avg)
    return out


def _metrics(run_dir: Path) -> list[dict]:
    p = run_dir / "rl" / "metrics.jsonl"
    if not p.is_file():
        return []
    return [json.loads(line) for line in p.read_text().splitlines() if line.strip()]


def summarize_run(run_dir: Path) -> dict:
    """The benchmark entry of a finished pipeline directory."""
    s = json.loads((Path(run_dir) / "summary.json").read_text())
    paired = s["paired"]
    tasks = {}
    for key, sft in s["sft"].get("per_task", {}).items():
        rl = s["rl"]["per_task"].get(key, {})
        tasks[sft.get("instruction") or key] = {
            "sft": round(sft["rate"], 3), "sft_ci95": sft["ci95"],
            "rl": round(rl.get("rate", float("nan")), 3), "rl_ci95": rl.get("ci95"),
            "episodes": sft["episodes"]}
    diffs = [m["train/rollout_logprob_diff_max"] for m in _metrics(Path(run_dir))
             if "train/rollout_logprob_diff_max" in m]
    return {
        "sft_success": round(s["sft"]["rate"], 3), "sft_ci95": s["sft"]["ci95"],
        "rl_success": round(s["rl"]["rate"], 3), "rl_ci95": s["rl"]["ci95"],
        "episodes": s["rl"]["episodes"],
        "mcnemar_p": paired.get("mcnemar", {}).get("p_value") if isinstance(paired.get("mcnemar"), dict)
        else paired.get("mcnemar_p", paired.get("mcnemar")),
        "per_task": tasks,
        "stages": s.get("stages", {}),
        "rollout_vs_train_logprob_max_abs_diff": max(diffs) if diffs else None,
        "updates": len(diffs),
        "gate": {k: s.get("gate", {}).get(k) for k in ("recorded", "measured", "sampled", "passed")},
        "run_dir": str(run_dir),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--family", choices=[*CONFIGS, *ALIASES, "all"], default="all",
                    help="a family (its policy.type; oft = openvla_oft), or all: every family in turn")
    ap.add_argument("--quick", action="store_true", help="tiny end-to-end smoke settings")
    ap.add_argument("--out", default=None, help="run directories go under it (default: a fresh runs/bench_vla_<time>)")
    ap.add_argument("--demos", default=None,
                    help="demos directory, shared and reused (default: data/demos; with --quick a "
                         "fresh one under --out)")
    ap.add_argument("--summarize", nargs="*", default=None, metavar="DIR",
                    help="read finished pipeline directories (family from the directory name)")
    ap.add_argument("overrides", nargs="*", help="key=value overrides of every family's pipeline")
    args = ap.parse_args()
    families: dict = {}
    if args.summarize:
        for d in args.summarize:
            if not (Path(d) / "summary.json").is_file():
                sys.exit(f"error: {d} has no summary.json (an unfinished pipeline); finish it with "
                         "`rlinf-embodied finetune <its config> run.dir=...` first.")
            families[family_of(d)] = summarize_run(Path(d))
    else:
        out = Path(args.out or ROOT / "runs" / f"bench_vla_{time.strftime('%Y%m%d_%H%M%S')}")
        # --quick records its own 1-demo, 32 px set in the output folder unless --demos is given
        demos = args.demos or (str(out / "demos") if args.quick else "data/demos")
        names = list(CONFIGS) if args.family == "all" else [ALIASES.get(args.family, args.family)]
        for name in names:
            extra = ([*QUICK, QUICK_IMAGE[name]] if args.quick else []) + list(args.overrides)
            families[name] = run_family(name, out / name, demos, extra)
            print(f"{name}: {json.dumps(families[name])}", file=sys.stderr)
    print(json.dumps({"families": families, "quick": args.quick, "cpus": os.cpu_count(),
                      "load_avg_now": round(os.getloadavg()[0], 2)}))


if __name__ == "__main__":
    main()
