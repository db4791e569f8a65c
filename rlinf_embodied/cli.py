"""The `rlinf-embodied` command line (typer).

Commands import their machinery lazily so that `--help` and `config show` stay fast and never
import a simulator or a large model.
"""

from __future__ import annotations

import re
import shutil
import sys
import textwrap
from pathlib import Path
from typing import List, Optional

import typer

from rlinf_embodied import __version__
from rlinf_embodied.cli_run import fresh_run_dir, how_it_ended, report_saved
from rlinf_embodied.runners.errors import short_error, start_hint

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


def _print_error(msg: str) -> None:
    typer.secho(f"error: {msg}", fg=typer.colors.RED, err=True)


def _fail(msg: str, code: int = 2) -> None:
    _print_error(msg)
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
    _one_line_config_warnings()


def _one_line_config_warnings() -> None:
    """Print a :class:`~rlinf_embodied.config.ConfigWarning` as one ``warning: ...`` line on
    stderr (not Python's ``file:line: category`` form); other warnings are left as they are
    (``eval`` adds the envs' :class:`~rlinf_embodied.envs.base.EnvWarning`)."""
    from rlinf_embodied.config import ConfigWarning
    from rlinf_embodied.config.errors import one_line_warnings

    one_line_warnings((ConfigWarning,), _yellow_warning)


def _yellow_warning(text: str) -> None:
    """Echo a one-line ``warning: ...`` in yellow on stderr."""
    typer.secho(text, fg=typer.colors.YELLOW, err=True)


@config_app.command("show")
def config_show(
    config: str = typer.Argument(..., help="Job YAML path, or a shipped config's name from any directory (e.g. maniskill_pushcube_ppo_mlp)"),
    overrides: Optional[List[str]] = typer.Argument(None, help="key=value overrides"),
    rl_stage: bool = typer.Option(
        False, "--rl-stage", help="For an SFT pipeline YAML: print the job its RL stage runs "
        "(rl.config with the pipeline's env, rl.task_ids, the SFT checkpoint and rl.overrides "
        "applied), not the pipeline's own sections."),
) -> None:
    """Print the resolved configuration (YAML) after overrides and the validation `train` runs."""
    from rlinf_embodied.config import ConfigError, JobConfig, check_repeated_overrides, to_yaml
    from rlinf_embodied.reasoning.config import load_job_config

    from rlinf_embodied.runners.setup import check_policy_paths, validate_job

    try:
        check_repeated_overrides(overrides or [])
        if _is_sft_pipeline(config):  # `sft-rl` / `demos` / `sft` YAMLs (configs/sft/)
            from rlinf_embodied.sft.pipeline import load_sft_config, validate_rl_stage

            cfg = load_sft_config(config, overrides or [])
            job = validate_rl_stage(cfg)  # the RL stage `finetune` / `sft-rl` will run
            if rl_stage:
                cfg = job
                for key in ("pretrained", "checkpoint"):
                    path = getattr(job.policy, key, None)
                    if path and not Path(path).exists():
                        typer.echo(f"note: policy.{key} ({path}) is what the SFT stage writes; "
                                   "it does not exist yet (run `rlinf-embodied sft` first).",
                                   err=True)
        else:
            cfg = load_job_config(config, overrides or [])  # a missing file fails here
            if rl_stage:
                _fail(f"--rl-stage: {config} is not an SFT pipeline YAML (no demos / bc "
                      "section); drop --rl-stage to print it.")
            if isinstance(cfg, JobConfig):  # a GPU config names a checkpoint downloaded later
                try:
                    check_policy_paths(cfg)
                except ConfigError as e:
                    typer.echo(f"note: `train` refuses this config here: {e}", err=True)
        if isinstance(cfg, JobConfig):
            validate_job(cfg)  # the same checks as `train`
    except ConfigError as e:
        _fail(str(e))
    typer.echo(to_yaml(cfg), nl=False)


def _is_sft_pipeline(path: str) -> bool:
    """True for an SFT pipeline YAML (:func:`~rlinf_embodied.sft.config.is_sft_pipeline`)."""
    from rlinf_embodied.config import peek_top_level
    from rlinf_embodied.sft.config import is_sft_pipeline

    raw = peek_top_level(path)
    return raw is not None and is_sft_pipeline(raw)


