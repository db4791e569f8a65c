"""The `rlinf-embodied` command line (typer).

Commands import their machinery lazily so that `--help` and `config show` stay fast and never
import a simulator or a large model.
"""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from rlinf_embodied import __version__

app = typer.Typer(
    help="RL fine-tuning of robot policies in simulators (ManiSkill3, LIBERO, gymnasium).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
config_app = typer.Typer(help="Inspect job configurations.", no_args_is_help=True)
envs_app = typer.Typer(help="Registered environments.", no_args_is_help=True)
app.add_typer(config_app, name="config")
app.add_typer(envs_app, name="envs")


def _add_eval_app() -> None:
    from rlinf_embodied.eval.cli import eval_app  # light: no simulator, torch or matplotlib

    app.add_typer(eval_app, name="eval")


_add_eval_app()


def _add_sft_commands() -> None:
    from rlinf_embodied.sft.cli import register  # light: typer only

    register(app)  # demos, sft, finetune, sft-rl


_add_sft_commands()


def _fail(msg: str, code: int = 2) -> None:
    typer.secho(f"error: {msg}", fg=typer.colors.RED, err=True)
    raise typer.Exit(code)


def _version_callback(value: bool) -> None:
    if value:
        typer.echo(f"rlinf-embodied {__version__}")
        raise typer.Exit()


@app.callback()
def main(
    version: bool = typer.Option(
        False, "--version", callback=_version_callback, is_eager=True, help="Print the version."
    ),
) -> None:
    """RL fine-tuning of robot policies in simulators."""


@config_app.command("show")
def config_show(
    config: str = typer.Argument(..., help="Job YAML, e.g. configs/maniskill_pushcube_ppo_mlp.yaml"),
    overrides: Optional[List[str]] = typer.Argument(None, help="key=value overrides"),
) -> None:
    """Print the resolved configuration (YAML) after overrides and validation."""
    from rlinf_embodied.config import ConfigError, to_yaml
    from rlinf_embodied.reasoning.config import load_job_config

    try:
        cfg = load_job_config(config, overrides or [])
    except ConfigError as e:
        _fail(str(e))
    typer.echo(to_yaml(cfg), nl=False)


@app.command()
def doctor(json_output: bool = typer.Option(False, "--json", help="Machine-readable output.")):
    """Check Python, torch, Ray, SAPIEN/MuJoCo rendering, LIBERO assets and version pins."""
    from rlinf_embodied.doctor import format_checks, run_checks

    results = run_checks()
    typer.echo(format_checks(results, as_json=json_output))
    if any(c.failed for c in results):
        raise typer.Exit(1)


def _fresh_run_dir(path: Path) -> Path:
    """``path`` if it holds no checkpoint yet, else ``path_1``, ``path_2``, ..."""
    from rlinf_embodied.checkpoint import list_checkpoints

    candidate, i = path, 0
    while list_checkpoints(candidate):
        i += 1
        candidate = path.with_name(f"{path.name}_{i}")
    return candidate


# Settings that may change on --resume without changing what an uninterrupted run would do.
_RESUME_SAFE = ("trainer.iterations", "trainer.max_time_s", "trainer.eval_every",
                "trainer.save_every", "logging.", "eval.num_videos", "run.dir", "run.name",
                "run.output_dir")


def _flat(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


@app.command()
def train(
    config: Optional[str] = typer.Argument(
        None, help="Job YAML, e.g. configs/maniskill_pushcube_ppo_mlp.yaml (omit with --resume)"
    ),
    overrides: Optional[List[str]] = typer.Argument(None, help="key=value overrides"),
    resume: Optional[str] = typer.Option(
        None, "--resume", help="Run directory to continue from its latest checkpoint; its saved "
        "config.yaml is the base, key=value overrides apply on top (e.g. trainer.iterations=300)."
    ),
) -> None:
    """Train a policy with RL (env, rollout and actor workers on Ray, placement from config).

    Exits 0 when the run ends (all iterations or trainer.max_time_s), 130 after Ctrl-C (a
    checkpoint is saved first), 2 for a configuration error.
    """
    from rlinf_embodied.config import ConfigError, as_dict, load_config
    from rlinf_embodied.reasoning.config import is_reasoning_job

    overrides = list(overrides or [])
    if config and not resume and is_reasoning_job(config):
        from rlinf_embodied.reasoning.cli import train_reasoning

        raise typer.Exit(train_reasoning(config, overrides, _fail, _short_error))
    if config and "=" in config and not Path(config).exists():
        overrides.insert(0, config)  # `train --resume RUN key=value`: no CONFIG given
        config = None
    try:
        if resume:
            run_dir = Path(resume)
            if not run_dir.is_dir():
                raise ConfigError(f"--resume {resume}: no such directory.")
            if not (run_dir / "checkpoints").is_dir() or not (run_dir / "config.yaml").exists():
                raise ConfigError(
                    f"--resume {resume}: not a run directory with checkpoints/ and config.yaml; "
                    f"pass the run directory printed at the start of the run to continue."
                )
            if config:
                typer.echo(f"note: resuming uses {run_dir / 'config.yaml'} (the run's resolved "
                           f"config) plus the overrides; {config} is not read.")
            saved = load_config(run_dir / "config.yaml")
            cfg = load_config(run_dir / "config.yaml", overrides)
            before, after = _flat(as_dict(saved)), _flat(as_dict(cfg))
            changed = [k for k in after if before.get(k) != after[k] and not k.startswith(_RESUME_SAFE)]
            if changed:
                typer.secho(
                    "warning: resuming with changed settings "
                    + ", ".join(f"{k}: {before.get(k)!r} -> {after[k]!r}" for k in changed)
                    + "; the result will differ from an uninterrupted run.",
                    fg=typer.colors.YELLOW, err=True)
        else:
            if not config:
                raise ConfigError("Pass a job YAML (e.g. configs/maniskill_pushcube_ppo_mlp.yaml) "
                                  "or --resume RUN_DIR.")
            cfg = load_config(config, overrides)
            run_dir = _fresh_run_dir(cfg.run.run_dir())
        from rlinf_embodied.runners.setup import validate_job

        validate_job(cfg)
        if not resume:  # starting from an SFT checkpoint: the step-0 gate re-evaluates it
            from rlinf_embodied.sft.gate import GateError, gate_for_job

            try:
                gate_for_job(cfg, run_dir, log=typer.echo)
            except GateError as e:
                _fail(str(e), code=3)
        from rlinf_embodied.runners.embodied import EmbodiedRunner

        if cfg.elastic.enabled:  # elastic rollout: rlinf_embodied/elastic/runner.py
            from rlinf_embodied.elastic.runner import ElasticEmbodiedRunner as EmbodiedRunner
        typer.echo(f"run directory: {run_dir}")
        runner = EmbodiedRunner(cfg, run_dir, resume=bool(resume))
    except ConfigError as e:
        _fail(str(e))
    except Exception as e:  # noqa: BLE001 - a worker failed to start: say what, not a traceback
        _fail(_short_error(e), code=1)
    state = runner.run()
    typer.echo(f"{'interrupted' if runner.interrupted else 'done'}: {state['iteration']} "
               f"iterations, {state['env_steps']:,} env steps; results in {run_dir}")
    if runner.interrupted:
        typer.echo(f"continue with: rlinf-embodied train --resume {run_dir}")
        raise typer.Exit(130)


def _short_error(e: Exception) -> str:
    """The message of a (remote) error without the traceback: its first and last lines."""
    text = str(e).strip().splitlines()
    last = next((ln for ln in reversed(text) if ln.strip()), "")
    head = text[0] if text else type(e).__name__
    return head if last in head else f"{head}\n  {last}"


@app.command()
def plan(
    config: str = typer.Argument(..., help="Job YAML"),
    overrides: Optional[List[str]] = typer.Argument(None, help="key=value overrides"),
    devices: Optional[int] = typer.Option(None, "--devices", help="Plan for this many devices."),
    json_output: bool = typer.Option(False, "--json", help="Machine-readable output."),
) -> None:
    """Choose placement (temporal / spatial / hybrid) and granularity from profiles."""
    from rlinf_embodied.config import ConfigError
    from rlinf_embodied.scheduler.cli_plan import plan_command

    try:
        typer.echo(plan_command(config, devices, json_output, overrides or []))
    except (ConfigError, ValueError) as e:
        _fail(str(e))


@envs_app.command("list")
def envs_list() -> None:
    """Print registered environment ids with a one-line description."""
    from rlinf_embodied.envs.registry import describe_envs

    rows = describe_envs()
    width = max((len(i) for i, _ in rows), default=0)
    for env_id, desc in rows:
        typer.echo(f"{env_id:<{width}}  {desc}")


if __name__ == "__main__":  # pragma: no cover
    app()
