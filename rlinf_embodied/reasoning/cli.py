"""``rlinf-embodied train`` for reasoning jobs (files with ``workflow: reasoning``)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Callable, List, Optional

__all__ = ["report_lines", "train_reasoning", "validate_reasoning_job"]


def validate_reasoning_job(cfg) -> None:
    """Checks that need no cluster: iterations, the placement file, the task file.

    Raises:
        ConfigError: naming the problem and the fix.
    """
    from rlinf_embodied.config import ConfigError
    from rlinf_embodied.runners.setup import resolve_placement
    from rlinf_embodied.runtime.placement import PlacementError, PlacementPlan

    if cfg.trainer.iterations < 1:
        raise ConfigError(f"Set trainer.iterations to at least 1 (got {cfg.trainer.iterations}).")
    if cfg.task.type == "jsonl" and not Path(cfg.task.path).is_file():
        raise ConfigError(f"task.path={cfg.task.path} not found; point it at a local "
                          f"GSM8K-style JSONL file.")
    if cfg.model.path and not (Path(cfg.model.path) / "config.json").is_file():
        raise ConfigError(f"model.path={cfg.model.path} is not a local HF model directory (no "
                          f"config.json); set it to one, or to null for the tiny model.")
    if cfg.rollout.backend == "vllm":
        import importlib.util

        if importlib.util.find_spec("vllm") is None:
            raise ConfigError(
                f"rollout.backend=vllm but vLLM is not installed in this Python ({sys.prefix}); "
                "it lives in its own venv: run .venv-vllm/bin/rlinf-embodied train ... "
                "(made by `make setup`), or set rollout.backend=hf.")
    if cfg.placement == "auto":
        return
    path = resolve_placement(cfg.placement)
    try:
        plan = PlacementPlan.from_yaml(path)
        if cfg.cluster.address is None:
            import torch

            plan.validate(torch.cuda.device_count() or cfg.cluster.num_cpu_devices)
    except PlacementError as e:
        raise ConfigError(f"placement {cfg.placement!r} ({path}): {e}") from None


def report_lines(res: dict, run_dir: Path, iterations: int) -> List[str]:
    """The last lines of a reasoning ``train``: how it ended (done, interrupted, aborted, or
    failed: ``res["failed"]``, a worker's error), where results and model are."""
    ev = res["eval"]
    if len(ev) > 1:
        summary = (f" held-out reward {ev[0]['reward']:.3f} (step {ev[0]['step']}) -> "
                   f"{ev[-1]['reward']:.3f} (step {ev[-1]['step']});")
    elif ev:  # one evaluation (step 0, or the last step without one at step 0): no change measured
        summary = f" held-out reward {ev[0]['reward']:.3f} at step {ev[0]['step']}, no later evaluation ran;"
    else:
        summary = ""
    steps = len(res["steps"])
    if res.get("failed"):
        how = "failed"
    else:
        how = ("aborted" if res.get("aborted") else "interrupted") if res.get("interrupted") else "done"
    of = f" of {iterations}" if how != "done" else ""
    lines = [f"{how}: {steps}{of} steps ({res['backend']} backend);{summary} results in {run_dir}"]
    model = res.get("model")
    if model:
        lines.append(f"model: {model['path']} (step {model['step']}, HF layout)")
    elif how == "aborted":
        lines.append("no model was saved (aborted by a second Ctrl-C)")
    elif how == "failed":
        lines.append("no model was saved before the error")
    elif steps:
        lines.append("no model was saved (trainer.save_every=0)")
    if how != "done":
        lines.append("reasoning runs cannot be resumed yet; start a new run"
                     + (" (model.path can point at the saved model)" if model else "") + ".")
    return lines


def train_reasoning(config: str, overrides: List[str], fail: Callable, short_error: Callable,
                    signals: Optional[object] = None) -> int:
    """Load, validate and run a reasoning job; returns the exit code (errors go to ``fail``).

    ``signals``: the CLI's installed :class:`~rlinf_embodied.runners.signals.StopSignals`; a
    Ctrl-C before training starts returns 130 with nothing trained and removes the run
    directory if this call created it (as for embodied runs), one during training stops after
    the current step and saves the model (exit code 130; after the SFT warm-up but before
    step 1 the warm-up model, at step 0). A new run directory is also removed when a run
    stopped before step 1 saved nothing (no SFT warm-up, or aborted).
    """
    import shutil

    from rlinf_embodied.config import ConfigError, load_config
    from rlinf_embodied.reasoning.config import ReasoningJobConfig

    run_dir, new_dir = None, False
    try:
        cfg = load_config(config, overrides, schema=ReasoningJobConfig)
        validate_reasoning_job(cfg)
        run_dir = cfg.run.run_dir()
        i = 0
        while (run_dir / "results.json").exists():  # never overwrite a finished run
            i += 1
            run_dir = cfg.run.run_dir().with_name(f"{cfg.run.run_dir().name}_{i}")
        from rlinf_embodied.reasoning.runner import ReasoningRunner

        new_dir = not run_dir.exists()
        print(f"run directory: {run_dir}")
        if cfg.elastic.enabled:  # rollout on reserved + preemptible workers (reasoning/elastic.py)
            from rlinf_embodied.reasoning.elastic import ElasticReasoningRunner

            runner = ElasticReasoningRunner(cfg, run_dir)
        else:
            runner = ReasoningRunner(cfg, run_dir)
    except ConfigError as e:
        fail(str(e))
    except KeyboardInterrupt:
        where = "."
        if run_dir is not None and run_dir.exists():
            if new_dir:  # nothing ran: leave no half-built run directory behind
                shutil.rmtree(run_dir, ignore_errors=True)
                where = f"; removed the new run directory {run_dir}."
            else:
                where = f"; {run_dir} holds no results."
        print(f"interrupted before training started: nothing was trained{where}")
        return 130
    except Exception as e:  # noqa: BLE001 - a worker failed to start: say what, not a traceback
        fail(short_error(e), code=1)
    try:
        res = runner.run(signals)
    except Exception as e:  # noqa: BLE001 - a worker died mid-run: say what, and what is saved
        res = dict(runner.results, failed=True)  # results.json was written as the run ended
        fail("\n".join([short_error(e)] + report_lines(res, run_dir, cfg.trainer.iterations)),
             code=1)
    if new_dir and res.get("interrupted") and not res["steps"] and not res.get("model"):
        # stopped before step 1 with nothing saved: as for a Ctrl-C during startup
        shutil.rmtree(run_dir, ignore_errors=True)
        print(f"interrupted before step 1: nothing was saved; removed the new run directory "
              f"{run_dir}.")
        return 130
    for line in report_lines(res, run_dir, cfg.trainer.iterations):
        print(line)
    return 130 if res.get("interrupted") else 0