def _refuse_sft_pipeline(config: str, command: str) -> None:
    """``train`` / ``plan`` take RL job configs; an SFT pipeline YAML names what runs it.

    Raises:
        ConfigError: ``config`` is an SFT pipeline YAML.
    """
    from rlinf_embodied.config import ConfigError

    if _is_sft_pipeline(config):
        rl = (f"; `rlinf-embodied config show {config} --rl-stage > rl.yaml` writes the RL job "
              f"its finetune stage runs, which `plan rl.yaml` takes" if command == "plan" else "")
        raise ConfigError(f"{config} is an SFT -> RL pipeline (demos / bc sections), not an RL "
                          f"job config: run it with `rlinf-embodied sft-rl {config}` (or stage "
                          f"by stage: demos, sft, finetune){rl}.")


@app.command()
def doctor(
    overrides: Optional[List[str]] = typer.Argument(
        None, help="cluster.address=HOST:PORT (or auto): also attach to that Ray cluster and list "
        "its nodes; elastic.preemptible_resource=NAME: the resource marking preemptible nodes"),
    json_output: bool = typer.Option(False, "--json", help="Machine-readable output."),
):
    """Check Python, torch, Ray, SAPIEN/MuJoCo rendering, LIBERO assets and version pins, and
    with cluster.address=... that this machine can attach to the cluster."""
    from rlinf_embodied.config import ConfigError, load_config
    from rlinf_embodied.doctor import format_checks, run_checks

    allowed = ("cluster.address", "elastic.preemptible_resource")
    bad = [o for o in overrides or [] if o.split("=", 1)[0] not in allowed]
    if bad:
        _fail(f"doctor takes only {' and '.join(f'{k}=...' for k in allowed)} (got {bad}).")
    try:
        cfg = load_config(None, list(overrides or []))
    except ConfigError as e:
        _fail(str(e))
    results = run_checks(cfg.cluster.address, cfg.elastic.preemptible_resource)
    typer.echo(format_checks(results, as_json=json_output))
    if any(c.failed for c in results):
        raise typer.Exit(1)


# Settings that may change on --resume: config.RESUME_SAFE_KEYS (where the run lives may not
# change at all: _resume_config refuses run.name/dir/output_dir).


def _warn(msg: str) -> None:
    typer.secho(f"warning: {msg}", fg=typer.colors.YELLOW, err=True)


def _rebased(cfg, recorded: Path, run_dir: Path):
    """``cfg`` of the SFT -> RL pipeline's RL run now in ``run_dir`` (``<run>/rl`` beside
    ``<run>/sft``) whose config.yaml was written in ``recorded`` (its ``run.run_dir()``, which
    the pipeline sets to where the RL run is): after the pipeline's run directory was moved or
    copied, its policy paths into the old one point into ``run_dir.parent`` (its own SFT
    checkpoint, as ``finetune --resume`` does) and ``run.dir`` is ``run_dir`` (absolute), so the
    config.yaml the resumed run writes records where it is now. Any other run: ``cfg`` as it
    is (a ``train`` run's config.yaml names the directory its config asked for, not the
    ``_1``-suffixed one it may have got, so its paths are not rebased on that guess)."""
    import dataclasses

    from rlinf_embodied.runners.setup import rebase_policy_paths

    if not (recorded.name == run_dir.name == "rl" and (run_dir.parent / "sft").is_dir()
            and recorded.resolve() != run_dir.resolve()):
        return cfg
    cfg = rebase_policy_paths(cfg, recorded.parent, run_dir.parent)
    return dataclasses.replace(cfg, run=dataclasses.replace(cfg.run, dir=str(run_dir.resolve())))


