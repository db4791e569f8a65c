"""``rlinf-embodied eval``: evaluate a policy under a named protocol; ``eval compare A B``.

Wire into the main CLI with ``app.add_typer(eval_app, name="eval")``. The group's callback
runs the evaluation when no subcommand is given, so both of these work::

    rlinf-embodied eval --env libero --suite libero_spatial --policy runs/x --tasks 0,3
    rlinf-embodied eval compare a.json b.json [--force]
    rlinf-embodied eval protocols

Importing this module imports typer only; the machinery is imported when a command runs.
"""

from __future__ import annotations

import re
import shutil
import textwrap
from typing import List, Optional

import typer

__all__ = ["eval_app", "eval_command", "compare_command", "protocols_command", "parse_tasks"]

eval_app = typer.Typer(
    help="Evaluate a policy under a named, versioned protocol (LIBERO, ManiSkill, gymnasium).",
    invoke_without_command=True,
    no_args_is_help=False,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _fail(msg: str, code: int = 2) -> None:
    typer.secho(f"error: {msg}", fg=typer.colors.RED, err=True)
    raise typer.Exit(code)


# Config and protocol field names that `eval` sets from its flags: its errors name the flag.
_FIELD_FLAGS = {
    "env.env_id": "--task",
    "env.max_episode_steps": "--max-steps",
    "env.sensor_size": "--image-size",
    "trials_per_task": "--trials-per-task",
    "num_settle_steps": "--num-settle-steps",
    "max_steps": "--max-steps",
    "image_size": "--image-size",
}
_FIELD_RE = re.compile(r"(?<![\w.-])(" + "|".join(map(re.escape, _FIELD_FLAGS)) + r")(?![\w])")


def flag_names(msg: str) -> str:
    """``msg`` with the config/protocol fields that ``eval`` flags set renamed to the flags
    (``trials_per_task must be >= 1`` -> ``--trials-per-task must be >= 1``)."""
    return _FIELD_RE.sub(lambda m: _FIELD_FLAGS[m.group(1)], msg)


def parse_tasks(text: Optional[str]) -> Optional[List[int]]:
    """``"0,3,5"`` or ``"0-4"`` -> task ids; None or ``"all"`` -> None (every task).

    Raises:
        ValueError: for anything else, with the accepted forms.
    """
    if text is None or text.strip().lower() == "all":
        return None
    out: List[int] = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        lo, sep, hi = part.partition("-")
        if not (lo.isdigit() and (hi.isdigit() if sep else True)):
            raise ValueError(
                f"--tasks {text!r} is not a list of task ids; use e.g. 0,3 or 0-4 or all.")
        if sep and int(hi) < int(lo):
            raise ValueError(f"--tasks {text!r}: the range {part} is reversed; write {hi}-{lo}.")
        out.extend(range(int(lo), int(hi if sep else lo) + 1))
    if not out:
        raise ValueError(f"--tasks {text!r} names no task; use e.g. 0,3 or 0-4, or leave it out "
                         "for all.")
    return out


def parse_env_overrides(items: List[str]) -> dict:
    """``--env-override KEY=VALUE`` arguments as a dict (each VALUE parsed as YAML)."""
    import yaml

    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            _fail(f"--env-override {item!r} is not KEY=VALUE (e.g. --env-override 'kwargs={{speed: 0.2}}').")
        try:
            out[key.strip()] = yaml.safe_load(value)
        except yaml.YAMLError as e:
            _fail(f"--env-override {key}: {value!r} is not a YAML value ({e.problem}); a mapping "
                  "needs a space after each colon, e.g. 'kwargs={speed: 0.2}'.")
    return out


@eval_app.callback(invoke_without_command=True)
def eval_command(
    ctx: typer.Context,
    env: Optional[str] = typer.Option(
        None, "--env", help="libero, maniskill, gym, or a user's env type package.module:Class (default: a training run's env.type, else the env of --suite or of a named --task)."),
    suite: Optional[str] = typer.Option(None, "--suite", help="A task suite: LIBERO (libero_spatial, ...) or ManiSkill (maniskill_lang3); `envs list` lists them."),
    task: Optional[str] = typer.Option(None, "--task", help="ManiSkill/gym env id, e.g. PushCube-v1 (or as `envs list` writes it, maniskill/PushCube-v1)."),
    policy: Optional[str] = typer.Option(
        None, "--policy",
        help="Run or checkpoint directory (an SFT stage's <run>/sft/policy too), a published "
             "OpenVLA / OFT / pi0 / pi05 directory, 'random', or module:function. A run directory means its latest checkpoint (see --checkpoint)."),
    checkpoint: str = typer.Option(
        "latest", "--checkpoint",
        help="Which checkpoint of a run directory: latest (the newest complete one) or best "
             "(checkpoints/best: the policy of the run's best in-training evaluation, on seeds "
             "from eval.seed_offset, not the protocol's)."),
    run_trials: bool = typer.Option(
        False, "--run-trials",
        help="With a training run's --policy: evaluate the trials of the run's in-training "
             "evaluation (seeds from its eval.seed_offset, the episode count of its "
             "eval/latest.json, fixed-length episodes) so that the results pair trial by trial "
             "with its eval/iter_*.json (ManiSkill and gym runs; recorded as protocol overrides)."),
    protocol: Optional[str] = typer.Option(
        None, "--protocol", help="Protocol name (default: the suite's, e.g. openvla_v1 "
                                 "or maniskill_lang3_v1; maniskill_fair_v1 for a ManiSkill task; "
                                 "seeded_v1 for gym); see `eval protocols`."),
    tasks: Optional[str] = typer.Option(None, "--tasks", help="Task ids of the --suite: 0,3 or 0-4 (default all)."),
    trials_per_task: Optional[int] = typer.Option(
        None, "--trials-per-task", help="Trials 0..n-1 of each task (default: the protocol's)."),
    num_envs: int = typer.Option(
        8, "--num-envs",
        help="Envs run concurrently. Per-episode results (actions, returns, success) do not "
             "depend on it or on --num-processes without --no-batch-invariant on one "
             "device, where each env simulates on its own and resets fully (ManiSkill CPU "
             "physics, LIBERO with its default hard resets, gymnasium; not ManiSkill's GPU "
             "physics, which steps all envs together)."),
    num_processes: Optional[int] = typer.Option(
        None, "--num-processes", help="Env pool processes (default min(num_envs, CPUs); 0 = in-process)."),
    video: str = typer.Option("none", "--video", help="none, failures or all."),
    output: str = typer.Option("results.json", "--output", "-o", help="Results JSON (resumed if it exists)."),
    obs_mode: str = typer.Option("auto", "--obs-mode", help="rgb, state or auto."),
    max_steps: Optional[int] = typer.Option(None, "--max-steps", help="Override the protocol's max steps (recorded)."),
    num_settle_steps: Optional[int] = typer.Option(
        None, "--num-settle-steps", help="Override the protocol's settle steps (recorded)."),
    image_size: Optional[int] = typer.Option(None, "--image-size", help="Override the protocol's image size (recorded)."),
    policy_mode: Optional[str] = typer.Option(
        None, "--policy-mode",
        help="greedy (the distribution's mode, every protocol's default) or sample (draws from "
             "it as RL rollouts do, seeded per trial and query from the protocol's global_seed); "
             "recorded."),
    policy_type: Optional[str] = typer.Option(
        None, "--policy-type", help="Policy type the checkpoint must hold (mlp, cnn, openvla, openvla_oft, pi0, pi05)."),
    device: Optional[str] = typer.Option(None, "--device", help="Policy device (default cuda if available)."),
    no_batch_invariant: bool = typer.Option(
        False, "--no-batch-invariant",
        help="Run one batched forward per query (faster for large policies; episodes may then "
             "differ with --num-envs). By default the policy sees each env's observation alone "
             "(a batch of 1), so its float rounding, hence every episode, is the same for any "
             "--num-envs. Recorded in the results."),
    no_report: bool = typer.Option(False, "--no-report", help="Write only the results JSON (by default also .md/.png/.html beside it)."),
    env_override: List[str] = typer.Option(
        [], "--env-override",
        help="KEY=VALUE env setting, VALUE in YAML (repeatable; recorded in env_config), e.g. "
             "'kwargs={speed: 0.2}', 'state_keys=[pos, goal]', 'image_keys={cam: main_images}', "
             "control_mode=pd_ee_delta_pose. A training run's own settings are used unless set."),
) -> None:
    """Evaluate a policy; every (task, trial) runs once, resumable from --output."""
    if ctx.invoked_subcommand is not None:
        return
    if task:  # an id as `envs list` prints it names its env (maniskill/PushCube-v1, toy/...)
        from rlinf_embodied.envs.registry import env_entry

        entry, kind = env_entry(task), task.partition("/")[0]
        named = entry.defaults.get("type") if entry and "env_id" in entry.defaults else None
        if named and env not in (None, named):
            _fail(f"--task {task} is a {named} env (`envs list`); pass --env {named} or leave "
                  "--env out.")
        if named:
            env, task = named, entry.defaults["env_id"]
        elif kind in ("gym", "maniskill") and env in (None, kind):
            env, task = kind, task[len(kind) + 1:]  # maniskill/PushCube-v1: the env's own id
    if policy is None:  # without --env too: a training run given as --policy names its env
        if env is None:
            typer.echo(ctx.get_help())  # a bare `eval`: show what it takes
        missing = "--policy" if env is not None else "--env and --policy"
        example = ("--env maniskill --task PushCube-v1" if env == "maniskill"
                   else "--env libero --suite libero_spatial")
        _fail(f"{missing} {'are' if ' and ' in missing else 'is'} required (e.g. {example} "
              f"--policy random).")
    from rlinf_embodied.eval.policy_files import missing_source

    if (why := missing_source(policy)) is not None:  # before any env is built (a minute)
        _fail(why)
    if max_steps is not None and max_steps < 1:  # before the protocol's "or null" wording
        _fail(f"--max-steps must be >= 1 (got {max_steps}); leave it out for the protocol's own.")
    if image_size is not None and image_size < 1:
        _fail(f"--image-size must be >= 1 pixel (got {image_size}); leave it out for the protocol's own.")
    from rlinf_embodied.eval.policy_files import PolicySourceError
    from rlinf_embodied.eval.protocols import ProtocolError
    from rlinf_embodied.eval.request import EvalError, EvalRequest
    from rlinf_embodied.eval.results import ResultsError
    from rlinf_embodied.eval.run import evaluate
    from rlinf_embodied.envs.base import EnvError, EnvWarning
    from rlinf_embodied.config.errors import one_line_warnings

    one_line_warnings((EnvWarning,), lambda text: typer.secho(text, fg=typer.colors.YELLOW, err=True))

    def progress(done: int, total: int, ep) -> None:
        status = "ok  " if ep.success else ("ERR " if ep.error else "fail")
        typer.echo(f"[{done}/{total}] task {ep.task} trial {ep.trial}: {status} "
                   f"{ep.steps} steps" + (f"  {ep.error}" if ep.error else ""), err=True)

    overrides = parse_env_overrides(env_override)
    try:
        req = EvalRequest(
            env=env, policy=policy, suite=suite, task=task, protocol=protocol,
            tasks=parse_tasks(tasks), trials_per_task=trials_per_task, num_envs=num_envs,
            num_processes=num_processes, video=video, output=output, obs_mode=obs_mode,
            max_steps=max_steps, num_settle_steps=num_settle_steps, image_size=image_size,
            policy_mode=policy_mode, checkpoint=checkpoint, policy_type=policy_type, device=device, reports=not no_report, progress=progress,
            batch_invariant=not no_batch_invariant, run_trials=run_trials,
            env_overrides=overrides,
        )
        results = evaluate(req)
    except (EvalError, ProtocolError, PolicySourceError, ResultsError, ValueError) as e:
        _fail(flag_names(str(e)))
    except EnvError as e:  # e.g. an env pool worker could not build its envs
        _fail(flag_names(e.summary))
    except KeyboardInterrupt:
        typer.echo(f"interrupted; finished episodes are in {output}; run the same command to "
                   "resume.", err=True)
        raise typer.Exit(130) from None
    from rlinf_embodied.eval.report import markdown_table

    typer.echo(markdown_table(results))
    typer.echo(f"results: {results.path}")
    stem = results.path.with_suffix("")
    if not no_report:
        typer.echo(f"reports: {stem}.md, {stem}.png, {stem}.html")
    videos = results.path.parent / f"{results.path.stem}_videos"
    if video != "none" and videos.is_dir():
        typer.echo(f"videos: {videos}/ (one frame per policy query, played in real time)")


@eval_app.command("compare")
def compare_command(
    baseline: str = typer.Argument(..., help="Baseline results JSON."),
    candidate: str = typer.Argument(..., help="Results JSON compared with the baseline."),
    force: bool = typer.Option(False, "--force", help="Compare even across protocols/suites."),
    json_output: Optional[str] = typer.Option(None, "--json", metavar="PATH", help="Also write the comparison as JSON to PATH."),
) -> None:
    """Per-task differences and McNemar's paired test over shared (task, trial) pairs."""
    from rlinf_embodied.eval.report import CompareError, compare, format_comparison
    from rlinf_embodied.eval.results import ResultsError

    from pathlib import Path

    if json_output:  # checked before comparing: the comparison never replaces its inputs
        out = Path(json_output)
        if out.is_dir():
            _fail(f"--json {json_output} is a directory; pass a file path, e.g. "
                  f"{out / 'comparison.json'}.")
        if any(out.resolve() == Path(f).resolve() for f in (baseline, candidate)):
            _fail(f"--json {json_output} is one of the results files compared; pass another "
                  "path, e.g. comparison.json.")
    try:
        c = compare(baseline, candidate, force=force)
    except (CompareError, ResultsError) as e:
        _fail(str(e))
    typer.echo(format_comparison(c), nl=False)
    if json_output:
        from rlinf_embodied.checkpoint import atomic_write_json

        atomic_write_json(json_output, c.to_dict())


@eval_app.command("protocols")
def protocols_command() -> None:
    """List the registered evaluation protocols."""
    from rlinf_embodied.eval.protocols import get_protocol, protocol_names

    columns = max(shutil.get_terminal_size((100, 24)).columns, 60)
    typer.echo(textwrap.fill(
        "protocol@version [env] description; then max policy steps per suite or env id, settle "
        "steps, trials per task, image size, the global seed (Python, numpy, torch), the env "
        "seed (trial i resets with env seed + i) and the packages it requires", columns))
    width = max(len(get_protocol(n).id) for n in protocol_names()) + 1
    indent = " " * (width + 1)
    for name in protocol_names():
        p = get_protocol(name)
        steps = ", ".join(f"{'any' if k == '*' else k} {v}" for k, v in p.max_steps.items()) or "env default"
        image = (f"{p.image_size} px{' rotated 180' if p.rotate_180 else ''}"
                 if p.image_size else "env default")
        requires = ", ".join(f"{k}{v}" for k, v in p.requires.items()) or "none"
        typer.echo(textwrap.fill(f"[{p.env}] {p.description}", columns,
                                 initial_indent=f"{p.id:<{width}} ", subsequent_indent=indent))
        typer.echo(textwrap.fill(
            f"max steps: {steps}; settle {p.num_settle_steps}; {p.trials_per_task} trials/task; "
            f"image {image}; global seed {p.global_seed}; env seed {p.env_seed}; requires "
            f"{requires}", columns, initial_indent=indent, subsequent_indent=indent))


if __name__ == "__main__":  # pragma: no cover
    eval_app()
