"""VLA learning benchmark: does SFT -> RL make a miniature OpenVLA / OpenVLA-OFT / π0 / π0.5 better?

Per family (``--family openvla|openvla_oft|pi0|pi05|all``, families named by their ``policy.type``; ``oft`` is accepted for ``openvla_oft``; ``all``: every family) it runs the family's whole pipeline through the real
CLI (``rlinf-embodied sft-rl configs/sft/<suite>_sft_rl_<family>.yaml``, ``--suite maniskill_lang3``
(default: OpenVLA, OFT, π0, π0.5) or ``maniskill_lang3_peg`` (OpenVLA, OFT): motion-planning
demos, SFT, the step-0 gate, RL, evaluation) in a fresh run directory (demos are shared between
families and reused when present) and reads its ``summary.json`` and the RL run's
``metrics.jsonl``. Per family:

* ``sft_success`` / ``rl_success``: success over every held-out trial of the suite's protocol
  (``maniskill_lang3_v1`` / ``maniskill_lang3_peg_v1``, the same trials for both), with Wilson
  95% intervals, and per task;
* ``mcnemar_p``: McNemar's exact paired test of the two on the same trials;
* ``stages``: wall seconds and env steps of demos, SFT, SFT evaluation, gate, RL, RL evaluation
  (demos another run recorded, e.g. ``--demos DIR`` or an earlier family's: ``reused: true``,
  ``wall_s`` this run's few seconds, the recording's time in ``recorded_wall_s``);
* ``rollout_vs_train_logprob_max_abs_diff``: the largest |rollout log-prob - recomputed
  log-prob| of the first minibatch of every update (``train/rollout_logprob_diff_max``; about 0
  when rollout and training compute the same distribution);
* ``load_avg``: mean 1-minute load average during the run (other processes share the cores:
  wall times are noisy, env steps are not).

``--quick`` (``make bench``): tiny settings that check the chain end to end in a few minutes
(1 demo per task, 2 tasks, 32 px (π0 / π0.5: the 32 px ``tiny`` preset), 30 SFT steps, 2 RL
iterations, 2 trials per task); its success rates mean nothing. ``--summarize DIR ...`` reads finished pipeline directories
instead of running. Prints one JSON line last: ``{"families": {"<name>": {...}}, ...}``.

While a pipeline runs its output goes to stderr line by line, as ``[<family> +MM:SS] <line>``
(and to ``<run dir>/bench_log.txt``). Ctrl-C is forwarded to the pipeline, which stops as at a
terminal (the RL stage finishes its iteration and saves; a second Ctrl-C aborts) and shuts Ray
and its env pools down; then the JSON line is printed (the family with ``interrupted: true``)
and the script exits 130. A family whose pipeline failed has ``error`` in the JSON line, and
the script then exits 1. Bad input (a suite without the family's pipeline, an unfinished
directory to summarize) exits 2 with one ``error:`` line, as the CLI's config errors do.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import subprocess
import sys
import threading
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
         "rl.overrides=[env.max_episode_steps=24,trainer.rollout_steps=6,"
         "trainer.iterations=2,trainer.eval_every=0,trainer.save_every=2,"
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


SUITES = ("maniskill_lang3", "maniskill_lang3_peg")
"""``--suite``: the language-conditioned suites with shipped pipelines."""
SUITE = SUITES[0]
"""The suite of this run's pipelines (``--suite``)."""


def suite_configs(suite: str) -> dict[str, str]:
    """Family -> its shipped pipeline config for ``suite`` (``configs/sft/<suite>_sft_rl_*.yaml``),
    for the families that have one."""
    paths = {f: c.replace("maniskill_lang3_", f"{suite}_", 1) for f, c in CONFIGS.items()}
    return {f: p for f, p in paths.items() if (ROOT / p).is_file()}


def suite_families(suite: str) -> list[str]:
    """The families with a shipped pipeline config for ``suite``."""
    return list(suite_configs(suite))


def refuse(message: str) -> None:
    """Bad input: ``error: <message>`` on stderr, exit status 2 (as the CLI's config errors).

    Raises:
        SystemExit: always, with code 2.
    """
    print(f"error: {message}", file=sys.stderr)
    sys.exit(2)


def config_path(family: str, suite: str) -> str:
    """``family``'s shipped pipeline config for ``suite``.

    Raises:
        SystemExit: code 2, the suite has no pipeline of that family (names those it has).
    """
    have = suite_configs(suite)
    if family not in have:
        path = CONFIGS[family].replace("maniskill_lang3_", f"{suite}_", 1)
        refuse(f"suite {suite} has no {family} pipeline ({path}); its families: "
               f"{', '.join(have)}.")
    return have[family]


def pipeline_command(family: str, run_dir: Path, demos_dir: str, extra: list[str]) -> list[str]:
    """The ``rlinf-embodied sft-rl`` command line of ``family``'s pipeline for :data:`SUITE` in
    ``run_dir``."""
    return [sys.executable, "-m", "rlinf_embodied.cli", "sft-rl", config_path(family, SUITE),
            f"run.dir={run_dir}", f"demos.dir={demos_dir}", *extra]