def _resume_config(config: Optional[str], overrides: List[str], resume: str):
    """(config, run directory, checkpoint) of ``train --resume``; None as the checkpoint when
    the run has already finished (after saying so).

    Raises:
        ConfigError: not a run directory, no loadable checkpoint, or a CONFIG that differs
            from the run's own config.yaml.
    """
    import json

    from rlinf_embodied.checkpoint import latest_loadable_checkpoint
    from rlinf_embodied.config import RESUME_SAFE_KEYS, ConfigError, config_diff, load_config

    run_dir = Path(resume)
    if run_dir.is_file():
        raise ConfigError(f"--resume {resume} is a file; pass the run directory printed at the "
                          "start of the run (runs/<name>, holding config.yaml and checkpoints/).")
    if not run_dir.is_dir():
        raise ConfigError(f"--resume {resume}: no such directory (a run stopped before its first "
                          f"iteration leaves none); start the job again without --resume.")
    if not (run_dir / "config.yaml").exists():
        raise ConfigError(
            f"--resume {resume}: not a run directory (no config.yaml); pass the run directory "
            f"printed at the start of the run."
        )
    from rlinf_embodied.reasoning.config import is_reasoning_job

    if is_reasoning_job(run_dir / "config.yaml"):
        raise ConfigError(f"--resume {resume}: a reasoning run; reasoning runs write no "
                          f"resumable checkpoints yet, so start it again without --resume.")
    import warnings

    from rlinf_embodied.config import ConfigWarning

    # first: a bad override is the one line; its config warnings are said once the resume is
    # accepted (a refused one ends in its error line alone)
    with warnings.catch_warnings(record=True) as held:
        warnings.simplefilter("always", ConfigWarning)
        cfg = load_config(run_dir / "config.yaml", overrides)
    with warnings.catch_warnings():  # warned once, for the config that runs
        warnings.simplefilter("ignore", ConfigWarning)
        saved = load_config(run_dir / "config.yaml")
    moved = [f"run.{k}={getattr(cfg.run, k)}" for k in ("name", "dir", "output_dir")
             if getattr(cfg.run, k) != getattr(saved.run, k)]
    if moved:  # the run stays in run_dir; its config.yaml would name another place
        raise ConfigError(
            f"--resume {resume}: {', '.join(moved)} cannot change on resume (a resumed run stays "
            f"in {run_dir}); drop the override, or copy the run first (cp -r {run_dir} NEW) and "
            f"resume the copy."
        )
    recorded = Path(saved.run.run_dir())  # a copied or moved pipeline goes on from its own SFT
    cfg, saved = _rebased(cfg, recorded, run_dir), _rebased(saved, recorded, run_dir)
    if config:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConfigWarning)
            given = _rebased(load_config(config, overrides), recorded, run_dir)
        # where the run lives may differ; what it does (run.seed included) may not
        skip = ("run.name", "run.output_dir", "run.dir") + (
            ("trainer.pipeline_stages",) if given.placement == "auto" else ())
        diff = config_diff(given, cfg, skip)
        if diff:
            diff.sort(key=lambda d: not d.split(":")[0].endswith(".type"))  # variants first
            shown = "; ".join(diff[:6]) + (f"; and {len(diff) - 6} more" if len(diff) > 6 else "")
            raise ConfigError(
                f"{config} is not the config of run {run_dir} ({len(diff)} setting(s) differ, "
                f"given -> the run's: {shown}); "
                f"resume with `train --resume {run_dir} [key=value ...]` (the run's own "
                f"config.yaml plus overrides), or drop --resume to start a new run."
            )
    ckpt = latest_loadable_checkpoint(run_dir, warn=lambda m: typer.secho(m, fg=typer.colors.YELLOW, err=True))
    if ckpt is None:
        raise ConfigError(
            f"--resume {resume}: no complete checkpoint in {run_dir / 'checkpoints'} (the run "
            f"stopped before its first save); start it again without --resume."
        )
    done = json.loads((ckpt / "runner_state.json").read_text())["iteration"]
    changed = config_diff(saved, cfg, RESUME_SAFE_KEYS)
    policy_changed = [d for d in changed if d.startswith("policy.")]
    if policy_changed:  # the checkpoint's weights are of the run's policy: refuse before Ray
        raise ConfigError(
            f"--resume {resume}: {'; '.join(policy_changed)} (run's config -> override) cannot "
            f"change on resume, the checkpoint holds weights of the run's policy; drop the "
            f"policy.* override, or start a new run without --resume."
        )
    for w in held:
        warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    if done >= cfg.trainer.iterations:
        typer.echo(f"run {run_dir} has finished: checkpoint {ckpt.name} is iteration {done} of "
                   f"trainer.iterations={cfg.trainer.iterations}; nothing to do. To train "
                   f"further, pass trainer.iterations=N with N > {done}."
                   + (f" The other overrides ({', '.join(changed)}) were not applied; to train "
                      f"with them from scratch, start a new run without --resume." if changed else ""))
        return cfg, run_dir, None
    if changed:
        _warn("resuming with changed settings " + ", ".join(changed)
              + "; the result will differ from an uninterrupted run.")
    t_old, t_new = saved.trainer, cfg.trainer
    if t_new.lr_schedule != "constant" and t_new.iterations != t_old.iterations:
        from rlinf_embodied.algorithms.update import lr_lambda

        before = lr_lambda(t_old.lr_schedule, t_old.iterations)(done)
        after = lr_lambda(t_new.lr_schedule, t_new.iterations)(done)
        _warn(f"trainer.lr_schedule={t_new.lr_schedule} spans trainer.iterations: changing it "
              f"from {t_old.iterations} to {t_new.iterations} moves the schedule, so the LR at "
              f"iteration {done + 1} (the first resumed one) becomes {after:.3f} x trainer.lr instead of {before:.3f} x.")
    return cfg, run_dir, ckpt


