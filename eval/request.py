"""What to evaluate: the typed request, its own checks, and the settings it takes from the
policy's training run.

:class:`EvalRequest` is what ``rlinf-embodied eval`` (and the SFT gate) hand to
:func:`~rlinf_embodied.eval.run.evaluate`; :func:`check_request` refuses what is wrong with it
before anything is loaded. When ``--policy`` is a training run, its ``config.yaml`` supplies the
env settings that define the policy's spaces (:func:`run_env_config`,
:func:`run_env_overrides`), unless the request sets them.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from rlinf_embodied.eval.protocols import Protocol
from rlinf_embodied.eval.results import Episode

__all__ = [
    "EvalRequest",
    "EvalError",
    "check_request",
    "all_pairs",
    "Pair",
    "DEFAULT_PROTOCOLS",
    "VIDEO_MODES",
    "is_custom_env",
    "adopt_run_env",
    "run_config",
    "run_env_config",
    "run_max_episode_steps",
    "run_trials_overrides",
    "RUN_TRIAL_ENV_KEYS",
    "RUN_ENV_KEYS",
    "run_env_overrides",
    "overridden_run_settings",
]

DEFAULT_PROTOCOLS = {"libero": "openvla_v1", "maniskill": "maniskill_fair_v1", "gym": "seeded_v1"}
"""Protocol used when ``--protocol`` is not given, per env family."""

VIDEO_MODES = ("none", "failures", "all")
"""``--video`` choices: no MP4s, those of failed episodes, or every episode's."""


class EvalError(ValueError):
    """Invalid evaluation request (unknown suite/task, too many trials, ...); says the fix."""


@dataclass
class EvalRequest:
    """One evaluation, as given on the command line.

    Attributes:
        env: env family, ``libero``, ``maniskill``, ``gym`` or a ``module:Class`` env type; None takes the ``env.type`` of
            the training run ``policy`` is (:class:`EvalError` if it is none).
        policy: ``--policy`` SOURCE (see :mod:`rlinf_embodied.eval.sources`).
        suite: LIBERO suite (``libero_spatial`` ...).
        task: ManiSkill / gymnasium env id (``PushCube-v1``).
        protocol: protocol name; None takes :data:`DEFAULT_PROTOCOLS` of the family.
        tasks: LIBERO task ids of the suite; None evaluates every task.
        trials_per_task: overrides the protocol's count (selects trials 0..n-1).
        num_envs: N, envs run concurrently. Per-episode results do not depend on it (nor on
            ``num_processes``) when ``batch_invariant`` is on and the env runs each env on its
            own and resets it fully (ManiSkill CPU physics, LIBERO with ``hard_reset``, the
            default, gymnasium): the policy then sees each env's row alone and
            sampled actions are seeded per episode and query
            (:func:`~rlinf_embodied.eval.acting.episode_seed`).
        num_processes: env pool processes; None uses min(N, CPU count), 0 runs in-process.
        video: ``none``, ``failures`` or ``all`` (MP4s under ``<output stem>_videos/``).
        output: results JSON path.
        obs_mode: ``rgb``, ``state`` or ``auto`` (``state`` when the policy is known not to
            read images and, outside ManiSkill, no video is requested; ManiSkill films a state
            policy with its human camera).
        max_steps: overrides the protocol's max steps (recorded; changes the protocol id).
        num_settle_steps: overrides the protocol's settle steps (recorded likewise).
        image_size: overrides the protocol's image size (recorded likewise).
        policy_mode: overrides the protocol's ``policy_mode``: ``greedy`` or ``sample``
            (recorded likewise).
        checkpoint: which checkpoint of a training run directory ``policy`` is: ``latest``
            (the newest complete one) or ``best`` (``checkpoints/best``, the best in-training
            evaluation so far).
        policy_type: the policy type the checkpoint must hold (``mlp``, ``openvla_oft`` ...).
        device: torch device of the policy; None = ``cuda`` when available, else ``cpu``.
        batch_invariant: run the policy row by row (a batch of 1 per env, the default), so
            that its float rounding, hence each episode, is the same for every ``num_envs``;
            False runs one batched forward per query (faster for large policies, results then
            depend on ``num_envs`` in the last bits). Recorded in the header.
        reports: write the ``.md`` / ``.png`` / ``.html`` reports at the end.
        env_overrides: extra EnvConfig fields (e.g. ``{"hard_reset": False}``), recorded.
        env_factory: builds the BatchedEnv from the EnvConfig; None uses the env registry's
            ``make_env`` (tests and custom simulators inject their own here).
        progress: called as ``progress(done, total, episode)`` after each finished episode.
        run_trials: evaluate the trials of the in-training evaluation of the training run
            ``policy`` belongs to (:func:`run_trials_overrides`), so that the results pair
            trial by trial with its ``eval/iter_*.json`` records (ManiSkill and gymnasium
            runs).
    """

    env: Optional[str]
    policy: str
    suite: Optional[str] = None
    task: Optional[str] = None
    protocol: Optional[str] = None
    tasks: Optional[List[int]] = None
    trials_per_task: Optional[int] = None
    num_envs: int = 8
    num_processes: Optional[int] = None
    video: str = "none"
    output: str = "results.json"
    obs_mode: str = "auto"
    max_steps: Optional[int] = None
    num_settle_steps: Optional[int] = None
    image_size: Optional[int] = None
    policy_mode: Optional[str] = None
    checkpoint: str = "latest"
    policy_type: Optional[str] = None
    device: Optional[str] = None
    batch_invariant: bool = True
    reports: bool = True
    env_overrides: Dict[str, Any] = field(default_factory=dict)
    env_factory: Optional[Callable[[Any], Any]] = None
    progress: Optional[Callable[[int, int, Episode], None]] = None
    run_trials: bool = False


