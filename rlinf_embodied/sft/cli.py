"""CLI commands of the SFT -> RL pipeline (registered on the main app by ``rlinf_embodied.cli``).

::

    rlinf-embodied demos    CONFIG.yaml [key=value ...] [--force]   # stage 1
    rlinf-embodied sft      CONFIG.yaml [key=value ...]             # stage 2: BC + eval
    rlinf-embodied finetune CONFIG.yaml [key=value ...] [--resume]  # stage 3: gate, RL, eval
    rlinf-embodied sft-rl   CONFIG.yaml [key=value ...]             # all stages

This module imports nothing heavy at import time (the commands import their machinery).
"""

from __future__ import annotations

import json
from pathlib import Path

import typer

__all__ = ["register"]

_CONFIG = typer.Argument(..., help="SFT pipeline YAML, or a shipped one by name (e.g. maniskill_pushcube_sft_rl_mlp)")
_OVERRIDES = typer.Argument(None, help="key=value overrides of the pipeline YAML (e.g. bc.steps=1000; the RL stage's own keys go in 'rl.overrides=[\"trainer.lr=3e-4\"]')")


def _fail(msg: str, code: int = 2) -> None:
    typer.secho(f"error: {msg}", fg=typer.colors.RED, err=True)
    raise typer.Exit(code)


def _stopped(cfg, config: str, error: BaseException | None = None,
                 overrides: list[str] | None = None) -> None:
    """After a Ctrl-C (or, with ``error``, a failure such as Ray not starting) in any stage:
    what the finished stages left and which command goes on from it; exits 130 (1)."""
    if error is not None:
        from rlinf_embodied.runners.errors import short_error, start_hint

        typer.secho(f"error: {short_error(error)}{start_hint(error)}", fg=typer.colors.RED, err=True)

    import psutil

    started = psutil.Process().create_time()  # this command's start: older files are a past run's
    run = cfg.run_dir()
    lines = []
    if _converted_demos(cfg):  # what `sft` reads (an interrupted conversion leaves only plans)
        lines.append(f"demos in {cfg.demos.dir} (reused by `sft` / `sft-rl`)")
    from rlinf_embodied.checkpoint import list_checkpoints

    rl_ckpts = run / "rl" / "checkpoints"
    ckpts = list_checkpoints(run / "rl")  # complete ones: what `finetune --resume` continues
    sft = run / "sft" / ("vla" if (run / "sft" / "vla").is_dir() else "policy")
    record = run / "sft" / "sft_record.json"  # written after the SFT evaluation
    if record.is_file():
        whose = "the SFT checkpoint" if record.stat().st_mtime >= started else "an earlier run's SFT checkpoint"
        lines.append(f"{whose} {sft}" + ("" if ckpts else  # with an RL run: --resume, below
                                         f" (`{_finetune_command(config, overrides)}` runs the "
                                         "gate and RL from it)"))
    if any(p.stat().st_mtime >= started for p in ckpts):
        lines.append(f"RL checkpoints in {rl_ckpts} (`{_finetune_command(config, overrides, True)}` "
                     "continues the RL run, then writes the final evaluation and summary)")
    elif ckpts:
        lines.append(f"no RL checkpoint of this command (those in {rl_ckpts} are an earlier "
                     f"run's; `{_finetune_command(config, overrides, True)}` continues it)")
    how = "failed" if error is not None else "interrupted"
    if lines:
        typer.echo(f"{how}; saved: " + "; ".join(lines) + ".")
    else:
        typer.echo(f"{how} before any stage finished: nothing was saved under {run}.")
    from rlinf_embodied.runners.restarts import RayGoneError, exit_now

    if isinstance(error, RayGoneError):  # Ray's exit hooks would hang on the dead cluster
        exit_now(1)
    raise typer.Exit(1 if error is not None else 130)


def _finetune_command(config: str, overrides: list[str] | None, resume: bool = False) -> str:
    """The ``finetune`` command line of this pipeline (``--resume``: that continues its RL
    stage)."""
    import shlex

    return shlex.join(["rlinf-embodied", "finetune", config, *(overrides or []),
                       *(["--resume"] if resume else [])])


def _converted_demos(cfg) -> bool:
    """Whether ``demos.dir`` holds demos of this config that ``sft`` can read (converted into
    the policy's controller; for a suite, of at least one selected task)."""
    e = cfg.env
    if getattr(e, "suite", None) is not None:
        from rlinf_embodied.sft.vla_demos import find_suite_demos

        return bool(find_suite_demos(cfg.demos.dir, e, cfg.demos.stride))
    from rlinf_embodied.sft.demos import find_demos

    return find_demos(cfg.demos.dir, e.env_id, e.control_mode, e.obs_mode) is not None


