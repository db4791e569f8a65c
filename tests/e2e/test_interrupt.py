"""Ctrl-C during `rlinf-embodied train`, delivered twice (to the process, then to its process
group, as `timeout -s INT` does): the run finishes its iteration, saves, says so, exits 130, and
`--resume` continues it, and resuming the finished run says so. Real CLI processes, each with
its own embedded Ray (a few minutes on 2 cores)."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

ROOT = Path(__file__).resolve().parents[2]
EXE = Path(sys.executable).parent / "rlinf-embodied"
JOB = ["configs/gym_pointreach_ppo_mlp.yaml", "trainer.iterations=40", "trainer.save_every=100",
       "trainer.eval_every=100", "trainer.rollout_steps=20", "env.num_envs=4",
       "logging.tensorboard=false", "cluster.num_cpus=2",
       "env.vectorization=async", "env.num_processes=1"]  # an env pool process gets SIGINT too


RAY_START_TIMEOUT = "timed out during startup"
"""Ray's own error when its raylet does not register within its fixed 30 s (an overloaded
machine); such a start is retried, anything else fails the test."""


def _run(cmd):
    for _ in range(3):
        done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
        if RAY_START_TIMEOUT not in done.stdout + done.stderr:
            break
    return done


def _start(args, cwd):
    return subprocess.Popen([str(EXE), "train", *args], cwd=cwd, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)


def _started(args, run_dir: Path, timeout_s=600.0):
    """A train process that has finished its first iteration."""
    for _ in range(3):
        proc = _start(args, ROOT)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            m = run_dir / "metrics.jsonl"
            if m.exists() and m.read_text().strip():
                return proc
            if proc.poll() is not None:
                break
            time.sleep(0.5)
        else:
            proc.kill()
            raise AssertionError("no iteration finished in time")
        out = proc.stdout.read()
        if RAY_START_TIMEOUT not in out:
            raise AssertionError(f"train exited {proc.returncode} early:\n{out}")
    raise AssertionError("Ray did not start in 3 tries")


def _running(p: psutil.Process) -> bool:
    try:
        return p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _cmdlines(procs) -> list[str]:
    out = []
    for p in procs:
        try:
            out.append(f"{p.pid} {' '.join(p.cmdline())[:80]}")
        except psutil.Error:
            out.append(str(p.pid))
    return out


@pytest.mark.slow
def test_double_sigint_saves_and_resumes(tmp_path):
    run_dir = tmp_path / "runs" / "x"
    proc = _started(JOB + ["run.name=x", f"run.output_dir={tmp_path / 'runs'}"], run_dir)
    # Ray's GCS, raylet, agents and workers, the env pool's fork server and workers
    children = psutil.Process(proc.pid).children(recursive=True)
    os.kill(proc.pid, signal.SIGINT)
    os.killpg(proc.pid, signal.SIGINT)  # the same Ctrl-C again, to the whole group (Ray too)
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 130, out
    _, alive = psutil.wait_procs(children, timeout=30)
    alive = [p for p in alive if _running(p)]  # a zombie waits for its (new) parent to reap it
    assert not alive, f"left running after the interrupted run: {_cmdlines(alive)}"
    assert "Traceback" not in out, out
    # issue 15 item 15: neither Ray's token notice nor FSDP2's view warning
    assert "Token authentication is enabled" not in out and "view tensor" not in out, out
    latest = (run_dir / "checkpoints" / "latest").read_text().strip()
    state = json.loads((run_dir / "checkpoints" / latest / "runner_state.json").read_text())
    assert 1 <= state["iteration"] < 40
    assert f"checkpoint: {run_dir / 'checkpoints' / latest}" in out, out
    hint = next(ln for ln in out.splitlines() if ln.startswith("continue with: "))
    cmd = hint.removeprefix("continue with: ").split() + ["trainer.iterations=" + str(state["iteration"] + 1)]
    assert Path(cmd[0]).resolve() == EXE.resolve() or cmd[0] == sys.executable, cmd
    done = _run(cmd)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"resuming from {run_dir / 'checkpoints' / latest}" in done.stdout
    # the final evaluation (and its videos) is said before it runs, not after
    assert f"iteration {state['iteration'] + 1}: evaluating " in done.stdout, done.stdout
    assert (run_dir / "checkpoints" / "latest").read_text().strip() == f"iter_{state['iteration'] + 1:06d}"
    again = _run(cmd)
    assert again.returncode == 0 and "has finished" in again.stdout, again.stdout + again.stderr


@pytest.mark.parametrize("kill", [pytest.param(("raylet",), marks=pytest.mark.slow),  # ~50 s
                                  ("raylet", "gcs_server")],
                         ids=["driver_raylet", "whole_cluster"])
def test_lost_ray_cluster_ends_the_run_with_what_is_saved(tmp_path, kill):
    """The run's own Ray dies under it (its raylet, or raylet and GCS as `ray stop` does): no
    restart can help, so the run says at once what is saved and how to resume, and leaves no
    process behind; it does not wait trainer.restart_wait_s for capacity (it used to, 300 s;
    with the GCS gone Ray then aborted the process 60 s in, before anything was said)."""
    run_dir = tmp_path / "runs" / "x"
    job = [a for a in JOB if not a.startswith("trainer.save_every=")]
    proc = _started(job + ["run.name=x", f"run.output_dir={tmp_path / 'runs'}",
                           "trainer.save_every=1", "trainer.restart_wait_s=3000"], run_dir)
    children = {p: p.name() for p in psutil.Process(proc.pid).children(recursive=True)}
    for p, name in children.items():
        if name in kill:
            p.kill()
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 1, out
    assert "no group can start again from this process" in out, out
    assert "waiting up to" not in out and "Failed to connect to GCS" not in out, out
    latest = (run_dir / "checkpoints" / "latest").read_text().strip()
    assert f"checkpoint: {run_dir / 'checkpoints' / latest}" in out, out
    assert f"train --resume {run_dir}" in out, out
    # Ray's agents, children of the killed raylet, are not this process's to kill any more:
    # they end by themselves after Ray's 60 s GCS reconnect timeout (measured: gone within 90 s)
    children = [p for p, name in children.items() if not name.endswith("Agent")]
    _, alive = psutil.wait_procs(children, timeout=30)
    alive = [p for p in alive if _running(p)]
    assert not alive, f"left running after the lost cluster: {_cmdlines(alive)}"