@app.command()
def train(
    config: Optional[str] = typer.Argument(
        None, help="Job YAML path, or a shipped config's name from any directory (e.g. maniskill_pushcube_ppo_mlp; omit with --resume)"
    ),
    overrides: Optional[List[str]] = typer.Argument(None, help="key=value overrides"),
    resume: Optional[str] = typer.Option(
        None, "--resume", help="Run directory to continue from its newest complete checkpoint; "
        "its saved config.yaml is the base, key=value overrides apply on top (e.g. "
        "trainer.iterations=300). A CONFIG given too must be that run's config (else an error)."
    ),
) -> None:
    """Train a policy with RL (env, rollout and actor workers on Ray, placement from config).

    Exits 0 when the run ends (all iterations, trainer.max_time_s, or a finished run resumed),
    130 after Ctrl-C or SIGTERM (the current iteration finishes and a checkpoint is saved, for
    a reasoning job the model in RUN_DIR/model; a second Ctrl-C aborts without saving), 2 for a configuration error, 1 when the
    run is lost (a worker's error, or a lost rank or node after trainer.max_restarts restarts
    from the last checkpoint, or with no capacity left). The last lines always say which
    checkpoint holds the run.

    Devices: the placement gets each node's GPUs (as Ray counts them); a node without GPUs
    gives 1 CPU device unless ``cluster.num_cpu_devices=N`` gives it N (what ``plan --devices N``
    plans for).
    """
    from rlinf_embodied.config import ConfigError, check_repeated_overrides, load_config
    from rlinf_embodied.reasoning.config import is_reasoning_job
    from rlinf_embodied.runners.signals import StopSignals

    signals = StopSignals().install()  # before anything else: a Ctrl-C in startup is reported
    overrides = list(overrides or [])
    try:
        check_repeated_overrides(overrides)
        if config and not resume:
            _refuse_sft_pipeline(config, "train")
    except ConfigError as e:
        signals.restore()
        _fail(str(e))
    if config and not resume and is_reasoning_job(config):
        from rlinf_embodied.reasoning.cli import train_reasoning

        try:
            code = train_reasoning(config, overrides, _fail, short_error, signals)
        finally:
            signals.restore()
        raise typer.Exit(code)
    if config and "=" in config and not Path(config).exists():
        overrides.insert(0, config)  # `train --resume RUN key=value`: no CONFIG given
        config = None
    run_dir: Optional[Path] = None
    runner = None
    try:
        try:
            ckpt = None
            if resume:
                cfg, run_dir, ckpt = _resume_config(config, overrides, resume)
                if ckpt is None:
                    raise typer.Exit(0)  # finished already (said so)
            else:
                if not config:
                    raise ConfigError("Pass a job YAML (e.g. configs/maniskill_pushcube_ppo_mlp.yaml) "
                                      "or --resume RUN_DIR.")
                cfg = load_config(config, overrides)
                run_dir = fresh_run_dir(cfg.run.run_dir())
            from rlinf_embodied.runners.setup import check_policy_paths, validate_job

            check_policy_paths(cfg)  # first: it needs neither torch nor the simulators
            validate_job(cfg)
            signals.check()  # a Ctrl-C swallowed while the simulators were imported
            if not resume:  # starting from an SFT checkpoint: the step-0 gate re-evaluates it
                from rlinf_embodied.checkpoint import unwritable
                from rlinf_embodied.sft.gate import GateError, gate_for_job

                why = unwritable(run_dir)
                if why:
                    raise ConfigError(f"Cannot write the run directory {run_dir} ({why}); set "
                                      "run.dir=PATH to a writable folder.")

                try:
                    gate_for_job(cfg, run_dir, log=typer.echo)
                except GateError as e:
                    _fail(str(e), code=3)
            from rlinf_embodied.runners.embodied import EmbodiedRunner

            extra = {"signals": signals, "checkpoint": ckpt}
            if cfg.elastic.enabled:  # elastic rollout: rlinf_embodied/elastic/runner.py
                from rlinf_embodied.elastic.runner import ElasticEmbodiedRunner as EmbodiedRunner
            signals.check()
            typer.echo(f"run directory: {run_dir}")
            runner = EmbodiedRunner(cfg, run_dir, resume=bool(resume), **extra)
        except typer.Exit:
            raise
        except ConfigError as e:
            _fail(str(e))
        except KeyboardInterrupt:
            report_saved(None, run_dir, "interrupted")
            raise typer.Exit(130)
        except Exception as e:  # noqa: BLE001 - a worker failed to start: say what, not a traceback
            _fail(short_error(e) + start_hint(e), code=1)
        try:
            runner.run()
        except KeyboardInterrupt:  # a Ctrl-C while the workers shut down
            runner.interrupted = True
        except Exception as e:  # noqa: BLE001 - a worker died mid-run: say what, and what is saved
            typer.secho(f"error: {short_error(e)}", fg=typer.colors.RED, err=True)
            report_saved(runner, run_dir, "failed")
            from rlinf_embodied.runners.restarts import RayGoneError, exit_now

            if isinstance(e, RayGoneError):  # Ray's exit hooks would hang on the dead cluster
                exit_now(1)
            raise typer.Exit(1)
        how = how_it_ended(runner, signals)
        report_saved(runner, run_dir, how)
        if runner.interrupted:
            raise typer.Exit(130)
    finally:
        signals.restore()