def generation_records(demos_dir: str | Path) -> dict[str, int]:
    """Path -> modification time (ns) of every demo generation record under ``demos_dir``
    (``generation*.json``, written when a pipeline records demos); taken before and after a
    pipeline, it says whether that pipeline recorded demos or reused another run's."""
    root = Path(demos_dir)
    if not root.is_absolute():
        root = ROOT / root  # the pipeline runs in ROOT
    if not root.is_dir():
        return {}
    return {str(p): p.stat().st_mtime_ns for p in root.rglob("generation*.json")}


#: the line the pipeline logs when it reuses recorded demos (rlinf_embodied/sft/pipeline.py)
DEMOS_REUSED_LINE = "demos: using "

PIPE_GRACE_S = 10.0
"""Seconds the relay waits for the end of the pipeline's output after the pipeline exited (a
process it left behind would hold the pipe open)."""


def demos_stage(stages: dict, recorded_here: bool, reuse_s: float | None) -> dict:
    """``stages`` (the pipeline's ``summary.json`` stage costs) with its ``demos`` entry saying
    whether this run recorded the demos. The pipeline reads the suite's generation record,
    which holds the wall time of the run that recorded them; when this run reused them, that
    time moves to ``recorded_wall_s`` / ``recorded_env_steps`` and ``wall_s`` / ``env_steps``
    are what this run spent (``reuse_s``: seconds from the pipeline's start until it logged
    the reuse, process start and config checks included; None when it logged none)."""
    demos = stages.get("demos")
    if demos is None:
        return stages
    if recorded_here:
        entry = {**demos, "reused": False}
    else:
        entry = {"reused": True, "wall_s": None if reuse_s is None else round(reuse_s, 1),
                 "env_steps": 0, "recorded_wall_s": demos.get("wall_s"),
                 "recorded_env_steps": demos.get("env_steps")}
    return {**stages, "demos": entry}


def stream_pipeline(cmd: list[str], family: str, log_path: Path, env: dict | None = None,
                    echo=None) -> dict:
    """Run ``cmd`` (a pipeline) in ROOT and relay its output while it runs: each line to
    ``log_path`` and to ``echo`` (default: stderr) as ``[family +MM:SS] line``.

    The pipeline runs in its own session, so a Ctrl-C at the terminal reaches it only through
    this process: SIGINT / SIGTERM received here are forwarded to it (its CLI then stops as
    it does at a terminal: the RL stage finishes its iteration, saves, and shuts Ray and the
    env pools down; a second Ctrl-C aborts) and this function keeps relaying until it exits.
    It is never killed from here: ``subprocess.run`` SIGKILLs its child 0.25 s after a
    Ctrl-C, which left Ray's DashboardAgent / RuntimeEnvAgent running (their raylet and GCS
    die with the killed driver, while the agents wait for the dead GCS forever).

    Returns:
        ``returncode``, ``wall_s``, ``tail`` (the last 8 lines), ``interrupted`` (a signal
        was forwarded) and ``demos_reused_s`` (seconds until the pipeline logged that it
        reuses recorded demos, or None).
    """
    import signal
    from collections import deque

    echo = echo or sys.stderr
    t0 = time.perf_counter()
    tail: deque = deque(maxlen=8)
    forwarded: list[int] = []
    reused_s = None
    log_path.parent.mkdir(parents=True, exist_ok=True)
    procs: list[subprocess.Popen] = []

    def forward(signum, _frame) -> None:
        forwarded.append(signum)
        if procs and procs[0].poll() is None:
            procs[0].send_signal(signum)

    signals = (signal.SIGINT, signal.SIGTERM)
    main_thread = threading.current_thread() is threading.main_thread()
    previous = {s: signal.signal(s, forward) for s in signals} if main_thread else {}
    try:
        procs.append(subprocess.Popen(cmd, cwd=ROOT, env=env, stdin=subprocess.DEVNULL,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      text=True, errors="replace", start_new_session=True))
        proc = procs[0]
        if forwarded:  # a Ctrl-C before it started
            proc.send_signal(forwarded[-1])
        lines: queue.Queue = queue.Queue()

        def read() -> None:  # in a thread, so that the wait below can give up (PIPE_GRACE_S)
            for text in proc.stdout:
                lines.put(text)
            lines.put(None)

        threading.Thread(target=read, daemon=True).start()
        try:
            with open(log_path, "w") as log:
                exited_at = None
                while True:
                    try:
                        line = lines.get(timeout=1.0)
                    except queue.Empty:  # a process it left may hold the pipe open: not forever
                        if exited_at is None and proc.poll() is not None:
                            exited_at = time.monotonic()
                        if exited_at is not None and time.monotonic() - exited_at > PIPE_GRACE_S:
                            break
                        continue
                    if line is None:
                        break
                    now = time.perf_counter() - t0
                    if reused_s is None and line.startswith(DEMOS_REUSED_LINE):
                        reused_s = now
                    log.write(line)
                    log.flush()
                    echo.write(f"[{family} +{int(now) // 60:02d}:{int(now) % 60:02d}] {line}")
                    echo.flush()
                    tail.append(line.rstrip("\n"))
        except BaseException:  # relaying failed: the pipeline stops as after a Ctrl-C, and ends
            if proc.poll() is None and not forwarded:
                proc.send_signal(signal.SIGTERM)
            proc.wait()
            raise
        proc.wait()
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
    return {"returncode": proc.returncode, "wall_s": time.perf_counter() - t0, "tail": list(tail),
            "interrupted": bool(forwarded), "demos_reused_s": reused_s}


