"""Where a ``--policy`` SOURCE's files are, what kind they are, and their sha256.

Resolution only, no model is built here: :func:`find_checkpoint` picks the ``save_policy``
directory of a checkpoint or training run directory (its ``latest`` or ``best`` checkpoint),
:func:`vla_type` and :func:`choose_unnorm_key` read a published OpenVLA / OpenVLA-OFT /
π0 directory, :func:`hash_files` and :func:`hash_policy` fingerprint what was loaded. :mod:`rlinf_embodied.eval.sources`
builds the policy from them.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
from pathlib import Path
from typing import Any, List, Optional

__all__ = ["PolicySourceError", "hash_files", "hash_policy", "missing_source", "RUN_CHECKPOINTS",
           "check_checkpoint_choice", "find_checkpoint", "vla_type",
           "choose_unnorm_key", "names_callable", "importable_from_cwd", "import_failure",
           "unimportable_module"]


class PolicySourceError(ValueError):
    """``--policy`` does not name a usable policy; the message says what was looked for."""


def hash_files(root: Path) -> str:
    """sha256 over every file below ``root`` (relative path and contents, sorted by path).

    Raises:
        PolicySourceError: if ``root`` holds no files.
    """
    h = hashlib.sha256()
    files = sorted(p for p in Path(root).rglob("*") if p.is_file())
    if not files:
        raise PolicySourceError(f"{root} holds no files to load a policy from.")
    for p in files:
        h.update(str(p.relative_to(root)).encode() + b"\0")
        with open(p, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
    return h.hexdigest()


def hash_policy(checkpoint: Path, config: Any) -> str:
    """sha256 of what a ``save_policy`` checkpoint loads: its own files and, when its config
    names them, the directories of its path fields (``pretrained``, ``tokenizer``: a VLA's
    SFT weights, tokenizer and normalisation statistics, which the checkpoint reads at load).

    A checkpoint that names no such directory outside itself hashes as :func:`hash_files` of
    it (the hash earlier results recorded), so that ``eval --resume`` still matches them.

    Raises:
        PolicySourceError: if ``checkpoint`` holds no files.
    """
    from rlinf_embodied.policies.registry import PATH_FIELDS

    own = hash_files(checkpoint)
    root = Path(checkpoint).resolve()
    extra = []
    for key in PATH_FIELDS:
        value = getattr(config, key, None)
        target = Path(value).expanduser().resolve() if value else None
        if target is not None and target.is_dir() and not target.is_relative_to(root) \
                and any(p.is_file() for p in target.rglob("*")):
            extra.append(f"{key}:{hash_files(target)}")
    if not extra:
        return own
    return hashlib.sha256("\n".join([own, *extra]).encode()).hexdigest()


RUN_CHECKPOINTS = ("latest", "best")
"""Which checkpoint of a training run directory ``--policy`` takes (``--checkpoint``)."""


def check_checkpoint_choice(which: str) -> None:
    """Refuse a ``--checkpoint`` outside :data:`RUN_CHECKPOINTS`.

    Raises:
        PolicySourceError: naming how to evaluate any other checkpoint of a run.
    """
    if which not in RUN_CHECKPOINTS:
        raise PolicySourceError(
            f"--checkpoint must be one of {', '.join(RUN_CHECKPOINTS)} (got {which!r}); for "
            f"another checkpoint pass its directory: --policy RUN/checkpoints/iter_NNNNNN.")


def find_checkpoint(path: Path, which: str = "latest") -> Path:
    """The ``save_policy`` directory (with ``policy.yaml``) that ``path`` designates.

    Accepts the directory itself, a checkpoint directory holding it (or a ``policy/``
    subdirectory), or a run directory: its latest complete checkpoint (``which="latest"``,
    ``checkpoints/latest``) or the one with the best in-training evaluation
    (``which="best"``, ``checkpoints/best``, written at each evaluation whose
    ``success_once`` is at least the best so far).

    Raises:
        PolicySourceError: when none of these is found (lists what was looked for); ``which``
            not in :data:`RUN_CHECKPOINTS`; ``which="best"`` for a path that is no run
            directory or a run without ``checkpoints/best``.
    """
    from rlinf_embodied.policies.registry import CONFIG_FILE

    from rlinf_embodied.checkpoint import checkpoint_problem, latest_checkpoint

    check_checkpoint_choice(which)
    is_run = (path / "checkpoints").is_dir()
    if which == "best":
        best = path / "checkpoints" / "best"
        if not is_run:
            raise PolicySourceError(
                f"--checkpoint best selects a checkpoint of a training run directory, but {path} "
                "has no checkpoints/; pass the run directory, or drop --checkpoint.")
        if not best.is_dir():
            raise PolicySourceError(
                f"The run {path} has no checkpoints/best yet (the run writes it at its "
                "evaluations, every trainer.eval_every iterations); use --checkpoint latest.")
        problem = checkpoint_problem(best)
        if problem is not None:
            raise PolicySourceError(f"{problem}; use --checkpoint latest.")
        candidates: List[Path] = [best, best / "policy"]
        latest = best
    else:
        candidates = [path, path / "policy"]
        latest = latest_checkpoint(path) if is_run else None
        if latest is not None:
            candidates += [latest, latest / "policy"]
    for c in candidates:
        if (c / CONFIG_FILE).is_file():
            return c
    if (path / "config.yaml").is_file() and not is_run:
        advice = ("It is a training run that stopped before its first save (config.yaml, no "
                  "checkpoints/), so there is nothing to evaluate: train it again "
                  "(`rlinf-embodied train CONFIG`) or pass another run.")
    else:
        advice = ("Pass a training run directory, a checkpoint directory, a published "
                  "OpenVLA/OFT directory (config.json), 'random' or module:function.")
    raise PolicySourceError(
        f"No policy checkpoint found at {path}: looked for {CONFIG_FILE} in "
        + ", ".join(str(c) for c in candidates)
        + (" (the run has no complete checkpoint yet)" if is_run and latest is None else "")
        + f". {advice}"
    )


def vla_type(path: Path) -> str:
    """The policy type of a published VLA directory: ``pi0`` / ``pi05`` for π0 checkpoints in
    LeRobot's layout (``config.json`` ``type``) or openpi's (``action_horizon`` and
    ``paligemma_variant``; π0.5 has ``time_mlp_in`` weights), ``openvla_oft`` when the
    directory has OFT head files, else ``openvla``."""
    import json

    try:
        cfg = json.loads((path / "config.json").read_text())
    except (OSError, ValueError):
        cfg = {}
    if cfg.get("type") in ("pi0", "pi05"):
        return cfg["type"]
    if "action_horizon" in cfg and "paligemma_variant" in cfg:
        from safetensors import safe_open

        with safe_open(str(path / "model.safetensors"), "pt") as f:
            return "pi05" if "time_mlp_in.weight" in f.keys() else "pi0"
    oft_markers = ("action_head--", "proprio_projector--", "noisy_action_projector--")
    if any(p.name.startswith(oft_markers) for p in path.iterdir()):
        return "openvla_oft"
    return "openvla"


def _norm_stats_keys(path: Path) -> List[str]:
    import json

    for name in ("dataset_statistics.json", "config.json"):
        p = path / name
        if p.is_file():
            try:
                data = json.loads(p.read_text())
            except json.JSONDecodeError:
                continue
            data = data.get("norm_stats", {}) if name == "config.json" else data
            if isinstance(data, dict) and data:
                return sorted(data)
    return []


def choose_unnorm_key(path: Path, candidates: Any, suite: Optional[str]) -> Optional[str]:
    """The un-normalisation key of a published checkpoint for this evaluation.

    ``candidates`` (a template or a list of templates with ``{suite}``) are tried in order, as
    upstream tries ``{suite}`` then ``{suite}_no_noops``; a checkpoint with statistics for one
    dataset only uses that one.

    Returns:
        The key, or None when no template applies and the checkpoint has one dataset.

    Raises:
        PolicySourceError: several datasets and none of the candidates (lists them).
    """
    keys = _norm_stats_keys(path)
    if isinstance(candidates, str):
        candidates = [candidates]
    tried = [c.format(suite=suite) for c in (candidates or []) if suite or "{suite}" not in c]
    for key in tried:
        if key in keys:
            return key
    if len(keys) <= 1:
        return keys[0] if keys else None
    raise PolicySourceError(
        f"{path} has statistics for {keys} but none of {tried or ['(no suite)']}; it was not "
        "fine-tuned on this suite, or pass a checkpoint whose dataset_statistics.json names it."
    )


def names_callable(source: str) -> bool:
    """Whether ``--policy source`` is ``module:function`` (a colon, not a path that exists or
    starts like one)."""
    return (":" in source and not source.startswith((".", "/", "~"))
            and not Path(source).expanduser().exists())


def importable_from_cwd() -> None:
    """Put the working directory on ``sys.path`` (where a ``module:function`` factory lives)."""
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())


def import_failure(source: str, why: str) -> str:
    """The one line for a ``module:function`` whose module cannot be imported."""
    return (f"Cannot import module {source.partition(':')[0]!r} of --policy {source} ({why}); "
            "make it importable from the working directory or PYTHONPATH.")


def unimportable_module(source: str) -> Optional[str]:
    """Why the module of ``--policy module:function`` cannot be imported from the working
    directory or PYTHONPATH, or None. Finds the module without running it (its parent
    packages are imported)."""
    module_name = source.partition(":")[0]
    importable_from_cwd()
    try:
        found = importlib.util.find_spec(module_name) is not None
        why = f"No module named {module_name!r}"
    except (ImportError, ValueError) as e:  # a parent package missing, or an empty name
        found, why = False, str(e)
    return None if found else import_failure(source, why)


def missing_source(source: str) -> Optional[str]:
    """Why ``--policy source`` names nothing on this machine (a path that does not exist and
    is neither ``random`` nor ``module:function``, or a ``module:function`` whose module cannot
    be found), or None. Cheap: ``eval`` asks it before building any env."""
    path = Path(source).expanduser()
    if names_callable(source):
        return unimportable_module(source)
    if source == "random" or path.exists():
        return None
    from rlinf_embodied.config.errors import suggest

    return (f"--policy {source}: no such file or directory (absolute: {path.resolve()})"
            f"{suggest(source, ['random']) or '.'} --policy takes a "
            "training run or checkpoint directory, a published OpenVLA/OFT directory, 'random', "
            "or module:function.")
