"""Metric logging: TensorBoard by default, W&B when enabled, a console line, a JSONL file and an
end-of-run PNG of success and return against env steps."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional, TypeVar

T = TypeVar("T")

__all__ = ["MetricLogger", "last_time_s", "parse_row", "plot_curves"]


class MetricLogger:
    """Writes scalar metrics of each iteration to every enabled sink.

    Args:
        run_dir: the run directory; TensorBoard events go to ``run_dir/tensorboard``, the JSONL
            history to ``run_dir/metrics.jsonl``.
        tensorboard: write TensorBoard event files.
        wandb: also log to Weights & Biases (``wandb`` must be installed and logged in).
        console: print one progress line per iteration (rich when available).
        project, config: W&B project and run config.
        elapsed_s: seconds the run had already trained before this logger started (a resumed
            run's, stored with its checkpoint): every ``time_s`` (and the console's elapsed
            seconds) counts on from it, so the time of a resumed run continues that of the run
            it resumes (the time between the two commands is not counted).

    ``time_s`` is seconds since the logger started (after the workers started) plus
    ``elapsed_s``; :meth:`elapsed` gives it at any moment.
    """

    def __init__(
        self,
        run_dir: str | Path,
        tensorboard: bool = True,
        wandb: bool = False,
        console: bool = True,
        project: str = "rlinf-embodied",
        config: Optional[dict] = None,
        elapsed_s: float = 0.0,
    ):
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.console = console
        self._tb = None
        self._wandb = None
        self._t0 = time.time() - float(elapsed_s)
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(log_dir=str(self.run_dir / "tensorboard"))
        if wandb:
            try:
                import wandb as _wandb
            except ImportError as e:
                raise RuntimeError(
                    "logging.wandb=true needs the wandb package: pip install wandb "
                    "(or set logging.wandb=false)"
                ) from e
            self._wandb = _wandb.init(
                project=project, dir=str(self.run_dir), config=config or {}, resume="allow"
            )
        self._jsonl = open(self.run_dir / "metrics.jsonl", "a", buffering=1)
        self._rich = None
        if console:
            try:
                from rich.console import Console

                self._rich = Console(highlight=False, soft_wrap=True)
            except ImportError:  # pragma: no cover - rich is a dependency
                self._rich = None

    def log(self, metrics: Dict[str, float], step: int, iteration: int) -> None:
        """Log ``metrics`` at x = ``step`` (env steps) for ``iteration``.

        Non-finite values are written as they are to TensorBoard and as null to JSONL.
        """
        clean = {k: float(v) for k, v in metrics.items() if v is not None}
        if self._tb is not None:
            for k, v in clean.items():
                self._tb.add_scalar(k, v, step)
            self._tb.flush()
        if self._wandb is not None:
            self._wandb.log({**clean, "env_steps": step}, step=iteration)
        rec = {"iteration": iteration, "env_steps": step, "time_s": self.elapsed()}
        rec.update({k: (v if math.isfinite(v) else None) for k, v in clean.items()})
        self._jsonl.write(json.dumps(rec) + "\n")
        if self.console:
            self._print(rec)

    def event(self, name: str, step: int, iteration: int, **fields) -> None:
        """Write a non-metric record (e.g. a restart) to ``metrics.jsonl`` as
        ``{"event": name, "iteration", "env_steps", "time_s", **fields}``; readers of the
        history skip rows with an ``event`` key. Numeric fields also go to TensorBoard."""
        rec = {"event": name, "iteration": iteration, "env_steps": step,
               "time_s": self.elapsed(), **fields}
        self._jsonl.write(json.dumps(rec) + "\n")
        if self._tb is not None:
            for k, v in fields.items():
                if isinstance(v, (int, float)) and not isinstance(v, bool):
                    self._tb.add_scalar(k, v, step)
            self._tb.flush()

    def with_file_closed(self, edit: Callable[[], T]) -> T:
        """``edit()`` with ``metrics.jsonl`` closed (it may rewrite the file, e.g.
        :func:`~rlinf_embodied.runners.branches.set_aside_after`), then the file reopened for
        appending. Returns what ``edit`` returns."""
        self._jsonl.close()
        try:
            return edit()
        finally:
            self._jsonl = open(self.run_dir / "metrics.jsonl", "a", buffering=1)

    def elapsed(self) -> float:
        """Seconds the run has trained: since this logger started, plus its ``elapsed_s``."""
        return time.time() - self._t0

    def _print(self, rec: dict) -> None:
        keys = [
            ("rollout/success_once", "succ"),
            ("rollout/episode_return", "ret"),
            ("eval/success_once", "eval_succ"),
            ("rollout/reward", "reward"),
            ("eval/reward", "eval_reward"),
            ("time/env_steps_per_s", "steps/s"),
            ("train/policy_loss", "pi_loss"),
            ("train/approx_kl", "kl"),
        ]
        parts = [f"iter {rec['iteration']:>4}", f"env steps {rec['env_steps']:>9,}"]
        for k, short in keys:
            v = rec.get(k)
            if v is not None:
                parts.append(f"{short} {v:.3g}")
        parts.append(f"{rec['time_s']:.0f}s")
        if rec.get("train/nonzero_advantage_fraction") == 0.0:
            parts.append("no update signal: every advantage is 0 (equal rewards within every "
                         "group, e.g. none succeeded, or every group dropped by "
                         "algorithm.filter_low / filter_high)")
        line = " | ".join(parts)
        if self._rich is not None:
            self._rich.print(line)
        else:
            print(line, flush=True)

    def close(self) -> None:
        """Flush and close every sink."""
        if self._tb is not None:
            self._tb.close()
        if self._wandb is not None:
            self._wandb.finish()
        self._jsonl.close()


def read_history(run_dir: str | Path, events: bool = False) -> List[dict]:
    """Records of ``run_dir/metrics.jsonl`` (one dict per logged iteration); ``events`` keeps
    the event rows (restarts) too. A line that is no JSON object (the last one, cut by a kill
    while it was written) is skipped."""
    path = Path(run_dir) / "metrics.jsonl"
    if not path.exists():
        return []
    rows = [r for r in map(parse_row, path.read_text().splitlines()) if r is not None]
    return rows if events else [r for r in rows if "event" not in r]


def parse_row(line: str) -> Optional[dict]:
    """One ``metrics.jsonl`` line as a dict; None for a blank line or one that is no JSON
    object (cut by a kill while it was written)."""
    try:
        row = json.loads(line) if line.strip() else None
    except ValueError:
        return None
    return row if isinstance(row, dict) else None


def last_time_s(run_dir: str | Path, iteration: int) -> float:
    """``time_s`` (seconds) of the last metric record of ``run_dir/metrics.jsonl`` at or before
    ``iteration``, 0.0 when there is none: the elapsed time of a checkpoint saved without it."""
    rows = [r for r in read_history(run_dir) if r.get("iteration", 0) <= iteration
            and isinstance(r.get("time_s"), (int, float))]
    return float(rows[-1]["time_s"]) if rows else 0.0


def plot_curves(run_dir: str | Path, out: Optional[str | Path] = None) -> Path:
    """PNG of success (train and eval) and episode return against env steps.

    Returns:
        The PNG path (default ``run_dir/curves.png``).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    hist = read_history(run_dir)
    out = Path(out) if out else Path(run_dir) / "curves.png"
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    panels = [
        ("success", ["rollout/success_once", "eval/success_once", "eval/success_at_end"]),
        ("episode return", ["rollout/episode_return", "eval/episode_return"]),
    ]
    for ax, (title, keys) in zip(axes, panels):
        for k in keys:
            pts = [(h["env_steps"], h[k]) for h in hist if h.get(k) is not None]
            if pts:
                xs, ys = zip(*pts)
                ax.plot(xs, ys, marker="o" if k.startswith("eval") else None, ms=3, label=k)
        ax.set_xlabel("env steps")
        ax.set_title(title)
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    fig.tight_layout()
    tmp = out.with_suffix(".tmp.png")
    fig.savefig(tmp, dpi=100)
    plt.close(fig)
    tmp.replace(out)
    return out
