"""Reasoning workflow speeds: HF vs vLLM generation, placement plans, elastic pipelining.

Runs in the vLLM venv (``.venv-vllm``; started from another interpreter it re-executes itself
there when that venv exists). All numbers use the tiny Qwen2 of
``rlinf_embodied.llm.tiny_model`` on CPU, so they compare code paths, not model speeds.
Prints one JSON line last:

    hf_tokens_per_s, vllm_tokens_per_s, vllm_vs_hf     generated tokens/s at the same batch
                                                       (B prompts x up to T new tokens, same
                                                       sampling settings, same thread count)
    generation: {hf: {...}, vllm: {...}}               breakdown: start-up, generate seconds,
                                                       generated tokens, finish reasons
    runner.temporal_step_s, runner.spatial_step_s      median GRPO step time (first step left
                                                       out) of the tiny job under collocated
                                                       (1 device, context switching) and
                                                       disaggregated (3 devices) placement: the
                                                       same 3 worker processes on the same cores
    runner.pipelining_gain                             spatial step time without / with elastic
                                                       pipelining, same everything else; every
                                                       run forces long-tailed response lengths
                                                       (rollout.long_tail_alpha: Pareto, most
                                                       responses a few tokens, a few at the
                                                       limit; runs.*.response_length_mean)
    runner.scheduler                                   the scheduler's predicted step time of the
                                                       temporal (collocated) and spatial
                                                       (disaggregated) placement from the profile
                                                       placement=auto measures, against the
                                                       measured ones; the plan it picks on 3
                                                       devices vs the one that measured faster
                                                       (without --quick the picked plan also
                                                       runs: measured_step_s.auto_3dev)
    loadavg                                            /proc/loadavg before and after

Usage: python benchmarks/bench_reasoning.py [--quick] [--runner-backend vllm|hf] [--skip-runner]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VENV_PY = ROOT / ".venv-vllm" / "bin" / "python"


def _reexec_in_vllm_venv() -> None:
    try:
        import vllm  # noqa: F401
    except ImportError:
        # venv pythons are links to one interpreter: compare the venvs, not the executables
        if VENV_PY.exists() and Path(sys.prefix).resolve() != VENV_PY.parents[1].resolve():
            os.execv(str(VENV_PY), [str(VENV_PY), __file__, *sys.argv[1:]])
        raise SystemExit("bench_reasoning needs vLLM: run `bash scripts/setup.sh` (builds "
                         ".venv-vllm) and `.venv-vllm/bin/python benchmarks/bench_reasoning.py`.")


def _loadavg() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "n/a"


def _prompts(tok, n: int):
    from rlinf_embodied.llm.tasks import arithmetic_problems

    probs = arithmetic_problems("test", n, seed=0)
    return [tok.encode(f"{p.question}=") for p in probs]


def bench_generation(model_dir: str, batch: int, new_tokens: int) -> dict:
    """Same prompts, sampling settings and thread count through both backends."""
    from transformers import AutoTokenizer

    from rlinf_embodied.llm.backends import make_backend
    from rlinf_embodied.reasoning.config import ReasoningRolloutConfig

    tok = AutoTokenizer.from_pretrained(model_dir)
    prompts = _prompts(tok, batch)
    kw = {"max_new_tokens": new_tokens, "temperature": 1.0, "top_p": 1.0, "seed": 0}
    out = {"batch": batch, "max_new_tokens": new_tokens}
    for name in ("hf", "vllm"):
        cfg = ReasoningRolloutConfig(backend=name, max_batch_size=batch,
                                     max_new_tokens=new_tokens, max_model_len=256,
                                     gpu_memory_utilization=0.05)
        t0 = time.perf_counter()
        be = make_backend(name, model_dir, cfg)
        start_s = time.perf_counter() - t0
        be.generate(prompts[:2], **{**kw, "max_new_tokens": 2})  # warm-up
        t0 = time.perf_counter()
        gens = be.generate(prompts, **kw)
        gen_s = time.perf_counter() - t0
        ntok = sum(len(g.response_ids) for g in gens)
        out[name] = {"start_s": round(start_s, 2), "generate_s": round(gen_s, 3),
                     "generated_tokens": ntok, "tokens_per_s": round(ntok / gen_s, 1),
                     "stopped": sum(g.finish_reason == "stop" for g in gens)}
        be.close()
    return out


# A small GRPO job on the shipped tiny config with forced long-tailed response lengths
# (Pareto alpha 1: half the responses are 1 token, the median 2, one in 48 runs to the limit) and a
# reference model, whose log-probs the actor computes per arriving micro-batch.
RUNNER_BASE = ["trainer.sft_steps=0", "trainer.eval_every=0", "trainer.max_time_s=null",
               "trainer.save_every=0", "trainer.num_minibatches=1", "trainer.micro_batch_size=16",
               "task.num_train=100", "task.num_test=8", "rollout.max_new_tokens=48",
               "rollout.long_tail_alpha=1.0", "algorithm.kl_coef=0.01",
               "rollout.micro_batch_size=4", "algorithm.group_size=4",
               "algorithm.dynamic_sampling=false", "algorithm.overlong_filter=false",
               "logging.console=false", "rollout.gpu_memory_utilization=0.05",
               "rollout.max_model_len=128"]
RUNNER_RUNS = {  # name -> overrides; temporal and spatial use the same 3 worker processes
    "temporal": ["placement=collocated", "cluster.num_cpu_devices=1", "rollout.pipelining=false"],
    "spatial": ["placement=disaggregated", "cluster.num_cpu_devices=3", "rollout.pipelining=false"],
    "spatial_pipelined": ["placement=disaggregated", "cluster.num_cpu_devices=3",
                          "rollout.pipelining=true"],
    # placement=auto: the scheduler profiles the three groups, plans, and the run uses its plan
    "auto": ["cluster.num_cpu_devices=3", "rollout.pipelining=true"],
}


def _init_ray(attempts: int = 3) -> None:
    """One local Ray session for every run (never a cluster someone else started on this
    machine); retried because Ray gives a raylet 30 s to register, which a loaded machine
    can miss."""
    import ray

    for i in range(attempts):
        try:
            ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False)
            return
        except Exception:  # noqa: BLE001 - "node timed out during startup" on a busy machine
            ray.shutdown()
            if i == attempts - 1:
                raise


def _median(xs):
    xs = sorted(xs)
    return xs[len(xs) // 2] if xs else float("nan")


def bench_runner(work: Path, quick: bool, backend: str) -> dict:
    """Step times of the reasoning runner under temporal / spatial placement, with and without
    elastic pipelining, and the scheduler's predictions for them from a profile measured by
    ``placement: auto`` (the first step of each run is left out: it includes warm-up)."""
    from rlinf_embodied.config import load_config
    from rlinf_embodied.reasoning.config import ReasoningJobConfig
    from rlinf_embodied.reasoning.runner import ReasoningRunner
    from rlinf_embodied.runners.setup import resolve_placement
    from rlinf_embodied.runtime import PlacementPlan
    from rlinf_embodied.scheduler.cost_model import CostModel
    from rlinf_embodied.reasoning.schedule import (plan_reasoning_config,
                                                    reasoning_plan_for_placement,
                                                    reasoning_profile_for_config)

    iters, prompts = (3, 4) if quick else (4, 4)
    _init_ray()
    common = RUNNER_BASE + [f"trainer.iterations={iters}", f"rollout.prompts_per_step={prompts}",
                            f"rollout.backend={backend}"]
    runs = {k: v for k, v in RUNNER_RUNS.items() if not (quick and k == "auto")}
    out: dict = {"backend": backend, "iterations": iters,
                 "responses_per_step": prompts * 4, "runs": {}}
    cfgs = {}
    t0 = time.perf_counter()
    try:  # what placement=auto does: profile the three groups, plan (3 devices)
        auto_yaml = _auto_placement(common + RUNNER_RUNS["auto"], work / "auto")
        out["profile_s"] = round(time.perf_counter() - t0, 1)
    except Exception as e:  # noqa: BLE001 - report the runs all the same
        auto_yaml, out["profile_error"] = None, f"{type(e).__name__}: {e}"[:300]
    for name, extra in runs.items():
        t0 = time.perf_counter()
        try:
            if name == "auto":
                if auto_yaml is None:
                    raise RuntimeError("profiling failed (see profile_error)")
                extra = extra + [f"placement={auto_yaml}"]
            cfg = load_config(ROOT / "configs" / "reasoning_grpo_tiny.yaml", common + extra,
                              schema=ReasoningJobConfig)
            cfgs[name] = cfg
            res = ReasoningRunner(cfg, work / name).run()
        except Exception as e:  # noqa: BLE001 - report the other runs' numbers all the same
            out["runs"][name] = {"error": f"{type(e).__name__}: {e}"[:300]}
            continue
        steps = res["steps"][1:] or res["steps"]
        out["runs"][name] = {
            "step_s": round(_median([s["time/step_s"] for s in steps]), 3),
            "generate_s": round(_median([s["time/generate_s"] for s in steps]), 3),
            "response_length_mean": round(_median([s["rollout/response_length"] for s in steps]), 2),
            "truncated_fraction": round(_median([s["rollout/truncated"] for s in steps]), 3),
            "wall_s": round(time.perf_counter() - t0, 1), "backend": res["backend"]}
    r = {k: v for k, v in out["runs"].items() if "step_s" in v}
    out["temporal_step_s"] = r.get("temporal", {}).get("step_s")
    out["spatial_step_s"] = r.get("spatial", {}).get("step_s")
    if "spatial" in r and "spatial_pipelined" in r:
        out["pipelining_gain"] = round(r["spatial"]["step_s"] / r["spatial_pipelined"]["step_s"], 3)
    if auto_yaml is not None and {"temporal", "spatial"} <= set(r):
        # the profile placement=auto measured (cached in its run directory), as the scheduler
        # uses it: predictions of the exact plans the two runs executed, and auto's pick
        auto_cfg = load_config(ROOT / "configs" / "reasoning_grpo_tiny.yaml",
                               common + RUNNER_RUNS["auto"], schema=ReasoningJobConfig)
        profile = reasoning_profile_for_config(auto_cfg, work / "auto")  # its cache key
        cost = CostModel(profile)
        pred = {}
        for name, devices in (("temporal", 1), ("spatial", 3)):
            c = cfgs[name]
            placement = PlacementPlan.from_yaml(resolve_placement(c.placement))
            pred[name] = round(cost.iteration_time(
                reasoning_plan_for_placement(c, placement, devices)), 3)
        best = plan_reasoning_config(cfgs["spatial"], 3, profile).best
        measured = {"temporal": r["temporal"]["step_s"], "spatial": r["spatial"]["step_s"]}
        out["scheduler"] = {
            "profile": profile.source,
            "predicted_step_s": {"temporal_1dev": pred["temporal"], "spatial_3dev": pred["spatial"]},
            "measured_step_s": {"temporal_1dev": measured["temporal"],
                                "spatial_3dev": measured["spatial"]},
            "predicted_faster": min(pred, key=pred.get),
            "measured_faster": min(measured, key=measured.get),
            "auto_picks_3dev": {"mode": best.mode, "predicted_step_s": round(best.time_s, 3)}}
        if "auto" in r:
            out["scheduler"]["measured_step_s"]["auto_3dev"] = r["auto"]["step_s"]
    else:
        out["scheduler"] = "not measured: profiling or a run failed (see profile_error, runs)"
    return out


def _auto_placement(overrides: list, run_dir: Path) -> Path:
    """What ``placement: auto`` does, called directly: profile rollout / reward / actor on
    device 0, plan, and write the chosen placement to a YAML file (its path is returned)."""
    import yaml

    from rlinf_embodied.config import load_config
    from rlinf_embodied.reasoning.config import ReasoningJobConfig
    from rlinf_embodied.reasoning.launch import launch_reasoning_groups
    from rlinf_embodied.reasoning.schedule import auto_plan_reasoning
    from rlinf_embodied.runtime import Cluster

    cfg = load_config(ROOT / "configs" / "reasoning_grpo_tiny.yaml", overrides,
                      schema=ReasoningJobConfig)
    cluster = Cluster(cfg.cluster.address, num_cpus=cfg.cluster.num_cpus,
                      num_cpu_devices=cfg.cluster.num_cpu_devices)
    run_dir.mkdir(parents=True, exist_ok=True)
    try:
        placement = auto_plan_reasoning(cfg, cluster, run_dir, "bench-auto",
                                        launch_reasoning_groups)
    finally:
        cluster.shutdown()  # a no-op here: _init_ray's session stays for the runs
    path = run_dir.parent / "auto_placement.yaml"
    path.write_text(yaml.safe_dump({"placement": placement}))
    return path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="smaller batch and fewer tokens")
    ap.add_argument("--runner-backend", default="vllm", choices=("vllm", "hf"),
                    help="rollout backend of the placement / pipelining runs")
    ap.add_argument("--skip-runner", action="store_true", help="generation speeds only")
    args = ap.parse_args()
    # The same intra-op thread count for both backends (vLLM lowers torch's to 1 unless
    # OMP_NUM_THREADS is set).
    os.environ.setdefault("OMP_NUM_THREADS", str(os.cpu_count() or 1))
    _reexec_in_vllm_venv()
    from rlinf_embodied.llm.tiny_model import build_tiny_model

    load0 = _loadavg()
    batch, new_tokens = (16, 32) if args.quick else (64, 64)
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = str(build_tiny_model(Path(tmp) / "tiny", seed=0))
        gen = bench_generation(model_dir, batch, new_tokens)
        result = {
            "hf_tokens_per_s": gen["hf"]["tokens_per_s"],
            "vllm_tokens_per_s": gen["vllm"]["tokens_per_s"],
            "vllm_vs_hf": round(gen["vllm"]["tokens_per_s"] / gen["hf"]["tokens_per_s"], 2),
            "generation": gen,
        }
        if args.skip_runner:
            result["runner"] = "skipped (--skip-runner)"
        else:
            result["runner"] = bench_runner(Path(tmp) / "runs", args.quick, args.runner_backend)
    result["loadavg"] = {"before": load0, "after": _loadavg()}
    result["omp_num_threads"] = int(os.environ["OMP_NUM_THREADS"])
    print(json.dumps(result))


if __name__ == "__main__":
    main()
