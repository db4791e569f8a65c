"""``summary.json`` of the SFT -> RL pipeline: SFT and RL success on the same held-out trials
(Wilson intervals, McNemar's paired test), the step-0 gate's result and each stage's cost."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rlinf_embodied.checkpoint import atomic_write_json
from rlinf_embodied.sft.config import SFTJobConfig

__all__ = ["stage_costs", "summarize"]


def summarize(cfg: SFTJobConfig) -> dict[str, Any]:
    """``summary.json``: SFT and RL results on the same trials, Wilson intervals, McNemar, and
    the step-0 gate's result (greedy and sampled success of the SFT checkpoint)."""
    from rlinf_embodied.eval.report import compare

    run = cfg.run_dir()
    sft_eval, rl_eval = run / "sft" / "eval.json", run / "rl" / "final_eval.json"
    c = compare(sft_eval, rl_eval).to_dict()
    rec = json.loads((run / "sft" / "sft_record.json").read_text())
    from rlinf_embodied.eval.results import ResultsFile

    rl_summary = ResultsFile.load(rl_eval).summary()
    rl = rl_summary["overall"]
    suite = getattr(cfg.env, "suite", None)
    out = {"env_id": cfg.env.env_id if suite is None else None, "suite": suite,
           "sft": rec["evaluation"],
           "rl": {"rate": rl["rate"], "ci95": rl["ci95"],
                  "success_at_end_rate": rl.get("success_at_end_rate"),
                  "success_at_end_ci95": rl.get("success_at_end_ci95"),
                  "episodes": rl["episodes"],
                  "per_task": {k: {"rate": v["rate"], "ci95": v["ci95"], "episodes": v["episodes"],
                                   "instruction": v.get("instruction")}
                               for k, v in rl_summary["per_task"].items()}},
           "paired": c["overall"], "paired_per_task": c["per_task"]}
    gate = run / "rl" / "gate.json"
    if gate.is_file():  # the step-0 gate: greedy and sampled success of the SFT checkpoint
        out["gate"] = json.loads(gate.read_text())
    out["stages"] = stage_costs(cfg)
    atomic_write_json(run / "summary.json", out)
    return out


def stage_costs(cfg: SFTJobConfig) -> dict[str, Any]:
    """Wall seconds and env steps of each stage that left its record: ``demos`` (the generation
    record of a suite's demos: the time of the run that recorded them, another run's when this
    pipeline reused them), ``sft`` (training), ``sft_eval``, ``gate``, ``rl``, ``rl_eval``.
    Evaluation env steps are summed from the results files."""
    from rlinf_embodied.eval.results import ResultsFile

    run = cfg.run_dir()
    out: dict[str, Any] = {}

    def read(p: Path) -> dict | None:
        return json.loads(p.read_text()) if p.is_file() else None

    def eval_steps(p: Path) -> int:
        return sum(int(e.steps) for e in ResultsFile.load(p).episodes) if p.is_file() else 0

    e = cfg.env
    if getattr(e, "suite", None) is not None:
        from rlinf_embodied.sft.vla_demos import suite_generation_record

        gen = read(suite_generation_record(cfg.demos.dir, e.suite, e.control_mode,
                                           e.sensor_size, cfg.demos.stride))
        if gen:
            out["demos"] = {"wall_s": gen["wall_s"], "env_steps": gen["env_steps"]}
    bc = read(run / "sft" / "bc_metrics.json")
    if bc:
        out["sft"] = {"wall_s": bc.get("bc/seconds"), "env_steps": 0}
    rec = read(run / "sft" / "sft_record.json")
    if rec:
        out["sft_eval"] = {"wall_s": rec["evaluation"].get("wall_s"),
                           "env_steps": eval_steps(run / "sft" / "eval.json")}
    gate = read(run / "rl" / "gate.json")
    if gate:
        out["gate"] = {"wall_s": gate.get("wall_s"),
                       "env_steps": eval_steps(run / "rl" / "gate_eval.json")
                       + eval_steps(run / "rl" / "gate_sampled.json")}
    state = read(run / "rl" / "rl_state.json")
    if state:
        out["rl"] = {"wall_s": state.get("wall_s_total", state.get("wall_s")),  # all parts
                     "env_steps": state.get("env_steps"),
                     "iterations": state.get("iteration")}
    final = read(run / "rl" / "final_eval_summary.json")
    if final:
        out["rl_eval"] = {"wall_s": final.get("wall_s"),
                          "env_steps": eval_steps(run / "rl" / "final_eval.json")}
    return out