@app.command()
def plan(
    config: str = typer.Argument(..., help="Job YAML path, or a shipped config's name (e.g. maniskill_pushcube_ppo_mlp)"),
    overrides: Optional[List[str]] = typer.Argument(None, help="key=value overrides"),
    devices: Optional[int] = typer.Option(None, "--devices", min=1, help="Plan for this many devices."),
    json_output: bool = typer.Option(False, "--json", help="Machine-readable output."),
) -> None:
    """Choose placement (temporal / spatial / hybrid) and granularity from profiles.

    With cluster.address=HOST:PORT it attaches to that Ray cluster to list its reserved and
    preemptible nodes; otherwise it plans for this machine."""
    from rlinf_embodied.config import ConfigError, check_repeated_overrides
    from rlinf_embodied.cli_plan import plan_command
    from rlinf_embodied.runtime import AttachError

    try:
        check_repeated_overrides(overrides or [])
        _refuse_sft_pipeline(config, "plan")
        typer.echo(plan_command(config, devices, json_output, overrides or []))
    except (ConfigError, ValueError, AttachError) as e:
        _fail(str(e))


@envs_app.command("list")
def envs_list() -> None:
    """Print registered environment ids with a one-line description."""
    from rlinf_embodied.envs.registry import describe_envs

    rows = describe_envs()
    width = max((len(i) for i, _ in rows), default=0)
    columns = shutil.get_terminal_size((100, 24)).columns
    for env_id, desc in rows:  # descriptions wrap under themselves at the terminal's width
        if columns >= width + 30:
            typer.echo(textwrap.fill(desc, columns, initial_indent=f"{env_id:<{width}}  ",
                                     subsequent_indent=" " * (width + 2)))
        else:  # too narrow for two columns: the id, then its description indented below it
            typer.echo(env_id)
            typer.echo(textwrap.fill(desc, max(columns, 24), initial_indent="    ",
                                     subsequent_indent="    "))