Pair = Tuple[Any, int]
"""A (task, trial) pair: LIBERO task id (int) or env id (str), and the trial index."""


def all_pairs(tasks: Sequence[Any], trials: int) -> List[Pair]:
    """Every (task, trial) pair, task-major: ``[(t0, 0), (t0, 1), ..., (t1, 0), ...]``."""
    return [(t, i) for t in tasks for i in range(trials)]


def check_request(req: EvalRequest) -> None:
    """Check the request's own arguments, before any policy or env is loaded: ``video`` is one
    of :data:`VIDEO_MODES`, ``num_envs`` >= 1, ``device`` a CUDA device this machine has or
    the CPU, and the results file can be written (:func:`_check_writable`).

    Raises:
        EvalError: naming the flag, the value and the valid choices.
    """
    if req.video not in VIDEO_MODES:
        raise EvalError(f"--video must be one of {', '.join(VIDEO_MODES)} (got {req.video!r}).")
    if req.num_envs < 1:
        raise EvalError(f"--num-envs must be >= 1 (got {req.num_envs}).")
    if req.num_processes is not None and req.num_processes < 0:
        raise EvalError(f"--num-processes must be >= 0 (got {req.num_processes}; 0 runs the envs "
                        "in this process, leave it out for min(--num-envs, CPU count)).")
    if req.device is not None:
        _check_device(req.device)
    _check_writable(Path(req.output))


def _check_device(device: str) -> None:
    """``--device``: ``cpu``, or ``cuda`` / ``cuda:I`` on a machine with that CUDA device.

    Raises:
        EvalError: another device type, or a CUDA device this machine does not have.
    """
    import torch

    leave_out = "leave --device out (cuda when there is one, else cpu)"
    try:
        dev = torch.device(device)
    except (RuntimeError, ValueError):
        dev = None
    if dev is None or dev.type not in ("cpu", "cuda"):
        raise EvalError(f"--device must be cpu, cuda or cuda:I (got {device!r}); {leave_out}.")
    if dev.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0 or (dev.index or 0) >= count:
            raise EvalError(f"--device {device}: this machine has {count} CUDA device(s) "
                            f"(torch.cuda); pass --device cpu or {leave_out}.")