def _load(config: str, overrides: list[str] | None, rl_stage: bool = False,
          resume: bool = False):
    """The pipeline config; with ``rl_stage`` also resolves and validates the RL stage's job
    (``rl.config`` + ``rl.overrides``) first, so that a bad one fails in one line before any
    stage runs, and refuses a run directory that holds an RL run (with ``resume``: one that
    holds none, :func:`~rlinf_embodied.sft.pipeline.check_rl_dir`)."""
    # this process (SFT, the gate, the evaluations' policy) loads torch with a short OpenMP
    # spin; the env and Ray worker processes it starts stay passive (omp.py, docs/placement.md)
    from rlinf_embodied.omp import load_openmp_for_compute

    load_openmp_for_compute()
    from rlinf_embodied.config import ConfigError
    from rlinf_embodied.sft.pipeline import check_rl_dir, load_sft_config, validate_rl_stage

    try:
        cfg = load_sft_config(config, overrides or [])
        if rl_stage:
            job = validate_rl_stage(cfg)
            check_rl_dir(Path(job.run.run_dir()), resume, _finetune_command(config, overrides))
        return cfg
    except ConfigError as e:
        _fail(str(e))


def demos(config: str = _CONFIG, overrides: list[str] | None = _OVERRIDES,
          force: bool = typer.Option(False, "--force", help="Regenerate even if the file exists.")) -> None:
    """Record motion-planning demonstrations (ManiSkill HDF5 trajectories) in the policy's controller."""
    from rlinf_embodied.sft.demos import DemoError
    from rlinf_embodied.sft.pipeline import run_demos

    cfg = _load(config, overrides)
    try:
        path = run_demos(cfg, log=typer.echo, force=force)
    except DemoError as e:
        _fail(str(e), code=1)
    except KeyboardInterrupt:
        _stopped(cfg, config, overrides=overrides)
    typer.echo(f"demos: {path}")


def sft(config: str = _CONFIG, overrides: list[str] | None = _OVERRIDES) -> None:
    """Behaviour-clone the policy on the demos, save it and evaluate it on held-out seeds."""
    from rlinf_embodied.sft.pipeline import run_sft

    cfg = _load(config, overrides)
    try:
        out = run_sft(cfg, log=typer.echo)
    except (FileNotFoundError, ValueError) as e:  # no demos, too few, or made for another setup
        _fail(str(e))
    except KeyboardInterrupt:
        _stopped(cfg, config, overrides=overrides)
    typer.echo(json.dumps(out["evaluation"]))


def finetune(config: str = _CONFIG, overrides: list[str] | None = _OVERRIDES,
             resume: bool = typer.Option(
                 False, "--resume", help="Continue the RL run in <run dir>/rl (e.g. after "
                 "Ctrl-C) from its newest complete checkpoint to the configured iterations, "
                 "then write the final evaluation and summary.")) -> None:
    """Step-0 gate, RL fine-tuning from the SFT checkpoint, held-out evaluation, summary.

    Exits 2 without an SFT checkpoint (or with one of another family), or with
    ``--resume`` and no RL run to continue; 3 when the gate refuses the SFT checkpoint; 130
    after Ctrl-C.
    """
    from rlinf_embodied.config import ConfigError
    from rlinf_embodied.sft.gate import GateError, SFTCheckpointError
    from rlinf_embodied.sft.pipeline import run_rl, summarize

    cfg = _load(config, overrides, rl_stage=True, resume=resume)
    try:
        run_rl(cfg, log=typer.echo, resume=resume)
    except ConfigError as e:  # --resume: nothing to continue, or another policy
        _fail(str(e))
    except SFTCheckpointError as e:
        _fail(str(e), code=2)
    except GateError as e:
        _fail(str(e), code=3)
    except KeyboardInterrupt:
        _stopped(cfg, config, overrides=overrides)
    except Exception as e:  # noqa: BLE001 - e.g. Ray did not start: one line, then what is saved
        _stopped(cfg, config, e, overrides)
    typer.echo(json.dumps(summarize(cfg)))


def sft_rl(config: str = _CONFIG, overrides: list[str] | None = _OVERRIDES) -> None:
    """All stages: demos (reused when present), SFT, gate + RL fine-tuning, summary."""
    from rlinf_embodied.sft.demos import DemoError
    from rlinf_embodied.sft.gate import GateError, SFTCheckpointError
    from rlinf_embodied.sft.pipeline import run_sft_rl

    cfg = _load(config, overrides, rl_stage=True)
    try:
        out = run_sft_rl(cfg, log=typer.echo)
    except SFTCheckpointError as e:
        _fail(str(e), code=2)
    except GateError as e:
        _fail(str(e), code=3)
    except DemoError as e:
        _fail(str(e), code=1)
    except KeyboardInterrupt:
        _stopped(cfg, config, overrides=overrides)
    except Exception as e:  # noqa: BLE001 - e.g. Ray did not start: one line, then what is saved
        _stopped(cfg, config, e, overrides)
    typer.echo(json.dumps(out))


def register(app: typer.Typer) -> None:
    """Add the pipeline's commands to ``app``."""
    app.command("demos")(demos)
    app.command("sft")(sft)
    app.command("finetune")(finetune)
    app.command("sft-rl")(sft_rl)
