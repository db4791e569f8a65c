"""The results file of an evaluation: header, one record per episode, summary; resumable.

Layout (JSON, written atomically after every finished batch of episodes)::

    {
      "format": "rlinf-embodied-eval/1",
      "header": {protocol, seeds, versions, policy source and sha256, ...},
      "summary": {"per_task": {...}, "overall": {...}},   # recomputed on every write
      "episodes": [{"task": 0, "trial": 3, "success": true, "steps": 97,
                    "error": null, "video": "videos/task00_trial003.mp4", ...}, ...]
    }

An interrupted evaluation resumes from this file: the (task, trial) pairs it already holds are
not run again, provided the header says the same protocol, env and policy were used.
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Iterable, List, Optional, Set, Tuple, Union

from rlinf_embodied.eval.stats import mean_interval, wilson_interval

from rlinf_embodied.checkpoint import atomic_write_text

__all__ = [
    "FORMAT",
    "Episode",
    "ResultsFile",
    "ResultsError",
    "summarize",
    "RESUME_KEYS",
    "env_config_differences",
]

FORMAT = "rlinf-embodied-eval/1"

TaskKey = Union[int, str]

RESUME_KEYS = ("env", "suite", "protocol.fingerprint", "protocol.name", "policy.sha256")
"""Header entries that must agree for a run to resume (append to) an existing results file."""


TASK_ENV_SETTINGS = ("kwargs",)
"""``env_config`` fields that change the task itself (a gym env's constructor arguments: e.g. a
goal radius or a speed), so results that differ in them are refused like another env id."""

RUN_ONLY_ENV_SETTINGS = frozenset({
    "num_envs", "num_processes", "step_timeout_s", "reset_timeout_s", "startup_timeout_s",
    "start_method", "threads_per_process", "video", "video_dir", "render_images", "vectorization",
    "autoreset_mode", "task_ids", "reward_mode"})
"""``env_config`` fields that change how an evaluation runs, not what any episode does
(``task_ids``: the LIBERO tasks its envs are first built for; every episode resets to its own;
``reward_mode``: success, episode ends and steps do not depend on the reward, and results
record no return, so an SFT evaluation compares with an RL run's whatever reward it trained on)."""


def env_config_differences(a: Optional[Dict[str, Any]], b: Optional[Dict[str, Any]]) -> Tuple[List[str], List[str]]:
    """The ``env_config`` fields in which two results' headers differ, as ``"key: A vs B"``:
    (those that change the task, :data:`TASK_ENV_SETTINGS`; the others, e.g. ``state_keys``,
    ``control_mode`` or ``sensor_size``, leaving out :data:`RUN_ONLY_ENV_SETTINGS`). Results
    written before headers recorded ``env_config`` (None) differ in nothing. A missing field,
    None and an empty list or mapping are the same setting (env types write ``kwargs`` as None
    or ``{}``)."""
    if not isinstance(a, dict) or not isinstance(b, dict):
        return [], []
    task, setup = [], []
    for key in sorted(set(a) | set(b)):
        va, vb = _unset_is_none(a.get(key)), _unset_is_none(b.get(key))
        if key in RUN_ONLY_ENV_SETTINGS or va == vb:
            continue
        (task if key in TASK_ENV_SETTINGS else setup).append(f"{key}: {a.get(key)!r} vs {b.get(key)!r}")
    return task, setup


def _unset_is_none(value: Any) -> Any:
    return None if isinstance(value, (dict, list, tuple)) and len(value) == 0 else value


class ResultsError(ValueError):
    """A results file is missing, unreadable or belongs to another evaluation."""


@dataclass
class Episode:
    """One finished evaluation episode.

    Attributes:
        task: task id within the suite (LIBERO, int) or env id (ManiSkill, str).
        trial: trial index; LIBERO trial i starts from stored initial state i.
        success: LIBERO: success at the first done; ManiSkill fair evaluation: success_once.
        steps: policy steps executed (env steps after settling).
        error: ``"ExceptionType: message"`` when the episode raised (then ``success`` is
            False), else None.
        video: path of the episode's MP4 relative to the results file, or None.
        success_at_end: ManiSkill fair evaluation: success at the last step; None for LIBERO.
        instruction: the task's language instruction (or env id).
        wall_s: seconds from reset to the end of the episode (shared with concurrent envs).
        episode_return: sum of the env's rewards over the episode (the score of envs without
            a success signal, e.g. CartPole, Pendulum).
        queries: policy queries (``act`` calls) of the episode.
        action_chunk: K, actions the policy returned per query.
        open_loop_steps: actions of each chunk executed before the next query (K: the whole
            chunk, open loop; the last chunk stops at the episode's end).
        head: how the policy decoded actions (``l1_regression``, ``parallel_tokens``, ...).
        success_step: env steps elapsed when success was first seen, after the query (the
            step, or the chunk of K run open loop) in which it first held: the exact step where
            an episode ends at its first success (a chunk stops at the first done), else the
            end of that chunk; None for an episode without success and in results written
            before it was recorded. Success came within the first H steps exactly when
            ``success_step <= H``, for H a multiple of K in the second case (the step-0 gate
            scores the SFT evaluation at a shorter RL horizon, rollout_steps x K, this way).
    """

    task: TaskKey
    trial: int
    success: bool
    steps: int
    error: Optional[str] = None
    video: Optional[str] = None
    success_at_end: Optional[bool] = None
    instruction: Optional[str] = None
    wall_s: float = 0.0
    episode_return: Optional[float] = None
    queries: Optional[int] = None
    action_chunk: Optional[int] = None
    open_loop_steps: Optional[int] = None
    head: Optional[str] = None
    success_step: Optional[int] = None

    @property
    def key(self) -> Tuple[TaskKey, int]:
        """The (task, trial) pair."""
        return (self.task, self.trial)

    def to_dict(self) -> Dict[str, Any]:
        """JSON-ready dict with every field."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: Dict[str, Any]) -> "Episode":
        """Inverse of :meth:`to_dict`; unknown keys are ignored (newer writers)."""
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})


def _task_order(task: TaskKey) -> Tuple[int, Any]:
    return (0, task) if isinstance(task, int) else (1, str(task))


def summarize(episodes: Iterable[Episode]) -> Dict[str, Any]:
    """Per-task success rates with Wilson 95% intervals, and the suite averages.

    Returns:
        ``{"per_task": {str(task): {...}}, "overall": {...}}``. Each entry has ``episodes``,
        ``successes``, ``rate``, ``ci95`` ([low, high]), ``errors`` and, when episodes report
        it, ``success_at_end_rate``; ``mean_return`` and ``return_ci95`` (Student t) when
        episodes record returns. ``overall`` adds ``task_mean`` (mean of per-task rates,
        the "average" of published tables) beside the pooled ``rate``.
    """
    by_task: Dict[TaskKey, List[Episode]] = {}
    for ep in episodes:
        by_task.setdefault(ep.task, []).append(ep)
    per_task: Dict[str, Any] = {}
    for task in sorted(by_task, key=_task_order):
        per_task[str(task)] = _rate_entry(by_task[task])
        per_task[str(task)]["task"] = task
        per_task[str(task)]["instruction"] = next(
            (e.instruction for e in by_task[task] if e.instruction), None
        )
    everything = [e for eps in by_task.values() for e in eps]
    overall = _rate_entry(everything)
    rates = [v["rate"] for v in per_task.values()]
    overall["task_mean"] = sum(rates) / len(rates) if rates else 0.0
    overall["tasks"] = len(per_task)
    return {"per_task": per_task, "overall": overall}


def _rate_entry(eps: List[Episode]) -> Dict[str, Any]:
    n = len(eps)
    k = sum(bool(e.success) for e in eps)
    low, high = wilson_interval(k, n)
    entry: Dict[str, Any] = {
        "episodes": n,
        "successes": k,
        "rate": k / n if n else 0.0,
        "ci95": [low, high],
        "errors": sum(e.error is not None for e in eps),
        "mean_steps": sum(e.steps for e in eps) / n if n else 0.0,
    }
    returns = [float(e.episode_return) for e in eps if e.episode_return is not None]
    if returns:
        mean, low, high = mean_interval(returns)
        entry["mean_return"] = mean
        entry["return_ci95"] = [low, high]
    at_end = [e.success_at_end for e in eps if e.success_at_end is not None]
    if at_end:
        entry["success_at_end_rate"] = sum(at_end) / len(at_end)
        entry["success_at_end_ci95"] = list(wilson_interval(sum(at_end), len(at_end)))
    return entry


def _get(d: Dict[str, Any], dotted: str) -> Any:
    for part in dotted.split("."):
        if not isinstance(d, dict):
            return None
        d = d.get(part)
    return d


class ResultsFile:
    """An evaluation's results on disk: load, resume, append episodes, save atomically.

    Args:
        path: the JSON file.
        header: the evaluation's header (see :mod:`rlinf_embodied.eval.run`).
        episodes: episodes recorded so far.
    """

    def __init__(self, path: Union[str, os.PathLike], header: Dict[str, Any],
                 episodes: Optional[List[Episode]] = None):
        self.path = Path(path)
        self.header = header
        self.episodes: List[Episode] = list(episodes or [])

    # -- reading ------------------------------------------------------------------------------
    @classmethod
    def load(cls, path: Union[str, os.PathLike]) -> "ResultsFile":
        """Read a results file.

        Raises:
            ResultsError: missing file, invalid JSON, or not an rlinf-embodied results file;
                the message says which and what to do.
        """
        p = Path(path)
        if p.is_dir():
            raise ResultsError(f"Results file {p} is a directory; pass the results .json that "
                               "an `rlinf-embodied eval` run wrote (its --output).")
        if not p.is_file():
            raise ResultsError(
                f"Results file {p} does not exist (absolute: {p.resolve()}); pass the --output "
                "of an `rlinf-embodied eval` run."
            )
        try:
            data = json.loads(p.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            reason = e.reason if isinstance(e, UnicodeDecodeError) else e
            raise ResultsError(
                f"Results file {p} is not JSON ({reason}), so no `rlinf-embodied eval` run wrote "
                "it (eval writes atomically; the .md/.png/.html beside its results .json are "
                "reports): pass the results .json."
            ) from None
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            if isinstance(data, dict) and "iteration" in data and "trials" in data:
                run = p.parent.parent if p.parent.name == "eval" else Path("RUN")
                raise ResultsError(
                    f"{p} is a training run's in-training evaluation (iteration "
                    f"{data['iteration']}), not an `eval` results file; to compare that run, "
                    f"evaluate it into one: rlinf-embodied eval --policy {run} --run-trials "
                    f"--output RESULTS.json.")
            found = data.get("format") if isinstance(data, dict) else None
            what = (f"format {found!r}, expected {FORMAT!r}" if found is not None else
                    f"no \"format\": {FORMAT!r} field")
            raise ResultsError(
                f"{p} is not an rlinf-embodied results file ({what}); pass the --output of an "
                "`rlinf-embodied eval` run."
            )
        eps = [Episode.from_dict(d) for d in data.get("episodes", [])]
        return cls(p, data.get("header", {}), eps)

    @classmethod
    def load_to_resume(cls, path: Union[str, os.PathLike]) -> "ResultsFile":
        """:meth:`load` of an existing ``--output`` that an evaluation would resume.

        Raises:
            ResultsError: as :meth:`load`, adding that deleting it or another ``--output``
                starts afresh.
        """
        try:
            return cls.load(path)
        except ResultsError as e:
            raise ResultsError(f"{e} To evaluate into {path}, delete it or pass another "
                               "--output.") from None

    @classmethod
    def open_for_run(cls, path: Union[str, os.PathLike], header: Dict[str, Any]) -> "ResultsFile":
        """The results file a run appends to: a new one, or the existing one to resume.

        Raises:
            ResultsError: the existing file was written by a different evaluation (another
                protocol, env, suite, policy or env setting, :func:`env_config_differences`);
                the message names the differing entries.
        """
        p = Path(path)
        if not p.exists():
            return cls(p, header)
        old = cls.load_to_resume(p)
        diffs = [
            f"{k}: {_get(old.header, k)!r} in the file vs {_get(header, k)!r} now"
            for k in RESUME_KEYS
            if _get(old.header, k) != _get(header, k)
        ]
        task, setup = env_config_differences(old.header.get("env_config"), header.get("env_config"))
        diffs += [f"env_config {d.replace(' vs ', ' in the file vs ', 1)} now" for d in task + setup]
        if diffs:
            raise ResultsError(
                f"Cannot resume {p}: it holds results of a different evaluation ("
                + "; ".join(diffs)
                + "). Pass another --output, or delete the file to start over."
            )
        merged = dict(header)
        merged["started_at"] = old.header.get("started_at", header.get("started_at"))
        merged["resumed_at"] = list(old.header.get("resumed_at", [])) + [header.get("started_at")]
        return cls(p, merged, old.episodes)

    # -- bookkeeping ----------------------------------------------------------------------------
    def done_pairs(self) -> Set[Tuple[TaskKey, int]]:
        """(task, trial) pairs with a recorded episode."""
        return {e.key for e in self.episodes}

    def add(self, episodes: Iterable[Episode]) -> None:
        """Record finished episodes and rewrite the file atomically.

        Raises:
            ResultsError: if a (task, trial) pair is recorded twice (a scheduling bug).
        """
        done = self.done_pairs()
        new = list(episodes)
        for e in new:
            if e.key in done:
                raise ResultsError(f"Episode (task={e.task}, trial={e.trial}) is already recorded.")
            done.add(e.key)
        self.episodes.extend(new)
        self.save()

    def summary(self) -> Dict[str, Any]:
        """:func:`summarize` of the recorded episodes."""
        return summarize(self.episodes)

    def to_dict(self) -> Dict[str, Any]:
        """The JSON document (episodes sorted by task, then trial)."""
        eps = sorted(self.episodes, key=lambda e: (_task_order(e.task), e.trial))
        return {
            "format": FORMAT,
            "header": self.header,
            "summary": summarize(eps),
            "episodes": [e.to_dict() for e in eps],
        }

    def save(self) -> Path:
        """Write the file atomically (temporary file in the same directory, then rename).

        Header and summary are indented; each episode is one line, so the file stays readable
        and diffable at 500 episodes.
        """
        doc = self.to_dict()
        head = {k: v for k, v in doc.items() if k != "episodes"}
        text = json.dumps(head, indent=2, default=str)[:-2]  # drop the closing "\n}"
        eps = ",\n    ".join(json.dumps(e, default=str) for e in doc["episodes"])
        text += ',\n  "episodes": [\n    ' + eps + "\n  ]\n}\n" if eps else ',\n  "episodes": []\n}\n'
        return atomic_write_text(self.path, text)