def run_family(family: str, run_dir: Path, demos_dir: str, extra: list[str]) -> dict:
    """Run the family's ``sft-rl`` pipeline in ``run_dir``, its output relayed to stderr as it
    comes (:func:`stream_pipeline`); returns :func:`summarize_run` with ``stages.demos`` saying
    whether this run recorded the demos (:func:`demos_stage`), or ``error`` (and
    ``interrupted`` after a Ctrl-C)."""
    # lines as they come, not a pipe buffer at a time; OpenMP as the CLI sets it (sft/cli.py)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    before = generation_records(demos_dir)
    with LoadSampler() as load:
        res = stream_pipeline(pipeline_command(family, run_dir, demos_dir, extra), family,
                              run_dir / "bench_log.txt", env)
    wall = res["wall_s"]
    load_avg = round(sum(load.samples) / len(load.samples), 2) if load.samples else None
    if res["returncode"] != 0 or res["interrupted"]:
        tail = "\n".join(res["tail"])
        return {"error": f"sft-rl exited {res['returncode']}: {tail}", "wall_s": round(wall, 1),
                "load_avg": load_avg, "interrupted": res["interrupted"], "run_dir": str(run_dir)}
    out = summarize_run(run_dir)
    recorded_here = generation_records(demos_dir).items() - before.items()
    out["stages"] = demos_stage(out["stages"], bool(recorded_here), res["demos_reused_s"])
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
    ap.add_argument("--suite", choices=SUITES, default=SUITES[0],
                    help="the suite whose pipelines run (maniskill_lang3_peg: openvla, openvla_oft)")
    ap.add_argument("--quick", action="store_true", help="tiny end-to-end smoke settings")
    ap.add_argument("--out", default=None, help="run directories go under it (default: a fresh runs/bench_vla_<time>)")
    ap.add_argument("--demos", default=None,
                    help="demos directory, shared and reused (default: data/demos; with --quick a "
                         "fresh one under --out)")
    ap.add_argument("--summarize", nargs="*", default=None, metavar="DIR",
                    help="read finished pipeline directories (family from the directory name)")
    ap.add_argument("overrides", nargs="*", help="key=value overrides of every family's pipeline")
    args = ap.parse_args()
    global SUITE
    SUITE = args.suite
    families: dict = {}
    interrupted = False
    if args.summarize:
        for d in args.summarize:
            if not Path(d).is_dir():
                refuse(f"{d} does not exist; pass the run.dir of an `rlinf-embodied sft-rl` pipeline.")
            if not (Path(d) / "sft").is_dir():
                refuse(f"{d} is not an SFT -> RL pipeline's run directory (no sft/); pass the "
                       "run.dir of an `rlinf-embodied sft-rl` pipeline.")
            if not (Path(d) / "summary.json").is_file():
                refuse(f"{d} has no summary.json (an unfinished pipeline); finish it with "
                       "`rlinf-embodied finetune <its config> run.dir=...` first.")
            families[family_of(d)] = summarize_run(Path(d))
    else:
        out = Path(args.out or ROOT / "runs" / f"bench_vla_{time.strftime('%Y%m%d_%H%M%S')}")
        # --quick records its own 1-demo, 32 px set in the output folder unless --demos is given
        demos = args.demos or (str(out / "demos") if args.quick else "data/demos")
        names = list(CONFIGS) if args.family == "all" else [ALIASES.get(args.family, args.family)]
        if args.family == "all":  # every family the suite has a pipeline of
            names = suite_families(SUITE)
        for name in names:
            config_path(name, SUITE)  # a family without a pipeline here fails before any runs
        for name in names:
            extra = ([*QUICK, QUICK_IMAGE[name]] if args.quick else []) + list(args.overrides)
            families[name] = run_family(name, out / name, demos, extra)
            print(f"{name}: {json.dumps(families[name])}", file=sys.stderr)
            if families[name].get("interrupted"):
                interrupted = True  # Ctrl-C: the pipeline stopped (and said what it saved)
                break
    print(json.dumps({"families": families, "quick": args.quick, "cpus": os.cpu_count(),
                      "load_avg_now": round(os.getloadavg()[0], 2)}))
    if interrupted:
        sys.exit(130)
    failed = [name for name, fam in families.items() if "error" in fam]
    if failed:  # the JSON line says why; the exit status tells scripts and CI
        sys.exit(1)


if __name__ == "__main__":
    main()