def _check_writable(output: Path) -> None:
    """Fail before any env starts if the results file's folder cannot be written (it is made).

    Raises:
        EvalError: naming the path and the reason.
    """
    from rlinf_embodied.checkpoint import unwritable

    if output.is_dir():
        raise EvalError(f"--output {output} is a folder; pass the results file's path, e.g. "
                        f"--output {output / 'results.json'}.")
    if output.suffix.lower() != ".json":  # its reports (.md, .png, .html) are named after it
        raise EvalError(f"--output {output}: the results file is JSON; name a .json file, e.g. "
                        f"--output {output.with_suffix('.json')}.")
    why = unwritable(output.parent)
    if why:
        raise EvalError(f"Cannot write the results file {output} ({why}); pass --output PATH in "
                        "a writable folder.")


# --------------------------------------------------------------------------------------------
# Settings taken from the policy's training run
# --------------------------------------------------------------------------------------------
def run_config(source: str) -> Tuple[Dict[str, Any], Optional[Path]]:
    """The ``config.yaml`` of the training run a ``--policy`` directory belongs to (as a dict),
    and that file's path.

    Looks in the directory and up to three levels above it (a run, ``checkpoints/iter_*`` or
    ``checkpoints/iter_*/policy``); an SFT stage's ``sft_record.json`` (``<run>/sft/policy``)
    counts as one, its ``env`` section being the SFT env's; ``({}, None)`` when there is none
    (or it does not parse).
    """
    path = Path(source)
    if not path.is_dir():
        return {}, None
    import yaml

    for d in [path, *list(path.resolve().parents)[:3]]:
        cfg = d / "config.yaml"
        record = d / "sft_record.json"
        if record.is_file() and not cfg.is_file():
            try:
                data = yaml.safe_load(record.read_text()) or {}  # JSON is YAML
            except (OSError, yaml.YAMLError):
                return {}, None
            return (data if isinstance(data, dict) else {}), record
        if cfg.is_file():
            try:
                data = yaml.safe_load(cfg.read_text()) or {}
            except (OSError, yaml.YAMLError):
                return {}, None
            return (data if isinstance(data, dict) else {}), cfg
    return {}, None


def run_env_config(source: str) -> Tuple[Dict[str, Any], Optional[Path]]:
    """The ``env`` section of :func:`run_config` and the config file's path (``({}, None)``
    without one)."""
    data, cfg = run_config(source)
    env = data.get("env")
    return (dict(env) if isinstance(env, dict) else {}), cfg


RUN_TRIAL_ENV_KEYS = ("reward_mode", "success_hold_steps", "task_description")
"""Env settings of a run that its in-training evaluation used and that ``--run-trials`` takes
too (beside :data:`RUN_ENV_KEYS` and ``max_episode_steps``): they change returns, success or a
VLA's prompt, not the policy's spaces."""


