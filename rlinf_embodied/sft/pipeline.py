"""The SFT -> RL pipeline, one function per stage (one CLI command each) and the chain.

Layout of ``<run dir>`` (``run.dir`` or ``runs/<run.name>``):

* ``demos``: ``<demos.dir>/<env_id>/motionplanning/trajectories.*.h5`` (shared between runs;
  a suite's RGB demos: ``<demos.dir>/<suite>/<env_id>/trajectories.rgb.*.h5``,
  :mod:`rlinf_embodied.sft.vla_demos`);
* ``sft/``: ``policy/`` (the behaviour-cloned checkpoint), ``bc_metrics.json``,
  ``eval.json`` (+ reports; held-out trials 0..eval.episodes-1) and ``sft_record.json``; a VLA
  also gets ``vla/``, the checkpoint in the published layout (OpenVLA / OFT's; LeRobot's for
  π0 / π0.5) with the demos' statistics (the RL stage starts from it through ``policy.pretrained``);
* ``rl/``: a normal training run directory started from ``sft/policy`` (its ``gate.json`` is
  the step-0 gate), and ``rl/final_eval.json`` on the same held-out trials;
* ``summary.json``: SFT vs RL success with Wilson intervals and McNemar's paired test
  (:mod:`rlinf_embodied.sft.summary`).

An RL stage stopped by Ctrl-C goes on with ``finetune CONFIG [key=value ...] --resume``
(:func:`run_rl` with ``resume``): the RL run continues from its newest complete checkpoint to
the configured iterations, then the final evaluation and ``summary.json`` are written as after
an uninterrupted run.
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import Any

from rlinf_embodied.checkpoint import atomic_write_json
from rlinf_embodied.sft.config import VLA_TYPES, SFTJobConfig
from rlinf_embodied.sft.config import override_value as _yaml
from rlinf_embodied.sft.summary import stage_costs, summarize

__all__ = ["check_rl_dir", "check_sft_evaluation", "load_sft_config", "resume_checkpoint",
           "run_demos", "run_rl", "run_sft", "run_sft_rl", "stage_costs", "summarize",
           "validate_rl_stage", "VLA_TYPES"]

#: Policy fields that decide how a VLA acts: the RL stage must use the SFT stage's values
#: (a family's config lacks the others' fields: both read None). π0 / π0.5: horizon, Euler
#: steps, greedy noise and prompt length; noise_method / noise_level only shape RL's sampling.
_VLA_BEHAVIOUR = ("type", "action_chunk", "action_head", "use_proprio", "use_wrist_image",
                  "proprio_dim", "attention", "temperature", "image_preprocessing", "center_crop",
                  "gripper_to_signed", "gripper_binarize", "gripper_invert", "max_prompt_tokens",
                  "logprob_granularity", "action_horizon", "num_steps", "greedy_noise", "greedy_noise_seed",
                  "max_token_len")


#: Env fields no pipeline stage reads from the pipeline's ``env`` section (the demos, the SFT
#: evaluation and the gate run fixed-length protocol episodes with ``demos.processes`` /
#: ``eval.num_envs`` / ``eval.num_processes``; the RL stage takes these from ``rl.config``):
#: an override of one would be silently ignored.
_UNREAD_ENV = ("num_envs", "num_processes", "seed", "ignore_terminations",
               "ignore_terminations_fraction", "success_hold_steps", "success_hold_ramp",
               "autoreset_mode", "video", "video_dir")


def load_sft_config(path: str, overrides: list[str] | None = None) -> SFTJobConfig:
    """Parse an SFT pipeline YAML (strict, like every job file).

    ``rl.overrides=[...]`` on the command line adds to the file's ``rl.overrides`` (after
    them, so that a key the file sets is changed by naming it again), rather than replacing
    the list: a recipe's RL settings there (the suite pipelines' 48-step episodes) stay.

    Raises:
        rlinf_embodied.config.ConfigError: an RL job config (no demos / bc section); invalid
            file or override; overrides that change an
            env field no stage reads (:data:`_UNREAD_ENV`: it would be silently ignored),
            however written (``env.num_envs=4``, ``'env={num_envs: 4}'``).
    """
    from rlinf_embodied.config import ConfigError, load_config, peek_top_level
    from rlinf_embodied.sft.config import check_no_rl_stage_keys, is_sft_pipeline

    raw = peek_top_level(path)
    if raw is not None and not is_sft_pipeline(raw) and ("trainer" in raw or "algorithm" in raw):
        raise ConfigError(f"{path} is an RL job config (trainer / algorithm sections), not an "
                          "SFT pipeline YAML (demos / bc sections): run it with `rlinf-embodied "
                          "train`, or pass a pipeline from configs/sft/.")
    check_no_rl_stage_keys(overrides or [], {f.name for f in dataclasses.fields(SFTJobConfig)})
    cfg = load_config(path, overrides or [], schema=SFTJobConfig)
    if overrides:
        file_cfg = load_config(path, [], schema=SFTJobConfig)
        if cfg.rl.overrides != file_cfg.rl.overrides:  # set on the command line, however written
            # they add to the file's (a recipe's 48-step episodes stay); later items win, so a
            # key of the file's list is changed by naming it again
            merged = [o for o in file_cfg.rl.overrides if o not in cfg.rl.overrides]
            cfg = dataclasses.replace(cfg, rl=dataclasses.replace(
                cfg.rl, overrides=merged + list(cfg.rl.overrides)))
        base = file_cfg.env
        changed = [k for k in _UNREAD_ENV
                   if getattr(cfg.env, k, None) != getattr(base, k, None)]
        if changed:
            fix = ",".join(f"env.{k}={_yaml(getattr(cfg.env, k))}" for k in changed)
            notes = []
            if "num_envs" in changed:
                notes.append("env.num_envs a multiple of algorithm.group_size")
            if {"num_envs", "num_processes"} & set(changed):
                notes.append("the SFT evaluation and the gate use eval.num_envs / "
                             "eval.num_processes")
            raise ConfigError(
                f"{fix}: no pipeline stage reads {'it' if len(changed) == 1 else 'them'} from "
                f"the pipeline's env section; set rl.overrides=[{fix}] for the RL stage"
                + (f" ({'; '.join(notes)})" if notes else "") + ".")
        from rlinf_embodied.sft.config import note_policy_fields_not_in_rl

        note_policy_fields_not_in_rl(cfg, file_cfg, overrides, rl_job_config)
    return cfg


#: Env settings that define the SFT evaluation's episodes: the RL stage's final evaluation must
#: run the same ones to be compared with it trial by trial (McNemar).
_EPISODE_ENV_KEYS = ("suite", "task_ids", "env_id", "control_mode", "obs_mode", "sensor_size",
                     "max_episode_steps")


def check_sft_evaluation(cfg: SFTJobConfig) -> None:
    """Refuse an RL stage whose final evaluation could not be compared with the SFT
    evaluation trial by trial: other episode settings (:data:`_EPISODE_ENV_KEYS`), another
    protocol or another number of trials per task (``eval.episodes``) than the SFT record's
    (``sft/sft_record.json``; nothing to check without one).

    Raises:
        rlinf_embodied.sft.gate.SFTCheckpointError: naming each difference (both values) and
            both fixes.
    """
    from rlinf_embodied.sft.gate import RECORD_FILE, SFTCheckpointError, recorded_trials

    path = cfg.run_dir() / "sft" / RECORD_FILE
    if not path.is_file():
        return
    rec = json.loads(path.read_text())
    env = rec.get("env") or {}
    diffs = [(f"env.{k}", getattr(cfg.env, k, None), env[k])
             for k in _EPISODE_ENV_KEYS if k in env and env[k] != getattr(cfg.env, k, None)]
    if rec.get("protocol") not in (None, cfg.eval.protocol):
        diffs.append(("eval.protocol", cfg.eval.protocol, rec["protocol"]))
    trials = recorded_trials(rec)
    if trials not in (None, cfg.eval.episodes):
        diffs.append(("eval.episodes", cfg.eval.episodes, trials))
    if diffs:
        raise SFTCheckpointError(
            f"{', '.join(f'{k}={_yaml(now)} (SFT: {_yaml(was)})' for k, now, was in diffs)}: the "
            f"SFT checkpoint in {path.parent} was evaluated under other settings, and RL's final "
            "evaluation must run the same episodes to be compared with it; set "
            f"{' '.join(f'{k}={_yaml(was)}' for k, _, was in diffs)} (the SFT evaluation's), or "
            "re-run `rlinf-embodied sft` with these settings first.")


def check_rl_dir(rl_dir: Path, resume: bool = False, command: str | None = None) -> None:
    """Refuse to start an RL stage in a run directory that already holds an RL run (its
    metrics and checkpoints would be mixed with the new run's, and ``best`` could be the old
    run's policy), or with ``resume`` to continue one where none is.

    Args:
        rl_dir: the pipeline's RL run directory (``<run.dir>/rl``).
        resume: check for ``finetune --resume`` (an RL run must be there) instead.
        command: the pipeline's ``finetune`` command line without ``--resume``, to name in
            the fixes (default: generic ones).

    Raises:
        rlinf_embodied.config.ConfigError: naming the directory and the fixes.
    """
    from rlinf_embodied.checkpoint import list_checkpoints
    from rlinf_embodied.config import ConfigError
    from rlinf_embodied.sft.gate import RECORD_FILE

    command = command or "rlinf-embodied finetune CONFIG [key=value ...]"
    if resume and not (rl_dir / "config.yaml").is_file():
        record = rl_dir.parent / "sft" / RECORD_FILE
        start = (f"`{command}` without --resume to start one" if record.is_file() else
                 f"`{command.replace(' finetune ', ' sft-rl ', 1)}` (nor has the SFT stage run: "
                 f"no {record})")
        raise ConfigError(f"--resume: {rl_dir} holds no RL run to continue; run {start}.")
    if not resume and ((rl_dir / "metrics.jsonl").is_file() or list_checkpoints(rl_dir)):
        raise ConfigError(
            f"{rl_dir} already holds an RL run; `{command} --resume` continues it and writes the "
            f"final evaluation and summary, or delete it (or set run.dir to a new directory) to "
            f"start over.")


def _recorded(path: Path, suite: bool) -> int:
    """Demos recorded in a converted file: its planned episodes for a suite (trajectories.json
    beside it; a few plans may fail to replay in the policy's controller, so the converted
    file can hold fewer), else the file's own episodes."""
    plans = path.parent / "trajectories.json"
    meta = plans if suite and plans.is_file() else path.with_suffix(".json")
    return len(json.loads(meta.read_text())["episodes"])


def _check_demo_count(cfg: SFTJobConfig, files: dict[str, Path], suite: bool) -> None:
    """Refuse to train on fewer recorded demos than ``demos.num_trajectories`` (a smaller set,
    e.g. a smoke run's, left in a shared ``demos.dir``).

    Raises:
        ValueError: naming the counts and both fixes.
    """
    short = {name: n for name, p in files.items()
             if (n := _recorded(p, suite)) < cfg.demos.num_trajectories}
    if short:
        counts = ", ".join(f"{name}: {n}" for name, n in short.items())
        raise ValueError(
            f"demos.num_trajectories={cfg.demos.num_trajectories} but {cfg.demos.dir} holds fewer "
            f"({counts}); run `rlinf-embodied demos CONFIG.yaml` to record the rest, or set "
            f"demos.num_trajectories={min(short.values())} to train on what is there.")


def run_demos(cfg: SFTJobConfig, log=print, force: bool = False) -> Path:
    """Stage 1: motion-planning demonstrations in the policy's controller (skipped when the
    converted file exists and holds at least ``demos.num_trajectories`` episodes, unless
    ``force``). Returns the trajectory file."""
    from rlinf_embodied.sft.demos import find_demos, generate_demos

    e = cfg.env
    if getattr(e, "suite", None) is not None:
        return _run_suite_demos(cfg, log, force)
    found = find_demos(cfg.demos.dir, e.env_id, e.control_mode, e.obs_mode)
    if found is not None and not force and (n := _recorded(found, False)) >= cfg.demos.num_trajectories:
        log(f"demos: using {found} ({n} episodes)")
        return found
    demo = generate_demos(e.env_id, cfg.demos.dir, cfg.demos.num_trajectories,
                          control_mode=e.control_mode, obs_mode=e.obs_mode,
                          reward_mode=e.reward_mode, seed=cfg.demos.seed,
                          max_attempts=cfg.demos.num_trajectories * cfg.demos.max_attempts_factor,
                          log=log)
    atomic_write_json(demo.path.parent / "generation.json", demo.to_dict())
    return demo.path


def _run_suite_demos(cfg: SFTJobConfig, log, force: bool) -> Path:
    """Stage 1 for a suite: RGB demos of every selected task (reused, unless ``force``, when
    each task's converted file exists and came from at least ``demos.num_trajectories``
    successful plans)."""
    from rlinf_embodied.sft.vla_demos import (
        find_suite_demos,
        generate_suite_demos,
        suite_generation_record,
    )

    e, d = cfg.env, cfg.demos
    root = Path(d.dir) / e.suite
    suite = e.suite_spec()
    for env_id in e.env_ids():
        if (k := suite.demo_stride(env_id, d.stride)) != d.stride:
            log(f"demos: {env_id} at its suite task's stride {k}, not demos.stride={d.stride} "
                "(its plans would not fit the suite's horizon)")
    found = find_suite_demos(d.dir, e, d.stride)
    if not force and len(found) == len(e.env_ids()) and all(
            _recorded(p, True) >= d.num_trajectories for p in found.values()):
        log(f"demos: using {', '.join(str(p) for p in found.values())}")
        return root
    demo = generate_suite_demos(e, d.dir, d.num_trajectories, seed=d.seed,
                                max_attempts_factor=d.max_attempts_factor,
                                processes=d.processes, stride=d.stride, log=log)
    atomic_write_json(suite_generation_record(d.dir, e.suite, e.control_mode, e.sensor_size,
                                              d.stride), demo.to_dict())
    return root


def run_sft(cfg: SFTJobConfig, log=print) -> dict[str, Any]:
    """Stage 2: behaviour-clone ``cfg.policy`` on the demos, save, evaluate, record.

    Returns:
        ``{"checkpoint", "bc": metrics, "evaluation": {...rate, ci95...}}``.

    Raises:
        FileNotFoundError: no demos (run ``demos`` first).
        ValueError: fewer demos recorded than ``demos.num_trajectories``.
    """
    if cfg.policy.type in VLA_TYPES:
        return run_vla_sft(cfg, log)
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
    _check_demo_count(cfg, {e.env_id: path}, suite=False)
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
    t0 = time.perf_counter()
    ev = evaluate_checkpoint(ckpt, e, sft_dir / "eval.json", cfg.eval.episodes,
                             protocol=cfg.eval.protocol, num_envs=cfg.eval.num_envs,
                             num_processes=cfg.eval.num_processes)
    ev["wall_s"] = time.perf_counter() - t0  # summary.json's stages.sft_eval
    write_record(sft_dir, ev, e, cfg.eval, extra={"demos": str(path), "policy_type": cfg.policy.type,
                                                   "num_demos": data.num_trajectories})
    log(f"sft: success_once {ev['rate']:.3f} (95% CI {ev['ci95'][0]:.3f}-{ev['ci95'][1]:.3f}), "
        f"success_at_end {ev['success_at_end_rate']:.3f}")
    return {"checkpoint": str(ckpt), "bc": metrics, "evaluation": ev}


def run_vla_sft(cfg: SFTJobConfig, log=print) -> dict[str, Any]:
    """Stage 2 for a VLA on a suite: SFT on the RGB demos (:func:`~rlinf_embodied.sft.vla_bc.
    train_vla_bc`) with the demos' statistics, save ``sft/vla`` (published layout: OpenVLA /
    OFT's, LeRobot's for π0 / π0.5) and
    ``sft/policy`` (whose ``policy.pretrained`` is ``sft/vla``), evaluate, record.

    Raises:
        FileNotFoundError: no demos for a task (run ``demos`` first).
        ValueError: demos recorded for another suite, controller or image size, or fewer
            than ``demos.num_trajectories`` of a task (:func:`_check_demo_count`).
    """

    import torch

    from rlinf_embodied.policies import build_policy, save_policy
    from rlinf_embodied.sft.bc import space_spec_of
    from rlinf_embodied.sft.dataset import RGBDemoDataset
    from rlinf_embodied.sft.gate import evaluate_checkpoint, write_record
    from rlinf_embodied.sft.vla_bc import train_vla_bc
    from rlinf_embodied.sft.vla_demos import find_suite_demos

    e = cfg.env
    if getattr(e, "suite", None) is None:
        raise ValueError(f"policy.type={cfg.policy.type} trains on a language-conditioned suite's "
                         "RGB demos; set env.suite (e.g. maniskill_lang3) and env.obs_mode=rgb.")
    found = find_suite_demos(cfg.demos.dir, e, cfg.demos.stride)
    missing = [t for t in e.env_ids() if t not in found]
    if missing:
        raise FileNotFoundError(f"No {e.control_mode} {e.sensor_size} px RGB demos of {missing} under "
                                f"{cfg.demos.dir}/{e.suite}; run `rlinf-embodied demos CONFIG.yaml` first.")
    _check_demo_count(cfg, found, suite=True)
    data = RGBDemoDataset([found[t] for t in e.env_ids()], max_trajectories=cfg.demos.num_trajectories,
                          trim_idle_start=cfg.demos.trim_idle_start)
    data.check_env(e)
    log(f"sft: {data.num_trajectories} demos, {len(data)} transitions of {', '.join(e.env_ids())}")
    spec = space_spec_of(e)
    torch.manual_seed(cfg.bc.seed)
    pcfg = dataclasses.replace(cfg.policy, checkpoint=None, pretrained=None)
    if getattr(pcfg, "image_preprocessing", None) == "auto":  # a tiny preset's; kept once pretrained
        pcfg = dataclasses.replace(pcfg, image_preprocessing="fast")
    from rlinf_embodied.policies.prismatic_config import select_device_dtype

    policy = build_policy(pcfg, spec).to(select_device_dtype(None, pcfg.dtype)[0])
    key = f"{e.suite}_{e.control_mode}"
    policy.set_dataset_statistics(data.statistics(key), key)
    metrics = train_vla_bc(policy, data, cfg.bc, log=log)
    sft_dir = cfg.run_dir() / "sft"
    vla_dir = policy.save_pretrained_like(sft_dir / "vla", step=int(cfg.bc.steps)).resolve()
    policy.config = dataclasses.replace(policy.config, pretrained=str(vla_dir))
    ckpt = save_policy(policy, sft_dir / "policy")
    atomic_write_json(sft_dir / "bc_metrics.json", metrics)
    log(f"sft: saved {vla_dir} and {ckpt}; evaluating on {cfg.eval.episodes} held-out trials per task")
    t0 = time.perf_counter()
    ev = evaluate_checkpoint(ckpt, e, sft_dir / "eval.json", cfg.eval.episodes,
                             protocol=cfg.eval.protocol, num_envs=cfg.eval.num_envs,
                             num_processes=cfg.eval.num_processes)
    ev["wall_s"] = time.perf_counter() - t0
    write_record(sft_dir, ev, e, cfg.eval, extra={"demos": [str(found[t]) for t in e.env_ids()],
                                                   "policy_type": cfg.policy.type,
                                                   "pretrained": str(vla_dir.relative_to(Path(sft_dir).resolve())),
                                                   "num_demos": data.num_trajectories})
    per_task = ", ".join(f"{v['instruction']}: {v['rate']:.2f}" for v in ev["per_task"].values())
    log(f"sft: success {ev['rate']:.3f} (95% CI {ev['ci95'][0]:.3f}-{ev['ci95'][1]:.3f}); {per_task}")
    return {"checkpoint": str(ckpt), "pretrained": str(vla_dir), "bc": metrics, "evaluation": ev}


def rl_job_config(cfg: SFTJobConfig, extra: list[str] | None = None):
    """The RL stage's JobConfig: ``rl.config`` + the SFT checkpoint (``policy.checkpoint``; a
    VLA's published-layout ``sft/vla`` through ``policy.pretrained``), the pipeline's env
    settings (controller, obs mode, reward: ``rl.reward_mode`` or the env's, time limits, task
    or suite with ``rl.task_ids`` or the pipeline's tasks), the policy's sampling fields
    (:data:`~rlinf_embodied.sft.gate.SAMPLING_FIELDS`: π0's ``noise_method`` / ``noise_level``,
    a VLA's ``temperature``) when both are of one family, ``run.dir = <run dir>/rl``, then
    ``rl.overrides``."""
    from rlinf_embodied.config import load_config

    e = cfg.env
    sft_dir = (cfg.run_dir() / "sft").resolve()
    ckpt = (f"policy.pretrained={sft_dir / 'vla'}" if cfg.policy.type in VLA_TYPES
            else f"policy.checkpoint={sft_dir / 'policy'}")
    forced = [ckpt, f"run.dir={cfg.run_dir() / 'rl'}",
              f"env.control_mode={e.control_mode}", f"env.obs_mode={e.obs_mode}",
              f"env.reward_mode={cfg.rl.reward_mode or e.reward_mode}",
              # the env's time limits, raised for a slow machine, hold for every stage
              *(f"env.{k}={getattr(e, k)}" for k in ("startup_timeout_s", "reset_timeout_s",
                                                     "step_timeout_s") if hasattr(e, k))]
    if getattr(e, "suite", None) is not None:
        tasks = cfg.rl.task_ids if cfg.rl.task_ids is not None else e.suite_task_ids()
        forced += [f"env.suite={e.suite}", f"env.task_ids=[{','.join(map(str, tasks))}]",
                   f"env.sensor_size={e.sensor_size}"]
    else:
        forced.append(f"env.env_id={e.env_id}")
    if e.max_episode_steps is not None:
        forced.append(f"env.max_episode_steps={e.max_episode_steps}")
    if load_config(cfg.rl.config).policy.type == cfg.policy.type:
        # what `sample` draws (the rollouts') is set where the policy is: the pipeline's policy
        # section (rl.overrides still win); no SFT-stage evaluation reads these fields
        from rlinf_embodied.sft.gate import sampling_of

        forced += [f"policy.{k}={v}" for k, v in sampling_of(cfg.policy).items() if v is not None]
    return load_config(cfg.rl.config, [*forced, *cfg.rl.overrides, *(extra or [])])


def check_same_policy(cfg: SFTJobConfig, job) -> None:
    """The RL job's policy must act as the SFT stage's: same type (family) and, for VLAs, the
    same :data:`_VLA_BEHAVIOUR` fields.

    Raises:
        rlinf_embodied.config.ConfigError: naming the field, both values and the fix.
    """
    from rlinf_embodied.config import ConfigError
    from rlinf_embodied.sft.config import check_rl_family

    check_rl_family(cfg, job.policy.type)
    fields = _VLA_BEHAVIOUR if cfg.policy.type in VLA_TYPES else ("type",)
    for name in fields:
        a, b = getattr(cfg.policy, name, None), getattr(job.policy, name, None)
        if a != b:
            raise ConfigError(
                f"policy.{name} is {a!r} in the SFT config but {b!r} in the RL config "
                f"{cfg.rl.config}: RL would start from an SFT checkpoint "
                f"{'of another family' if name == 'type' else 'that acts differently'}; set "
                f"policy.{name} the same in both (rl.overrides: [policy.{name}={a}]).")


def validate_rl_stage(cfg: SFTJobConfig, extra: list[str] | None = None):
    """The RL stage's JobConfig (:func:`rl_job_config`) after the checks ``train`` runs
    (``rlinf_embodied.runners.setup.validate_job``): ``finetune`` / ``sft-rl`` / ``config show``
    call it before any stage runs, so that a bad ``rl.config`` / ``rl.overrides`` fails in one line.

    Raises:
        rlinf_embodied.config.ConfigError: the RL stage's job is invalid (e.g. its
            ``env.num_envs``, the RL config's and not the pipeline env's, is no multiple of
            ``algorithm.group_size``); the message says that the fix goes into ``rl.overrides``.
    """
    from rlinf_embodied.config import ConfigError
    from rlinf_embodied.runners.setup import validate_job

    from rlinf_embodied.sft.config import (check_rl_config_found, check_rl_family,
                                           rl_config_policy_type)

    try:
        job = rl_job_config(cfg, extra)
    except ConfigError as e:  # a bad value in rl.config or rl.overrides: say which stage
        check_rl_config_found(cfg)  # or a missing rl.config, or another family's config
        check_rl_family(cfg, rl_config_policy_type(cfg.rl.config))
        raise ConfigError(f"The RL stage (rl.config {cfg.rl.config} + rl.overrides): {e}") from None
    check_same_policy(cfg, job)
    try:
        validate_job(job)
    except ConfigError as e:  # the fix goes into rl.overrides, not the pipeline's own sections
        raise ConfigError(
            f"The RL stage (rl.config {cfg.rl.config}, with its own env, not the pipeline's): "
            f"{e} Set it in rl.overrides=[...].") from None
    return job


#: RL settings ``finetune --resume`` may change: ``train --resume``'s (``RESUME_SAFE_KEYS``) and
#: where the run lives (the pipeline sets ``run.dir``); others are warned of, ``policy.*`` refused.
_RESUME_SAFE = ("run.name", "run.dir", "run.output_dir")


def resume_checkpoint(job, rl_dir: Path, log=print) -> Path:
    """The checkpoint ``finetune --resume`` continues the pipeline's RL run ``rl_dir`` from:
    its newest complete one (damaged ones skipped with a warning), after comparing the run's
    ``config.yaml`` with the RL job the pipeline config gives now (``job``); its paths into the
    run directory it was started in count as ``rl_dir.parent``'s (a copied or moved run goes on).

    Raises:
        rlinf_embodied.config.ConfigError: ``rl_dir`` holds no RL run or no complete
            checkpoint, or ``job`` has other ``policy.*`` settings than the run (each named).
    """
    from rlinf_embodied.checkpoint import latest_loadable_checkpoint
    from rlinf_embodied.config import RESUME_SAFE_KEYS, ConfigError, config_diff, load_config
    from rlinf_embodied.runners.setup import rebase_policy_paths

    check_rl_dir(rl_dir, resume=True)
    ckpt = latest_loadable_checkpoint(rl_dir, warn=log)
    if ckpt is None:
        raise ConfigError(f"--resume: no complete checkpoint in {rl_dir / 'checkpoints'} (the RL "
                          f"run stopped before its first save); delete {rl_dir} and run "
                          "`rlinf-embodied finetune` without --resume to start it again.")
    skip = RESUME_SAFE_KEYS + _RESUME_SAFE + (
        ("trainer.pipeline_stages",) if job.placement == "auto" else ())
    saved = load_config(rl_dir / "config.yaml")  # its SFT paths: the run dir's when copied/moved
    saved = rebase_policy_paths(saved, Path(saved.run.run_dir()).parent, rl_dir.parent)
    changed = config_diff(saved, job, skip)
    policy = [d for d in changed if d.startswith("policy.")]
    if policy:
        raise ConfigError(f"--resume: {'; '.join(policy)} (the RL run's config -> the pipeline's "
                          "now) cannot change on resume, the checkpoint holds the run's policy; "
                          "set them back in the pipeline config (rl.overrides), or start over in a "
                          "new run.dir.")
    if changed:
        log(f"warning: resuming with changed settings {', '.join(changed)}; the result will "
            "differ from an uninterrupted run.")
    return ckpt


def run_rl(cfg: SFTJobConfig, log=print, extra_overrides: list[str] | None = None,
           resume: bool = False) -> dict[str, Any]:
    """Stage 3: the step-0 gate, RL fine-tuning from the SFT checkpoint, and the final
    held-out evaluation on the SFT evaluation's trials.

    With ``resume`` (``finetune --resume``) the RL run in ``<run dir>/rl`` continues from its
    newest complete checkpoint (:func:`resume_checkpoint`; as ``train --resume`` does) to the
    configured ``trainer.iterations`` (none when it has done them), without a new gate when
    ``rl/gate.json`` exists; the final evaluation is then that of an uninterrupted run
    (``rl_state.json``'s ``wall_s`` counts this command's training, ``resumed_from`` the
    iteration it continued from, and ``wall_s_total`` adds the training before: a part stopped
    by Ctrl-C records its time with ``"interrupted": true``, a finished one as it ends, e.g. a
    run extended by raising ``trainer.iterations``).

    Raises:
        rlinf_embodied.config.ConfigError: ``resume`` and nothing to continue
            (:func:`resume_checkpoint`).
        rlinf_embodied.sft.gate.GateError: the gate refused the SFT checkpoint.
        rlinf_embodied.sft.gate.SFTCheckpointError: no SFT checkpoint, one of another family,
            or one evaluated under other episode settings or trials (:func:`check_sft_evaluation`).
        KeyboardInterrupt: the RL run was stopped by Ctrl-C (its checkpoint is saved; the
            command says how to go on).
    """
    from rlinf_embodied.runners.embodied import EmbodiedRunner
    from rlinf_embodied.sft.gate import check_gate, evaluate_checkpoint, sampling_of


    job = validate_rl_stage(cfg, extra_overrides)
    check_sft_evaluation(cfg)
    rl_dir = Path(job.run.run_dir())
    ckpt = resume_checkpoint(job, rl_dir, log) if resume else None
    if ckpt is not None and (rl_dir / "gate.json").is_file():
        gate = json.loads((rl_dir / "gate.json").read_text())
        log(f"step-0 gate: {rl_dir / 'gate.json'} (the RL run's, not measured again)")
    else:
        t0 = time.perf_counter()
        gate = check_gate(job.policy.checkpoint or job.policy.pretrained, job.env, rl_dir,
                          episodes=cfg.eval.gate_episodes, tolerance=cfg.eval.gate_tolerance,
                          log=log, policy_type=job.policy.type,
                          sampling=sampling_of(job.policy))
        gate["wall_s"] = time.perf_counter() - t0
        atomic_write_json(rl_dir / "gate.json", gate)
    t0 = time.perf_counter()
    done = json.loads((ckpt / "runner_state.json").read_text()) if ckpt is not None else None
    old = rl_dir / "rl_state.json"  # of the command that trained last (finished or Ctrl-C'd)
    old = json.loads(old.read_text()) if done is not None and old.is_file() else {}
    # that command's time counts when it ended at the checkpoint this one continues from
    recorded = done is not None and old.get("iteration") == done["iteration"]
    if done is not None and done["iteration"] >= job.trainer.iterations:  # only the evaluation
        log(f"rl: {ckpt.name} has done trainer.iterations={job.trainer.iterations}")
        state = ({k: v for k, v in old.items() if k != "interrupted"} if recorded
                 else {**done, "wall_s": None})
    else:
        runner = EmbodiedRunner(job, rl_dir, resume=ckpt is not None, checkpoint=ckpt)
        state = runner.run()
        state["wall_s"] = time.perf_counter() - t0
        if done is not None:
            state["resumed_from"] = done["iteration"]
            before = old.get("wall_s_total", old.get("wall_s"))
            if recorded and before is not None:
                state["wall_s_total"] = before + state["wall_s"]
        if runner.interrupted:  # Ctrl-C: the runner saved a checkpoint; no evaluation, no summary
            # its time is recorded for `--resume` (wall_s_total of the whole RL stage)
            atomic_write_json(rl_dir / "rl_state.json", {**state, "interrupted": True})
            raise KeyboardInterrupt
    atomic_write_json(rl_dir / "rl_state.json", state)
    best = rl_dir / "checkpoints" / "best"
    ckpt = best if cfg.eval.rl_checkpoint == "best" and best.is_dir() else rl_dir  # rl_dir: latest
    tasks = len(cfg.env.env_ids())
    log(f"rl: {state['iteration']} iterations, {state['env_steps']:,} env steps; evaluating "
        f"{ckpt} on the SFT evaluation's {cfg.eval.episodes * tasks} held-out trials"
        + (f" ({cfg.eval.episodes} per task)" if tasks > 1 else ""))
    t0 = time.perf_counter()
    ev = evaluate_checkpoint(ckpt, cfg.env, rl_dir / "final_eval.json", cfg.eval.episodes,
                             protocol=cfg.eval.protocol, num_envs=cfg.eval.num_envs,
                             num_processes=cfg.eval.num_processes)
    ev["wall_s"] = time.perf_counter() - t0
    atomic_write_json(rl_dir / "final_eval_summary.json", ev)
    at_end = ev.get("success_at_end_rate")  # None where the protocol ends episodes at success
    log(f"rl: success_once {ev['rate']:.3f} (95% CI {ev['ci95'][0]:.3f}-{ev['ci95'][1]:.3f})"
        + (f", success_at_end {at_end:.3f}" if at_end is not None else ""))
    return {"gate": gate, "state": state, "checkpoint": str(ckpt), "evaluation": ev}


def run_sft_rl(cfg: SFTJobConfig, log=print) -> dict[str, Any]:
    """Every stage in order: demos (reused when present), SFT, gate + RL, summary."""
    run_demos(cfg, log=log)
    run_sft(cfg, log=log)
    run_rl(cfg, log=log)
    return summarize(cfg)
