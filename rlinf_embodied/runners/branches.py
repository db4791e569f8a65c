"""What a resumed run sets aside: the records that iterations after its checkpoint wrote.

A run resumed from checkpoint ``iter_N`` while the run directory holds records of later
iterations (the run went on past its last checkpoint before a crash or a kill; a damaged newest
checkpoint was skipped; an older checkpoint was named) trains those iterations again. Their old
records would otherwise mix two histories: ``metrics.jsonl`` rows whose ``time_s`` jumps back,
two curves in ``curves.png``, an ``eval/latest.json`` and a ``checkpoints/best`` of the
abandoned iterations. :func:`set_aside_after` moves them, unchanged, to
``RUN/abandoned/after_iter_N_<time>/`` (nothing is deleted) before the resumed run logs.
Checkpoints stay where they are (the newest complete one is the resumed one, or a damaged
one that loading skips).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import List

from rlinf_embodied.checkpoint import atomic_write_text
from rlinf_embodied.metrics import parse_row

__all__ = ["set_aside_after"]


def _iteration_of(path: Path) -> int | None:
    """The ``iteration`` of a JSON record file (eval record, runner state), None if unreadable."""
    try:
        value = json.loads(path.read_text()).get("iteration")
    except (OSError, ValueError, AttributeError):
        return None
    return value if isinstance(value, int) else None


def set_aside_after(run_dir: str | os.PathLike, iteration: int) -> List[str]:
    """Move the records of iterations after ``iteration`` out of ``run_dir``.

    Moved to ``run_dir/abandoned/after_iter_<N>_<YYYYmmdd-HHMMSS>/``: the ``metrics.jsonl`` rows
    (iterations and events) with ``iteration`` > N and any unparseable row (a line cut by a
    kill), as ``metrics.jsonl`` there (``metrics.jsonl`` here keeps the others, rewritten
    atomically); ``eval/iter_*.json`` of later iterations and ``eval/latest.json`` when it is
    one of them; ``checkpoints/best`` when its ``runner_state.json`` is of a later iteration.

    Args:
        run_dir: the run directory.
        iteration: N, the iteration of the checkpoint the run resumes from.

    Returns:
        One description per kind of record moved (e.g. ``"12 metrics.jsonl rows (iterations
        31-40)"``), empty when nothing was after ``iteration``.
    """
    run = Path(run_dir)
    dest = run / "abandoned" / f"after_iter_{iteration:06d}_{time.strftime('%Y%m%d-%H%M%S')}"
    moved: List[str] = []
    metrics = run / "metrics.jsonl"
    if metrics.is_file():
        keep, later, later_its = [], [], []
        for line in metrics.read_text().splitlines():
            if not line.strip():
                continue
            row = parse_row(line)
            it = row.get("iteration", 0) if row is not None else None
            if isinstance(it, int) and it <= iteration:
                keep.append(line)
            else:
                later.append(line)
                if isinstance(it, int):
                    later_its.append(it)
        if later:
            dest.mkdir(parents=True, exist_ok=True)
            atomic_write_text(dest / "metrics.jsonl", "\n".join(later) + "\n")
            atomic_write_text(metrics, "".join(f"{ln}\n" for ln in keep))
            lo, hi = (min(later_its), max(later_its)) if later_its else (None, None)
            span = ("" if lo is None else f" (iteration {lo})" if lo == hi
                    else f" (iterations {lo}-{hi})")
            moved.append(f"{len(later)} metrics.jsonl row{'' if len(later) == 1 else 's'}{span}")
    evals = sorted(p for p in (run / "eval").glob("iter_*.json")
                   if (_iteration_of(p) or 0) > iteration)
    latest = run / "eval" / "latest.json"
    if latest.is_file() and (_iteration_of(latest) or 0) > iteration:
        evals.append(latest)
    if evals:
        (dest / "eval").mkdir(parents=True, exist_ok=True)
        for p in evals:
            p.replace(dest / "eval" / p.name)
        moved.append(f"{len(evals)} eval record(s)")
    best = run / "checkpoints" / "best"
    if best.is_dir() and (_iteration_of(best / "runner_state.json") or 0) > iteration:
        dest.mkdir(parents=True, exist_ok=True)
        best.replace(dest / "best")
        moved.append("checkpoints/best")
    return moved