def run_trials_overrides(req: EvalRequest) -> Dict[str, Any]:
    """Protocol overrides that make an evaluation run the trials of the in-training
    evaluation of the run ``req.policy`` belongs to (``--run-trials``).

    The run's evaluation (:meth:`~rlinf_embodied.workers.env_worker.EnvWorker.evaluate`)
    resets trial j with seed ``eval.seed_offset + run.seed * 1000 + j``
    (:meth:`~rlinf_embodied.config.EvalConfig.trial_seed`), runs fixed-length episodes
    (terminations ignored), greedy unless ``eval.greedy`` is false, sampled rows seeded from
    ``run.seed``; the trial count is the ``episodes`` of its ``eval/latest.json`` (else
    ``eval.num_episodes``). So: ``env_seed``, ``global_seed``, ``ignore_terminations``,
    and, unless the request sets them, ``policy_mode`` and ``trials_per_task``.

    Raises:
        EvalError: ``req.policy`` is no training run (or a checkpoint inside one), the run
            recorded no in-training evaluation, or it is a LIBERO one (ManiSkill, gymnasium and user env class (``module:Class``) runs
            are reproduced), whose in-training evaluation picks stored initial states by seed
            while its protocols take state i for trial i.
    """
    data, path = run_config(req.policy)
    if path is None:
        raise EvalError(f"--run-trials needs --policy to be a training run directory (or a "
                        f"checkpoint inside one) with its config.yaml; {req.policy} is none.")
    if not any((path.parent / "eval").glob("iter_*.json")):
        raise EvalError(f"--run-trials reproduces a training run's in-training evaluation, and "
                        f"{path.parent} recorded none (no eval/iter_*.json; an SFT checkpoint or "
                        "a run with trainer.eval_every 0); drop --run-trials to evaluate under the "
                        "protocol.")
    env = data.get("env") if isinstance(data.get("env"), dict) else {}
    kind = env.get("type", req.env)
    if kind not in ("maniskill", "gym") and not is_custom_env(kind):
        raise EvalError(
            f"--run-trials reproduces the in-training evaluation of ManiSkill, gymnasium and "
            f"user env class runs; {path.parent} is a {kind} run (a LIBERO run's in-training evaluation picks "
            "stored initial states by seed, the LIBERO protocols take state i for trial i). "
            "Drop --run-trials to evaluate under the protocol.")
    from dataclasses import fields

    from rlinf_embodied.config import EvalConfig

    section = data.get("eval") if isinstance(data.get("eval"), dict) else {}
    ev = EvalConfig(**{f.name: section[f.name] for f in fields(EvalConfig) if f.name in section})
    run_seed = int((data.get("run") or {}).get("seed", 0))
    out: Dict[str, Any] = {"env_seed": ev.trial_seed(run_seed), "global_seed": run_seed,
                           "ignore_terminations": True}
    if req.policy_mode is None:
        out["policy_mode"] = "greedy" if ev.greedy else "sample"
    if req.trials_per_task is None:
        out["trials_per_task"] = _recorded_episodes(path.parent) or ev.num_episodes
    return out


def _recorded_episodes(run_dir: Path) -> Optional[int]:
    """``episodes`` of the run's newest in-training evaluation record, or None."""
    import json

    try:
        n = json.loads((run_dir / "eval" / "latest.json").read_text()).get("episodes")
    except (OSError, ValueError):
        return None
    return int(n) if isinstance(n, int) and n > 0 else None


def run_max_episode_steps(run_env: Dict[str, Any]) -> Optional[int]:
    """``max_episode_steps`` of a run's env section (:func:`run_env_config`); None when it sets
    no limit."""
    value = run_env.get("max_episode_steps")
    return int(value) if isinstance(value, int) and value > 0 else None


RUN_ENV_KEYS = {"maniskill": ("control_mode", "sensor_size"),
                "gym": ("kwargs", "state_keys", "image_keys"), "libero": ()}
"""Env settings that define the policy's observation and action spaces, taken from the training
run's config when ``--policy`` is a run (the protocol does not fix them: ManiSkill's fair
evaluation uses the env's defaults, which a run may have changed, e.g. ``pd_ee_delta_pose``
for a 7-dim VLA; a gym run's ``state_keys`` fix the order of its state vector). LIBERO takes
none: its protocol fixes the image size. The gym settings belong to one env, so they are taken
only when ``--task`` is the run's ``env.env_id``."""


CUSTOM_ENV_RUN_KEYS_SKIPPED = ("type", "env_id", "vectorization")
"""A user's env type (``module:Class``) takes the run's settings of its own config class's
fields, except these and every field of the base ``EnvConfig`` (env counts, seeds, step limit,
episode end, video, timeouts: what the evaluation sets)."""