def _reflowed(doc: str) -> str:
    """A command docstring with each paragraph on one line (list items and indented lines kept
    on their own). typer's rich help keeps the line breaks of every paragraph after the first,
    so a docstring wrapped at 100 columns and then re-wrapped at the terminal's width showed
    short broken lines."""
    out: list = []
    for para in doc.split("\n\n"):
        lines: list = []
        for line in para.splitlines():
            item = line.startswith(("- ", "* ", " ")) or re.match(r"\d+[.)] ", line) is not None
            if lines and not item:
                lines[-1] += " " + line.strip()
            else:
                lines.append(line)
        out.append("\n".join(lines))
    return "\n\n".join(out).replace("``", "`")  # reST literals read as markdown code


def _reflow_help(group: typer.Typer, _seen: Optional[set] = None) -> None:
    """Every command of ``group`` (and its sub-groups) with no explicit help gets its
    docstring :func:`_reflowed`; square brackets in it and in its options' help are escaped
    (typer renders help as rich markup, where ``'state_keys=[pos, goal]'`` printed as
    ``'state_keys='``)."""
    import inspect

    from rich.markup import escape

    seen = set() if _seen is None else _seen  # arguments shared between commands: escape once
    infos = [*group.registered_commands, *filter(None, [group.registered_callback])]
    for info in infos:
        if info.callback is None:
            continue
        if info.help is None and info.callback.__doc__ and info in group.registered_commands:
            info.help = escape(_reflowed(inspect.getdoc(info.callback)))
        for param in inspect.signature(info.callback).parameters.values():
            default = param.default
            if isinstance(default, typer.models.ParameterInfo) and default.help and id(default) not in seen:
                seen.add(id(default))
                default.help = escape(default.help)
    for sub in group.registered_groups:
        if sub.typer_instance is not None:
            _reflow_help(sub.typer_instance, seen)


_reflow_help(app)


def _command_path(argv: Optional[List[str]]) -> str:
    """``rlinf-embodied eval compare`` for ``argv`` (default: ``sys.argv[1:]``) naming that
    command: the subcommand names it starts with (click leaves an option's missing value
    without the command's context)."""
    command = typer.main.get_command(app)
    path = ["rlinf-embodied"]
    for word in sys.argv[1:] if argv is None else argv:
        sub = getattr(command, "commands", {}).get(word)
        if sub is None:
            break
        command = sub
        path.append(word)
    return " ".join(path)


def run(argv: Optional[List[str]] = None) -> None:
    """The console entry point (``rlinf-embodied``, ``python -m rlinf_embodied.cli``): ``app``,
    with click's command-line errors (an unknown option, a value that does not parse, a missing
    argument) as one ``error:`` line naming the command's ``--help`` (exit 2), like every other
    bad input, instead of typer's boxed panel. A command group called bare still prints its
    help."""
    # click's exception classes, from typer's own copy of click (typer >= 0.2x vendors it)
    usage_error = typer.BadParameter.__mro__[1]
    module = sys.modules[usage_error.__module__]
    no_args = getattr(module, "NoArgsIsHelpError", ())
    try:
        code = app(args=argv, standalone_mode=False)
    except no_args as e:
        e.show()
        sys.exit(e.exit_code)
    except usage_error as e:
        path = e.ctx.command_path if e.ctx is not None else _command_path(argv)
        hint = (" (train uses the CUDA devices it sees, or cluster.num_cpu_devices=N on CPU)"
                if getattr(e, "option_name", None) == "--devices" and path.endswith(" train")
                else "")  # plan's option given to train
        _print_error(f"{e.format_message()}{hint} (see '{path} --help')")
        sys.exit(e.exit_code)
    except module.ClickException as e:
        _print_error(e.format_message())
        sys.exit(e.exit_code)
    except typer.Abort:
        typer.echo("Aborted.", err=True)
        sys.exit(1)
    sys.exit(code if isinstance(code, int) else 0)


if __name__ == "__main__":  # pragma: no cover
    run()
