"""Held-out evaluation of SFT / RL checkpoints and the RL stage's step-0 gate.

Evaluation goes through :func:`rlinf_embodied.eval.run.evaluate` (ManiSkill's fair protocol,
``maniskill_fair_v1``: terminations ignored, trial i resets with seed ``1_000_000 + i``, which
no training or demonstration seed reaches), so SFT and RL results are paired episode by
episode and carry Wilson 95% intervals.

The gate: an SFT checkpoint carries ``sft_record.json`` next to its ``policy/`` directory (the
SFT stage's evaluation results file and the gate settings). Before RL starts from it, the RL
run re-evaluates the checkpoint under *its own* env settings on the first ``gate_episodes``
recorded trials and refuses to start (:class:`GateError`) when it scores more than
``gate_tolerance`` below the SFT stage's result on the same trials: a checkpoint that scores
far lower in the RL setup (another controller, observation layout, or simply the wrong
weights) would make the RL run start from nothing. An RL run with shorter episodes than the
SFT evaluation's (the suite recipes' 48-step RL against the protocol's 80) is compared with the
recorded trials' successes within its horizon (``Episode.success_step``), so that both sides
score the same steps.

Both evaluations are batch-invariant (the policy runs on each env's row alone, see
:func:`~rlinf_embodied.eval.acting.policy_act`): under the same env settings the gate's
episodes equal the SFT stage's trial by trial, whatever ``num_envs`` and ``num_processes``
each used; ``gate.json`` lists the trials whose success differs (``differing_trials``).
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any

from rlinf_embodied.checkpoint import atomic_write_json
from rlinf_embodied.config import EnvConfig

__all__ = [
    "RECORD_FILE",
    "SAMPLING_FIELDS",
    "GateError",
    "SFTCheckpointError",
    "check_family",
    "check_gate",
    "evaluate_checkpoint",
    "gate_for_job",
    "read_record",
    "recorded_trials",
    "sampled_success",
    "sampling_of",
    "write_record",
]

RECORD_FILE = "sft_record.json"
"""Name of the SFT record next to an SFT checkpoint's ``policy/`` directory."""

SAMPLING_FIELDS = ("temperature", "noise_method", "noise_level", "initial_noise_head")
"""Policy config fields that set what ``sample`` mode draws and that an RL run may set apart
from the SFT checkpoint's saved config (a VLA's token temperature, π0's Flow-SDE and learned
initial noise): the gate's
sampled evaluation uses the RL run's values (:func:`sampling_of`), as its rollouts do."""


def sampling_of(policy_cfg: Any) -> dict[str, Any]:
    """The :data:`SAMPLING_FIELDS` a policy config has, with their values."""
    return {k: getattr(policy_cfg, k) for k in SAMPLING_FIELDS if hasattr(policy_cfg, k)}


class GateError(RuntimeError):
    """The SFT checkpoint scores far below its recorded SFT result under the RL setup."""


class SFTCheckpointError(GateError):
    """Bad input to the RL stage: no SFT checkpoint with its record, or one of another policy
    family (the CLI exits 2 for it, 3 for a gate that measured and refused)."""