def is_custom_env(env: Optional[str]) -> bool:
    """Whether ``--env`` / a run's ``env.type`` names a user's env class (``module:Class``)."""
    return bool(env) and ":" in str(env)


def _run_settings(req: EvalRequest, run_env: Dict[str, Any]) -> Dict[str, Any]:
    """The :data:`RUN_ENV_KEYS` settings the policy's run set (empty ones left out; with
    ``run_trials`` the :data:`RUN_TRIAL_ENV_KEYS` too), when they belong to the evaluated env:
    the same family, and for gym the same env id. A user's env type takes all its run settings
    but :data:`CUSTOM_ENV_RUN_KEYS_SKIPPED`."""
    if run_env.get("type", req.env) != req.env:
        return {}
    if (req.env == "gym" or is_custom_env(req.env)) and run_env.get("env_id", req.task) != req.task:
        return {}
    if is_custom_env(req.env):
        from dataclasses import fields

        from rlinf_embodied.config import EnvConfig

        base = {f.name for f in fields(EnvConfig)}
        keys = tuple(k for k in run_env if k not in CUSTOM_ENV_RUN_KEYS_SKIPPED and k not in base)
    else:
        keys = RUN_ENV_KEYS.get(req.env, ())
    keys += RUN_TRIAL_ENV_KEYS if req.run_trials else ()
    return {k: run_env[k] for k in keys if run_env.get(k) not in (None, "", {}, [])}


def _refuse_no_checkpoint(source: str) -> None:
    """Raise :class:`EvalError` with :func:`~rlinf_embodied.eval.policy_files.find_checkpoint`'s
    message when ``--policy source`` is a directory holding no policy (no checkpoint, run or
    published VLA layout): that, not a missing ``--env``, is what to fix."""
    from rlinf_embodied.eval.policy_files import PolicySourceError, find_checkpoint

    path = Path(source).expanduser()
    if not path.is_dir() or (path / "config.json").is_file():  # a published VLA directory
        return
    try:
        find_checkpoint(path)
    except PolicySourceError as e:
        raise EvalError(str(e)) from None


def _suite_types() -> Dict[str, set]:
    """Each suite the env registry names (``libero/libero_spatial``, ``maniskill/maniskill_lang3``:
    ``envs list``) -> the env types that serve it."""
    from rlinf_embodied.envs.registry import env_entry, env_ids

    out: Dict[str, set] = {}
    for i in env_ids():
        d = env_entry(i).defaults
        if d.get("suite"):
            out.setdefault(d["suite"], set()).add(d["type"])
    return out


