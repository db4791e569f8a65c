"""The SFT -> RL pipeline, one function per stage (one CLI command each) and the chain.

Layout of ``<run dir>`` (``run.dir`` or ``runs/<run.name>``):

* ``demos``: ``<demos.dir>/<env_id>/motionplanning/trajectories.*.h5`` (shared between runs);
* ``sft/``: ``policy/`` (the behaviour-cloned checkpoint), ``bc_metrics.json``,
  ``eval.json`` (+ reports; held-out trials 0..eval.episodes-1) and ``sft_record.json``;
* ``rl/``: a normal training run directory started from ``sft/policy`` (its ``gate.json`` is
  the step-0 gate), and ``rl/final_eval.json`` on the same held-out trials;
* ``summary.json``: SFT vs RL success with Wilson intervals and McNemar's paired test.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from rlinf_embodied.checkpoint import atomic_write_json
from rlinf_embodied.sft.config import SFTJobConfig

__all__ = ["load_sft_config", "run_demos", "run_rl", "run_sft", "run_sft_rl", "validate_rl_stage"]


def load_sft_config(path: str, overrides: list[str] | None = None) -> SFTJobConfig:
    """Parse an SFT pipeline YAML (strict, like every job file).

    Raises:
        rlinf_embodied.config.ConfigError: invalid file or override.
    """
    from rlinf_embodied.config import load_config

    return load_config(path, overrides or [], schema=SFTJobConfig)


def run_demos(cfg: SFTJobConfig, log=print, force: bool = False) -> Path:
    """Stage 1: motion-planning demonstrations in the policy's controller (skipped when the
    converted file exists and holds at least ``demos.num_trajectories`` episodes, unless
    ``force``). Returns the trajectory file."""
    from rlinf_embodied.sft.demos import find_demos, generate_demos

    e = cfg.env
    found = find_demos(cfg.demos.dir, e.env_id, e.control_mode, e.obs_mode)
    if found is not None and not force:
        meta = json.loads(found.with_suffix(".json").read_text())
        if len(meta["episodes"]) >= cfg.demos.num_trajectories:
            log(f"demos: using {found} ({len(meta['episodes'])} episodes)")
            return found
    demo = generate_demos(e.env_id, cfg.demos.dir, cfg.demos.num_trajectories,
                          control_mode=e.control_mode, obs_mode=e.obs_mode,
                          reward_mode=e.reward_mode, seed=cfg.demos.seed,
                          max_attempts=cfg.demos.num_trajectories * cfg.demos.max_attempts_factor,
                          log=log)
    atomic_write_json(demo.path.parent / "generation.json", demo.to_dict())
    return demo.path


def run_sft(cfg: SFTJobConfig, log=print) -> dict[str, Any]:
    """Stage 2: behaviour-clone ``cfg.policy`` on the demos, save, evaluate, record.

    Returns:
        ``{"checkpoint", "bc": metrics, "evaluation": {...rate, ci95...}}``.
    """
    import torch

    from rlinf_embodied.policies import build_policy, save_policy
    from rlinf_embodied.sft.bc import space_spec_of, train_bc
    from rlinf_embodied.sft.dataset import DemoDataset
    from rlinf_embodied.sft.demos import find_demos
    from rlinf_embodied.sft.gate import evaluate_checkpoint, write_record

    e = cfg.env
    path = find_demos(cfg.demos.dir, e.env_id, e.control_mode, e.obs_mode)
    if path is None:
        raise FileNotFoundError(
            f"No {e.env_id} demos in {e.control_mode}/{e.obs_mode} under {cfg.demos.dir}; run "
            "`rlinf-embodied demos CONFIG.yaml` first."
        )
    data = DemoDataset(path, max_trajectories=cfg.demos.num_trajectories)
    log(f"sft: {data.num_trajectories} demos, {len(data)} transitions from {path}")
    spec = space_spec_of(e)
    torch.manual_seed(cfg.bc.seed)
    policy = build_policy(dataclasses.replace(cfg.policy, checkpoint=None), spec)
    metrics = train_bc(policy, data, cfg.bc, log=log)
    sft_dir = cfg.run_dir() / "sft"
    ckpt = save_policy(policy, sft_dir / "policy")
    atomic_write_json(sft_dir / "bc_metrics.json", metrics)
    log(f"sft: saved {ckpt}; evaluating on {cfg.eval.episodes} held-out trials")
    ev = evaluate_checkpoint(ckpt, e, sft_dir / "eval.json", cfg.eval.episodes,
                             protocol=cfg.eval.protocol, num_envs=cfg.eval.num_envs,
                             num_processes=cfg.eval.num_processes)
    write_record(sft_dir, ev, e, cfg.eval, extra={"demos": str(path),
                                                   "num_demos": data.num_trajectories})
    log(f"sft: success_once {ev['rate']:.3f} (95% CI {ev['ci95'][0]:.3f}-{ev['ci95'][1]:.3f}), "
        f"success_at_end {ev['success_at_end_rate']:.3f}")
    return {"checkpoint": str(ckpt), "bc": metrics, "evaluation": ev}


def rl_job_config(cfg: SFTJobConfig, extra: list[str] | None = None):
    """The RL stage's JobConfig: ``rl.config`` + ``rl.overrides`` + the SFT checkpoint, the
    pipeline's env settings and ``run.dir = <run dir>/rl``."""
    from rlinf_embodied.config import load_config

    e = cfg.env
    sft_ckpt = cfg.run_dir() / "sft" / "policy"
    forced = [f"policy.checkpoint={sft_ckpt}", f"run.dir={cfg.run_dir() / 'rl'}",
              f"env.env_id={e.env_id}", f"env.control_mode={e.control_mode}",
              f"env.obs_mode={e.obs_mode}", f"env.reward_mode={e.reward_mode}"]
    if e.max_episode_steps is not None:
        forced.append(f"env.max_episode_steps={e.max_episode_steps}")
    return load_config(cfg.rl.config, [*forced, *cfg.rl.overrides, *(extra or [])])