def evaluate_checkpoint(checkpoint: str | Path, env_cfg: Any, output: str | Path, trials: int,
                        *, protocol: str = "maniskill_fair_v1", num_envs: int = 8,
                        num_processes: int = 2, fresh: bool = True,
                        policy_mode: str | None = None, reports: bool = True,
                        batch_invariant: bool = True,
                        env_overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """Evaluation of a ``save_policy`` checkpoint on held-out ManiSkill seeds.

    Args:
        checkpoint: policy directory (or a run / checkpoint directory holding one).
        env_cfg: the ManiSkill EnvConfig whose controller, obs mode, reward and
            ``max_episode_steps`` the episodes use (the protocol supplies seeds and ignores
            terminations).
        output: results JSON (``.md``/``.png``/``.html`` reports are written beside it).
        trials: trials 0..trials-1 of the protocol.
        protocol: evaluation protocol name.
            With ``env_cfg.suite`` set: trials 0..trials-1 of every selected task, under the
            suite's protocol unless ``protocol`` names another.
        num_envs: envs run concurrently (results do not depend on it when
            ``batch_invariant``).
        num_processes: env pool processes.
        fresh: delete an existing ``output`` first (else the evaluation resumes it).
        policy_mode: ``greedy`` or ``sample`` (actions drawn from the policy's distribution,
            seeded by the protocol's ``global_seed``); None keeps the protocol's (greedy for
            every shipped protocol).
        reports: also write the ``.md``/``.png``/``.html`` reports.
        batch_invariant: run the policy row by row (:class:`~rlinf_embodied.eval.request.EvalRequest`),
            so that each trial's episode is the same for any ``num_envs`` / ``num_processes``.
        env_overrides: further EnvConfig fields of the episodes (e.g. the ``sensor_size`` an
            earlier evaluation took from the policy's run); ``env_cfg``'s controller, reward
            and a suite's image size take precedence.

    Returns:
        ``{"rate", "ci95", "successes", "success_at_end_rate", "success_at_end_ci95",
        "episodes", "results", "per_task"}`` (success_once rate with its Wilson interval,
        ManiSkill's ``success_at_end`` likewise, the results file path, and rate, interval,
        episodes and instruction per task).
    """
    from rlinf_embodied.eval.request import EvalRequest
    from rlinf_embodied.eval.run import evaluate

    output = Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    if fresh and output.exists():
        output.unlink()
    suite = getattr(env_cfg, "suite", None)
    overrides = {**(env_overrides or {}), "control_mode": env_cfg.control_mode,
                 "reward_mode": env_cfg.reward_mode}
    max_steps = env_cfg.max_episode_steps
    if suite is not None:  # a language-conditioned suite: trials 0..n-1 of every task
        from rlinf_embodied.eval.protocols import get_protocol

        overrides["sensor_size"] = env_cfg.sensor_size
        tasks = env_cfg.suite_task_ids()
        n = trials * len(tasks)
        if max_steps == get_protocol(protocol or env_cfg.suite_spec().protocol).max_steps_for(suite):
            max_steps = None  # the protocol's own horizon: not an override
    else:
        tasks, n = None, trials
    req = EvalRequest(
        env="maniskill", task=None if suite else env_cfg.env_id, suite=suite, tasks=tasks,
        policy=str(checkpoint), protocol=protocol, trials_per_task=trials,
        num_envs=max(1, min(num_envs, n)), num_processes=num_processes, output=str(output),
        obs_mode=env_cfg.obs_mode, max_steps=max_steps,
        # a suite's VLA runs on the GPU when there is one (bf16 there), state policies on CPU
        device=None if suite is not None else "cpu", policy_mode=policy_mode, reports=reports,
        batch_invariant=batch_invariant, env_overrides=overrides,
    )
    results = evaluate(req)
    summary = results.summary()
    o = summary["overall"]
    return {"rate": o["rate"], "ci95": o["ci95"], "successes": o["successes"],
            "success_at_end_rate": o.get("success_at_end_rate"),
            "success_at_end_ci95": o.get("success_at_end_ci95"),
            "episodes": o["episodes"], "results": str(output),
            "per_task": {k: {"rate": v["rate"], "ci95": v["ci95"], "episodes": v["episodes"],
                             "instruction": v.get("instruction")}
                         for k, v in summary["per_task"].items()}}


def write_record(sft_dir: Path, evaluation: dict[str, Any], env_cfg: Any, eval_cfg: Any,
                 extra: dict[str, Any] | None = None) -> Path:
    """Write ``sft_dir/sft_record.json``: the SFT evaluation (with its env settings, protocol
    and ``trials_per_task``, ``eval.episodes``) and the gate settings. Paths inside ``sft_dir``
    (``policy``, a VLA's ``pretrained`` in ``extra``) are relative to it, so that a moved or
    copied run's record names its own files."""
    record = {
        "policy": "policy",
        "evaluation": evaluation,
        "env": {k: v for k, v in dataclasses.asdict(env_cfg).items()},
        "protocol": eval_cfg.protocol,
        "trials_per_task": eval_cfg.episodes,
        "gate_episodes": eval_cfg.gate_episodes,
        "gate_tolerance": eval_cfg.gate_tolerance,
        **(extra or {}),
    }
    path = Path(sft_dir) / RECORD_FILE
    atomic_write_json(path, record)
    return path


def read_record(checkpoint: str | Path) -> dict[str, Any] | None:
    """The SFT record of a policy checkpoint directory (or of its parent), or None."""
    p = Path(checkpoint)
    for c in (p / RECORD_FILE, p.parent / RECORD_FILE):
        if c.is_file():
            rec = json.loads(c.read_text())
            rec["_dir"] = str(c.parent)
            return rec
    return None


def recorded_trials(record: dict[str, Any]) -> int | None:
    """Trials per task (``eval.episodes``) of the SFT evaluation in ``record``: its
    ``trials_per_task``; for records written before that key, the most episodes of one task in
    its evaluation (every task ran trials 0..n-1). None when the record says neither."""
    if record.get("trials_per_task") is not None:
        return int(record["trials_per_task"])
    per_task = (record.get("evaluation") or {}).get("per_task") or {}
    counts = [int(v["episodes"]) for v in per_task.values() if isinstance(v, dict) and v.get("episodes")]
    return max(counts) if counts else None


def _task_keys(env_cfg: Any) -> list[str]:
    """The tasks ``env_cfg`` runs as results files name them (``str(Episode.task)``): a suite's
    task ids (``"0"``, ``"2"``), else the env id."""
    if getattr(env_cfg, "suite", None) is not None:
        return [str(t) for t in env_cfg.suite_task_ids()]
    return [str(env_cfg.env_id)]


def _recorded_episodes(record: dict[str, Any], trials: int,
                       horizon: int | None = None) -> tuple[dict[tuple, bool], bool, int | None]:
    """(task, trial) -> success of the SFT stage's episodes with trial < ``trials``, whether
    they were rescored, and the SFT evaluation's horizon (its results header's ``max_steps``).

    With ``horizon`` below the SFT evaluation's ``max_episode_steps`` (an RL run with shorter
    episodes), an episode counts as a success when it succeeded within the first ``horizon``
    steps (:attr:`~rlinf_embodied.eval.results.Episode.success_step`), so both sides of the
    gate score the same steps of the same trials; results without ``success_step`` (written
    before it was recorded) keep their full-horizon success, and the second value is False.

    Raises:
        GateError: the SFT results file has none.
    """
    from rlinf_embodied.eval.results import ResultsFile

    path = Path(record["evaluation"]["results"])
    if not path.is_absolute() and not path.exists():
        path = Path(record["_dir"]) / path.name
    results = ResultsFile.load(path)
    episodes = [e for e in results.episodes if e.trial < trials]
    if not episodes:
        raise GateError(f"The SFT results file {path} has no episodes with trial < {trials}.")
    # the steps the SFT evaluation ran (its results header; the record's env for older files)
    recorded_horizon = results.header.get("max_steps")
    if not isinstance(recorded_horizon, int):
        recorded_horizon = (record.get("env") or {}).get("max_episode_steps")
    rescore = (horizon is not None and recorded_horizon is not None
               and horizon < int(recorded_horizon)
               and all(e.success_step is not None for e in episodes if e.success))
    eps = {(str(e.task), e.trial): bool(e.success) and (not rescore or e.success_step <= horizon)
           for e in episodes}
    return eps, rescore, recorded_horizon


def check_family(record: dict[str, Any], policy_type: str | None, checkpoint: Any) -> None:
    """Refuse an SFT checkpoint of another policy family than the RL run's.

    Raises:
        SFTCheckpointError: the record's ``policy_type`` differs from ``policy_type`` (one line).
    """
    have = record.get("policy_type")
    if policy_type is not None and have is not None and have != policy_type:
        raise SFTCheckpointError(f"The SFT checkpoint {checkpoint} holds a {have!r} policy but the RL run's "
                        f"policy.type is {policy_type!r}; start from an SFT checkpoint of "
                        f"{policy_type} (its pipeline config) or set policy.type={have}.")


def check_gate(checkpoint: str | Path, env_cfg: EnvConfig, out_dir: str | Path,
               episodes: int | None = None, tolerance: float | None = None,
               log=print, sampled: bool = True, policy_type: str | None = None,
               sampling: dict[str, Any] | None = None) -> dict[str, Any]:
    """Re-evaluate an SFT checkpoint under ``env_cfg`` and compare with its record.

    Args:
        checkpoint: the SFT policy directory (``sft_record.json`` beside it), or a VLA's
            published-layout directory beside it.
        env_cfg: the RL run's EnvConfig (the re-evaluations use its ``num_processes``).
        out_dir: where ``gate.json`` and the re-evaluations' results go (``gate_eval.json``
            greedy, ``gate_sampled.json`` sampled).
        episodes: trials to re-evaluate; None uses the record's ``gate_episodes``.
        tolerance: allowed drop of the success rate; None uses the record's.
        log: printer.
        sampled: once passed, also measure the success of *sampled* actions on the same
            trials (:func:`sampled_success`; reported, not gated on) and warn when it is more
            than ``tolerance`` below the greedy one.
        policy_type: the RL run's ``policy.type``; a record of another type is refused.
        sampling: the RL run's :data:`SAMPLING_FIELDS` (:func:`sampling_of`); the sampled
            evaluation draws with these where they differ from the checkpoint's saved config.

    Returns:
        ``{"recorded", "measured", "episodes", "tolerance", "tasks", "passed": True, "sampled",
        "sampled_ci95", "sampled_with", "log_std", "differing_trials", "batch_invariant", ...}``
        (``sampled_with``: the sampling fields changed from the checkpoint's; also
        written to ``out_dir/gate.json``; ``tasks``: the tasks gated, as results name them (a
        suite's task ids, else the env id): those of the record that ``env_cfg`` runs, which
        ``recorded``, ``episodes`` and ``differing_trials`` count alone; ``differing_trials``:
        trials whose success differs from the SFT stage's, none when the env settings are the
        same and both evaluations were batch-invariant; ``horizon`` / ``recorded_horizon``: the
        RL env's and the SFT evaluation's ``max_episode_steps``; ``recorded_within_horizon``:
        whether the recorded side counts only successes within ``horizon``, see
        :func:`_recorded_episodes`).

    Raises:
        GateError: no record next to the checkpoint, an SFT checkpoint of another policy type,
            a record with no trials of ``env_cfg``'s tasks (:class:`SFTCheckpointError`), or
            the measured success rate is more than ``tolerance`` below the recorded one on the
            same trials.
    """
    record = read_record(checkpoint)
    if record is None:
        where = Path(checkpoint).parent / RECORD_FILE
        missing = "" if Path(checkpoint).exists() else f" ({checkpoint} does not exist either)"
        raise SFTCheckpointError(f"No SFT record {where}{missing}; run `rlinf-embodied sft` "
                                 "with the same config (and run.dir) first.")
    check_family(record, policy_type, checkpoint)
    # the SFT policy directory (a VLA's published-layout checkpoint sits beside it)
    checkpoint = Path(record["_dir"]) / record.get("policy", "policy")
    k = int(episodes or record["gate_episodes"])
    tol = float(record["gate_tolerance"] if tolerance is None else tolerance)
    horizon = getattr(env_cfg, "max_episode_steps", None)
    everything, rescored, recorded_horizon = _recorded_episodes(record, k, horizon)
    # the re-evaluation runs the RL env's tasks (a suite's task_ids may select fewer than the
    # SFT evaluation ran): the recorded side is its trials of those tasks
    tasks = _task_keys(env_cfg)
    sft = {key: ok for key, ok in everything.items() if key[0] in tasks}
    if not sft:
        raise SFTCheckpointError(
            f"The SFT record of {checkpoint} has no trials of the RL env's tasks "
            f"({', '.join(tasks)}; recorded: {', '.join(dict.fromkeys(t for t, _ in everything))}); "
            "set the RL env's env_id / task_ids to tasks the SFT stage was evaluated on.")
    recorded, n = sum(sft.values()) / len(sft), len(sft)
    trials = max(t for _, t in sft) + 1  # per task
    out_dir = Path(out_dir)
    ev = evaluate_checkpoint(checkpoint, env_cfg, out_dir / "gate_eval.json", trials,
                             protocol=record["protocol"],
                             num_processes=env_cfg.num_processes)
    from rlinf_embodied.eval.request import RUN_ENV_KEYS
    from rlinf_embodied.eval.results import ResultsFile

    gate = ResultsFile.load(ev["results"])
    one_task = len({task for task, _ in sft}) < 2  # name the task of a suite's trials
    differing = sorted(e.trial if one_task else f"{e.task}:{e.trial}" for e in gate.episodes
                       if (str(e.task), e.trial) in sft
                       and bool(e.success) != sft[(str(e.task), e.trial)])
    result = {"checkpoint": str(checkpoint), "recorded": recorded, "measured": ev["rate"],
              "measured_ci95": ev["ci95"], "episodes": n, "tolerance": tol,
              "tasks": [t for t in tasks if any(key[0] == t for key in sft)],
              "passed": ev["rate"] >= recorded - tol, "differing_trials": differing,
              "batch_invariant": bool(gate.header.get("batch_invariant")),
              "horizon": horizon,
              "recorded_horizon": recorded_horizon,
              "recorded_within_horizon": rescored}
    if sampled and result["passed"]:
        # under the greedy re-evaluation's settings, those it took from the SFT record included
        # (given here, so that the evaluation does not print that it took them a second time)
        used = gate.header.get("env_config") or {}
        sp = sampled_success(checkpoint, env_cfg, trials, out_dir / "gate_sampled.json",
                             protocol=record["protocol"],
                             num_processes=env_cfg.num_processes,
                             env_overrides={k: used[k] for k in RUN_ENV_KEYS["maniskill"]
                                            if k in used},
                             policy_overrides=sampling)
        result["sampled"], result["sampled_ci95"] = sp["rate"], sp["ci95"]
        result["sampled_with"] = sp["changed"]
        # mean log-std of a Gaussian head; None (JSON null) for token and flow heads
        result["log_std"] = sp["log_std"] if math.isfinite(sp["log_std"]) else None
    atomic_write_json(out_dir / "gate.json", result)
    verdict = "passed" if result["passed"] else "FAILED"
    subset = (f" of tasks {', '.join(result['tasks'])} (the RL env's; recorded: "
              f"{', '.join(dict.fromkeys(t for t, _ in everything))})" if len(sft) < len(everything)
              else "")
    within = (f" within its first {horizon} steps (of {result['recorded_horizon']})"
              if rescored else "")
    log(f"step-0 gate {verdict}: SFT checkpoint scores {ev['rate']:.2f} on trials 0..{trials - 1}"
        f"{subset} under the RL setup; recorded {recorded:.2f}{within} (tolerance {tol:.2f})")
    if differing:
        log(f"  trials whose success differs from the SFT stage's: {differing}")
    if "sampled" in result:
        spread = ("" if result["log_std"] is None
                  else f"; mean log-std {result['log_std']:.2f}")
        spread += "".join(f"; {k} {v} (the SFT checkpoint's: {sp['saved'][k]})"
                          for k, v in sp["changed"].items())
        log(f"  sampled actions (what RL rollouts take{spread}) "
            f"score {result['sampled']:.2f} on the same trials")
        if result["sampled"] < ev["rate"] - tol:
            fix = ("fit a tighter log-std in BC (bc.fit_log_std, bc.min_log_std)" if spread
                   else "lower policy.temperature or train SFT longer (bc.steps)")
            log("  warning: the sampled actions succeed far less often than the greedy ones, "
                f"so RL sees few successes; {fix}.")
    if not result["passed"]:
        raise GateError(
            f"The SFT checkpoint {checkpoint} scores {ev['rate']:.2f} success under the RL run's "
            f"env settings but {recorded:.2f} at SFT time on the same {n} held-out trials (more "
            f"than {tol:.2f} below). RL from it would start from nothing: check that the RL "
            "config's env (control_mode, max_episode_steps, obs_mode) matches the SFT config, "
            "and that policy.checkpoint points at the SFT checkpoint."
        )
    return result


def gate_for_job(cfg: Any, run_dir: str | Path, log=print) -> dict[str, Any] | None:
    """The gate of a training job: runs when ``cfg.policy.checkpoint`` (or a VLA's
    ``policy.pretrained``) has an SFT record.

    Returns the gate result, or None when the job does not start from an SFT checkpoint.

    Raises:
        GateError: see :func:`check_gate`.
    """
    ckpt = getattr(cfg.policy, "checkpoint", None) or getattr(cfg.policy, "pretrained", None)
    if not ckpt or read_record(ckpt) is None or getattr(cfg.env, "type", None) != "maniskill":
        return None
    return check_gate(ckpt, cfg.env, run_dir, log=log, policy_type=cfg.policy.type,
                      sampling=sampling_of(cfg.policy))


def _with_config(policy, changed: dict[str, Any]):
    """``policy`` rebuilt with config fields ``changed`` and its weights: modules the new config
    adds start fresh, as the RL run's do (π0's Flow-Noise head, which a Flow-SDE checkpoint
    lacks); changing the config in place would leave them out, and the copy would not load.

    Raises:
        ValueError: a weight of ``policy`` that the rebuilt one has no place for."""
    from rlinf_embodied.policies.registry import policy_class

    new = policy_class(policy.config.type)(dataclasses.replace(policy.config, **changed), policy.spec)
    unexpected = new.load_state_dict(policy.state_dict(), strict=False).unexpected_keys
    if unexpected:
        raise ValueError(f"Cannot sample with {changed}: the rebuilt policy has no place for "
                         f"{unexpected[:3]}.")
    return new


def sampled_success(checkpoint: str | Path, env_cfg: Any, trials: int, output: str | Path, *,
                    protocol: str = "maniskill_fair_v1", num_envs: int = 10,
                    num_processes: int = 2, log_std: float | None = None,
                    env_overrides: dict[str, Any] | None = None,
                    policy_overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """``success_once`` of a checkpoint's *sampled* actions (the RL stage's rollouts) on
    held-out trials 0..trials-1, next to which the greedy evaluation can be read.

    RL fine-tuning learns only from what its sampled rollouts reach: a Gaussian head whose
    log-std is wide compared with the cloned actions can score well greedily and never
    succeed when sampling, so PPO sees no success at all. This is
    :func:`evaluate_checkpoint` with ``policy_mode="sample"`` (same protocol, seeds and env
    settings as the greedy evaluation; the noise is seeded by the protocol's ``global_seed``,
    the trial and the query index).

    Args:
        checkpoint: policy directory of :func:`~rlinf_embodied.policies.save_policy`.
        env_cfg: the ManiSkill EnvConfig of the episodes (see :func:`evaluate_checkpoint`).
        trials: trials 0..trials-1 of ``protocol``.
        output: results JSON of the sampled evaluation (no reports are written).
        protocol: evaluation protocol name (``maniskill_fair_v1``: trial i resets with seed
            1_000_000 + i, terminations ignored).
        num_envs: envs stepped together (results do not depend on it: the noise is seeded
            per episode and query).
        num_processes: env pool processes.
        log_std: evaluate a copy of the checkpoint whose Gaussian head's log-std (normalised
            action units) is this value (saved beside ``output``); None keeps the checkpoint's.
        env_overrides: further EnvConfig fields (see :func:`evaluate_checkpoint`).
        policy_overrides: policy config fields to sample with (e.g. ``{"temperature": 1.0}``,
            the RL run's); those the saved config has and that differ are applied to a copy of
            the checkpoint saved beside ``output``, as ``log_std`` is.

    Returns:
        ``{"rate", "ci95" (Wilson 95%), "successes", "episodes", "log_std", "results",
        "changed", "saved"}`` (``log_std``: mean log-std used, NaN for heads without one;
        ``changed``: the ``policy_overrides`` applied; ``saved``: the checkpoint's values of
        the ``policy_overrides`` fields).

    Raises:
        ValueError: ``trials`` < 1.
    """
    import torch

    from rlinf_embodied.policies import load_policy, save_policy

    if trials < 1:
        raise ValueError(f"sampled_success needs trials >= 1 (got {trials}).")
    output = Path(output)
    policy = load_policy(Path(checkpoint), map_location="cpu")
    head_std = getattr(getattr(policy, "action_head", None), "log_std", None)
    saved = {k: getattr(policy.config, k) for k in (policy_overrides or {})
             if hasattr(policy.config, k)}
    changed = {k: v for k, v in (policy_overrides or {}).items() if k in saved and saved[k] != v}
    set_std = log_std is not None and head_std is not None
    if set_std:
        with torch.no_grad():
            head_std.fill_(float(log_std))
    if changed:
        policy = _with_config(policy, changed)
    if changed or set_std:
        checkpoint = output.with_name(f"{output.stem}_policy")
        save_policy(policy, checkpoint)
    ev = evaluate_checkpoint(checkpoint, env_cfg, output, trials, protocol=protocol,
                             num_envs=num_envs, num_processes=num_processes,
                             policy_mode="sample", reports=False, env_overrides=env_overrides)
    return {"rate": ev["rate"], "ci95": ev["ci95"], "successes": ev["successes"],
            "episodes": ev["episodes"], "results": ev["results"], "changed": changed,
            "saved": saved,
            "log_std": float(head_std.detach().mean()) if head_std is not None else float("nan")}
