"""What ``rlinf-embodied train`` says and chooses about its run directory: where a new run
goes, how a run ended, and its last lines (what is saved, the command that continues it).

It sits beside the CLI (:mod:`rlinf_embodied.cli`), which calls it; it imports the runner's
checkpoint helpers only.
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path
from typing import Optional

import typer

__all__ = ["fresh_run_dir", "how_it_ended", "report_saved", "self_command"]


def fresh_run_dir(path: Path) -> Path:
    """``path`` if it does not exist or holds at most a ``config.yaml`` (a start that trained
    nothing), else ``path_1``, ``path_2``, ...: a directory with a checkpoint, a
    ``metrics.jsonl`` (a run killed before its first checkpoint: a new run would append to its
    curves) or any other file is left as it is (a file at ``path`` is returned: the writability
    check refuses it)."""
    candidate, i = path, 0
    while candidate.is_dir() and {p.name for p in candidate.iterdir()} - {"config.yaml"}:
        i += 1
        candidate = path.with_name(f"{path.name}_{i}")
    return candidate


def self_command() -> str:
    """How to invoke this CLI again, as the user did: ``.venv/bin/rlinf-embodied`` (or
    ``rlinf-embodied`` when found on PATH), else ``python -m rlinf_embodied.cli``."""
    exe = Path(sys.argv[0]) if sys.argv and sys.argv[0] else None
    if exe is not None and exe.name == "rlinf-embodied":
        return shlex.quote(str(exe)) if exe.parent != Path("") else "rlinf-embodied"
    return f"{shlex.quote(sys.executable)} -m rlinf_embodied.cli"


def how_it_ended(runner, signals) -> str:
    """``done``, ``interrupted`` (a Ctrl-C: the iteration finished and a checkpoint was saved)
    or ``aborted`` (a second Ctrl-C before the final checkpoint was written; one after it only
    cut the shutdown short, and the run counts as interrupted)."""
    if not runner.interrupted:
        return "done"
    aborted = signals.aborted or runner.signals.aborted
    saved_last = getattr(runner, "_saved_at", -1) == runner.state["iteration"]
    return "aborted" if aborted and not saved_last else "interrupted"


def report_saved(runner, run_dir: Optional[Path], how: str) -> None:
    """The last lines of a train command: what ran, what is saved, how to continue."""
    saved = getattr(runner, "saved", None) if runner is not None else None
    if runner is None:
        typer.echo(f"{how} before training started: nothing was trained"
                   + (f"; {run_dir} is unchanged." if run_dir and run_dir.exists() else
                      ", nothing was saved."))
        return
    st = runner.state
    restarts = getattr(runner, "restarts", 0)
    its = st["iteration"]
    typer.echo(f"{how}: {its} iteration{'' if its == 1 else 's'}, {st['env_steps']:,} env steps"
               + (f", {restarts} restart(s)" if restarts else "") + f"; results in {run_dir}")
    if saved is not None and not saved.exists():  # rotated away meanwhile: say what is there
        from rlinf_embodied.checkpoint import latest_checkpoint

        saved = latest_checkpoint(run_dir)
    if saved is None:
        every, done = runner.cfg.trainer.save_every, st["iteration"]
        if done == 0:
            why = "it stopped before its first iteration ended"
        elif not every:
            why = ("trainer.save_every=0 saves none, except on Ctrl-C; pass trainer.save_every=N "
                   "to save every N iterations and at the end")
        else:
            why = (f"trainer.save_every={every}: the first checkpoint was due after iteration "
                   f"{every} and the run stopped after {done}; pass a smaller "
                   f"trainer.save_every to lose less")
        typer.echo(f"no checkpoint was saved, so the run cannot be resumed ({why}).")
        return
    it = saved.name.removeprefix("iter_").lstrip("0") or "0"
    lost = st["iteration"] - int(it)
    typer.echo(f"checkpoint: {saved} (iteration {it})"
               + (f"; the {lost} iteration(s) after it were not saved" if lost > 0 else ""))
    if how != "done":
        typer.echo(f"continue with: {self_command()} train --resume {shlex.quote(str(run_dir))}")