def validate_rl_stage(cfg: SFTJobConfig, extra: list[str] | None = None):
    """The RL stage's JobConfig (:func:`rl_job_config`) after the checks ``train`` runs
    (``rlinf_embodied.runners.setup.validate_job``): ``finetune`` / ``sft-rl`` / ``config show``
    call it before any stage runs, so that a bad ``rl.config`` / ``rl.overrides`` fails in one line.

    Raises:
        rlinf_embodied.config.ConfigError: the RL stage's job is invalid.
    """
    from rlinf_embodied.runners.setup import validate_job

    job = rl_job_config(cfg, extra)
    validate_job(job)
    return job


def run_rl(cfg: SFTJobConfig, log=print, extra_overrides: list[str] | None = None) -> dict[str, Any]:
    """Stage 3: the step-0 gate, RL fine-tuning from the SFT checkpoint, and the final
    held-out evaluation on the SFT evaluation's trials.

    Raises:
        rlinf_embodied.sft.gate.GateError: the gate refused the SFT checkpoint.
    """
    from rlinf_embodied.runners.embodied import EmbodiedRunner
    from rlinf_embodied.sft.gate import check_gate, evaluate_checkpoint

    job = validate_rl_stage(cfg, extra_overrides)
    rl_dir = Path(job.run.run_dir())
    gate = check_gate(job.policy.checkpoint, job.env, rl_dir, episodes=cfg.eval.gate_episodes,
                      tolerance=cfg.eval.gate_tolerance, log=log)
    state = EmbodiedRunner(job, rl_dir).run()
    best = rl_dir / "checkpoints" / "best"
    ckpt = best if best.is_dir() else rl_dir
    log(f"rl: {state['iteration']} iterations, {state['env_steps']:,} env steps; evaluating "
        f"{ckpt} on the SFT evaluation's {cfg.eval.episodes} held-out trials")
    ev = evaluate_checkpoint(ckpt, cfg.env, rl_dir / "final_eval.json", cfg.eval.episodes,
                             protocol=cfg.eval.protocol, num_envs=cfg.eval.num_envs,
                             num_processes=cfg.eval.num_processes)
    log(f"rl: success_once {ev['rate']:.3f} (95% CI {ev['ci95'][0]:.3f}-{ev['ci95'][1]:.3f}), "
        f"success_at_end {ev['success_at_end_rate']:.3f}")
    return {"gate": gate, "state": state, "checkpoint": str(ckpt), "evaluation": ev}


def summarize(cfg: SFTJobConfig) -> dict[str, Any]:
    """``summary.json``: SFT and RL results on the same trials, Wilson intervals, McNemar, and
    the step-0 gate's result (greedy and sampled success of the SFT checkpoint)."""
    from rlinf_embodied.eval.report import compare

    run = cfg.run_dir()
    sft_eval, rl_eval = run / "sft" / "eval.json", run / "rl" / "final_eval.json"
    c = compare(sft_eval, rl_eval).to_dict()
    rec = json.loads((run / "sft" / "sft_record.json").read_text())
    from rlinf_embodied.eval.results import ResultsFile

    rl = ResultsFile.load(rl_eval).summary()["overall"]
    out = {"env_id": cfg.env.env_id, "sft": rec["evaluation"],
           "rl": {"rate": rl["rate"], "ci95": rl["ci95"],
                  "success_at_end_rate": rl.get("success_at_end_rate"),
                  "success_at_end_ci95": rl.get("success_at_end_ci95"),
                  "episodes": rl["episodes"]},
           "paired": c["overall"]}
    gate = run / "rl" / "gate.json"
    if gate.is_file():  # the step-0 gate: greedy and sampled success of the SFT checkpoint
        out["gate"] = json.loads(gate.read_text())
    atomic_write_json(run / "summary.json", out)
    return out


def run_sft_rl(cfg: SFTJobConfig, log=print) -> dict[str, Any]:
    """Every stage in order: demos (reused when present), SFT, gate + RL, summary."""
    run_demos(cfg, log=log)
    run_sft(cfg, log=log)
    run_rl(cfg, log=log)
    return summarize(cfg)