def adopt_run_env(req: EvalRequest, run_env: Dict[str, Any], run_cfg: Any,
                  families: Sequence[str], log: Optional[Callable[[str], None]] = None) -> EvalRequest:
    """The request with what it leaves unset taken from the policy's training run (its env
    section ``run_env``, read from ``run_cfg``): the env type (one of ``families`` or a
    ``module:Class``), a ManiSkill suite with the tasks
    the run trained on (``env.task_ids``; an explicit ``--suite`` evaluates every task), or
    the env id. Each adopted value is logged (default: standard error).

    Raises:
        EvalError: no ``--env`` and the policy is no training run of a known env type.
    """
    import sys

    log = log or (lambda line: print(line, file=sys.stderr))
    if req.env is None:  # a training run names its own env type
        if run_env.get("type") not in families and not is_custom_env(run_env.get("type")):
            from rlinf_embodied.eval.policy_files import missing_source

            if not run_env and (why := missing_source(req.policy)) is not None:
                raise EvalError(why)
            pipeline = Path(req.policy)
            if not run_env and ((pipeline / "rl").is_dir() or (pipeline / "sft" / "policy").is_dir()):
                raise EvalError(f"--policy {req.policy} is an SFT -> RL pipeline's directory; "
                                f"give its RL run (--policy {pipeline / 'rl'}) or its SFT "
                                f"checkpoint (--policy {pipeline / 'sft' / 'policy'}).")
            suites = _suite_types()
            if req.suite is not None and req.suite not in suites:
                from rlinf_embodied.config.errors import suggest

                known = sorted(suites)
                raise EvalError(f"Unknown --suite {req.suite!r}{suggest(req.suite, known) or '.'} "
                                f"Registered suites: {', '.join(known)} (`envs list`).")
            types = suites.get(req.suite, set())
            suite_env = next(iter(types)) if len(types) == 1 else None
            if suite_env is None:
                _refuse_no_checkpoint(req.policy)  # a directory holding no policy: say that first
                raise EvalError("--env is required (e.g. --env maniskill --task PushCube-v1), "
                                "unless --policy is a training run or --suite names a suite.")
            log(f"eval: --env {suite_env} (the env of --suite {req.suite}).")
            req = replace(req, env=suite_env)
        else:
            suites = _suite_types()
            served = suites.get(req.suite) if req.suite is not None else None
            if served and run_env["type"] not in served:
                own = sorted(k for k, v in suites.items() if run_env["type"] in v)
                raise EvalError(
                    f"--suite {req.suite} is a {'/'.join(sorted(served))} suite, but the policy's run "
                    f"({run_cfg}) trained on {run_env['type']}; pass one of its suites "
                    f"({', '.join(own) or 'none registered'}) or drop --suite, or add --env "
                    f"{sorted(served)[0]} to evaluate it there anyway.")
            log(f"eval: --env {run_env['type']} (the env type of the policy's run, {run_cfg}).")
            req = replace(req, env=str(run_env["type"]))
    run_type = run_env.get("type")
    if (req.task is None and req.suite is None and run_type in families and run_type != req.env
            and req.env in families):  # `--env maniskill` for a gym run said "needs --task"
        raise EvalError(f"--env {req.env}, but the policy's run trained on --env {run_type} "
                        f"({run_cfg}); leave out --env to evaluate it on its run's env.")
    if (req.env in ("maniskill", "libero") and req.suite is None and req.task is None and run_env.get("suite")
            and run_env.get("type", req.env) == req.env):
        log(f"eval: --suite {run_env['suite']} (the suite of the policy's run, {run_cfg}).")
        req = replace(req, suite=str(run_env["suite"]))
        ids = run_env.get("task_ids")
        if req.tasks is None and isinstance(ids, list) and ids:
            log(f"eval: --tasks {','.join(map(str, ids))} (the tasks the policy's run trained "
                f"on; --suite {run_env['suite']} evaluates every task).")
            req = replace(req, tasks=[int(i) for i in ids])
    if (req.task is None and req.suite is None
            and (req.env in ("gym", "maniskill") or is_custom_env(req.env))
            and run_env.get("env_id") and run_env.get("type", req.env) == req.env):
        log(f"eval: --task {run_env['env_id']} (the env_id of the policy's run, {run_cfg}).")
        req = replace(req, task=str(run_env["env_id"]))
    return req


def run_env_overrides(req: EvalRequest, protocol: Protocol, run_env: Dict[str, Any]) -> Dict[str, Any]:
    """The run's settings (:func:`_run_settings` of its env section ``run_env``) that the
    request does not set (``env_overrides``; ``--image-size`` or a protocol image size for
    ``sensor_size``)."""
    return {k: v for k, v in _run_settings(req, run_env).items() if k not in req.env_overrides
            and not (k == "sensor_size" and protocol.image_size is not None)}


def overridden_run_settings(req: EvalRequest, run_env: Dict[str, Any]) -> Dict[str, Any]:
    """The ``--env-override`` values that replace a different setting of the policy's run
    (e.g. a gym ``state_keys`` in another order, which permutes the policy's inputs)."""
    return {k: req.env_overrides[k] for k, v in _run_settings(req, run_env).items()
            if k in req.env_overrides and req.env_overrides[k] != v}
