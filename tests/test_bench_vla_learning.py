"""benchmarks/bench_vla_learning.py around a stand-in pipeline (a few lines of Python, no
training): the pipeline's output is relayed while it runs, demos another run recorded are
reported as reused (not as this run's time), and a Ctrl-C is forwarded to the pipeline, which
runs in its own session and is never killed by the benchmark."""

from __future__ import annotations

import json
import os
import re
import signal
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

STAND_IN = textwrap.dedent('''
    import json, os, signal, sys, time
    from pathlib import Path

    mode, run_dir, demos = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
    record = demos / "suite" / "generation.pd_ee_delta_pose.32px.stride1.json"
    if mode == "record":
        record.parent.mkdir(parents=True, exist_ok=True)
        record.write_text(json.dumps({"wall_s": 12.5, "env_steps": 300}))
    else:
        print(f"demos: using {record.parent}", flush=True)
    if mode == "handshake":  # goes on only once the benchmark has relayed this line
        print("waiting for the relay", flush=True)
        deadline = time.monotonic() + 60
        while not (run_dir / "relayed").exists():
            if time.monotonic() > deadline:
                print("the line was not relayed while the pipeline ran", flush=True)
                sys.exit(1)
            time.sleep(0.05)
    if mode == "orphan":  # leaves a process that holds the output pipe open
        import subprocess
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        print(f"left pid={child.pid}", flush=True)
        sys.exit(0)
    if mode == "interrupt":
        def stop(signum, frame):
            print(f"got signal {signum}; stopping", flush=True)
            sys.exit(130)
        signal.signal(signal.SIGINT, stop)
        print(f"ready pid={os.getpid()} sid={os.getsid(0)}", flush=True)
        time.sleep(60)
        sys.exit(3)
    gen = json.loads(record.read_text())
    run_dir.mkdir(parents=True, exist_ok=True)
    rate = {"rate": 0.5, "ci95": [0.2, 0.8], "episodes": 4,
            "per_task": {"t0": {"rate": 0.5, "ci95": [0.2, 0.8], "episodes": 4,
                                "instruction": "push the cube"}}}
    (run_dir / "summary.json").write_text(json.dumps({
        "sft": rate, "rl": rate, "paired": {"mcnemar": {"p_value": 1.0}},
        "stages": {"demos": {"wall_s": gen["wall_s"], "env_steps": gen["env_steps"]},
                   "sft": {"wall_s": 3.0, "env_steps": 0}}}))
    print("done", flush=True)
''')


@pytest.fixture
def bench(monkeypatch, tmp_path):
    """The benchmark module, its pipeline replaced by the stand-in (``bench.mode`` picks its
    behaviour)."""
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    import bench_vla_learning as bench

    script = tmp_path / "stand_in.py"
    script.write_text(STAND_IN)
    monkeypatch.setattr(bench, "mode", "reuse", raising=False)
    monkeypatch.setattr(bench, "pipeline_command", lambda family, run_dir, demos, extra: [
        sys.executable, str(script), bench.mode, str(run_dir), str(demos)])
    return bench


class Echo:
    """A stderr stand-in that records the relayed lines (and reacts to one of them)."""

    def __init__(self, on_line=None):
        self.lines: list[str] = []
        self.on_line = on_line

    def write(self, text: str) -> None:
        self.lines.append(text)
        if self.on_line:
            self.on_line(text)

    def flush(self) -> None:
        pass


def _recorded(demos: Path, wall_s: float = 1234.5, env_steps: int = 999) -> None:
    """Demos (their generation record) that an earlier run recorded."""
    rec = demos / "suite" / "generation.pd_ee_delta_pose.32px.stride1.json"
    rec.parent.mkdir(parents=True)
    rec.write_text(json.dumps({"wall_s": wall_s, "env_steps": env_steps}))


def test_reused_demos_report_this_runs_time_and_keep_the_recording_time_apart(bench, tmp_path, monkeypatch):
    demos = tmp_path / "demos"
    _recorded(demos)
    echo = Echo()
    monkeypatch.setattr(sys, "stderr", echo)
    out = bench.run_family("pi0", tmp_path / "run", str(demos), [])
    assert "error" not in out, out
    d = out["stages"]["demos"]
    assert d["reused"] is True and d["env_steps"] == 0
    assert d["recorded_wall_s"] == 1234.5 and d["recorded_env_steps"] == 999
    assert 0 <= d["wall_s"] < 60  # this run's start up to "demos: using", not the recording
    assert out["stages"]["sft"] == {"wall_s": 3.0, "env_steps": 0}
    assert out["sft_success"] == 0.5 and out["per_task"]["push the cube"]["episodes"] == 4
    relayed = [ln for ln in echo.lines if ln.startswith("[pi0 +")]
    assert [ln.split("] ", 1)[1] for ln in relayed] == [f"demos: using {demos / 'suite'}\n", "done\n"]
    assert (tmp_path / "run" / "bench_log.txt").read_text() == f"demos: using {demos / 'suite'}\ndone\n"


def test_demos_recorded_by_this_run_keep_their_time(bench, tmp_path, monkeypatch):
    demos = tmp_path / "demos"
    demos.mkdir()
    bench.mode = "record"
    monkeypatch.setattr(sys, "stderr", Echo())
    out = bench.run_family("pi0", tmp_path / "run", str(demos), [])
    assert out["stages"]["demos"] == {"wall_s": 12.5, "env_steps": 300, "reused": False}


def test_demos_stage_leaves_stages_without_demos_alone(bench):
    assert bench.demos_stage({"sft": {"wall_s": 1.0}}, False, 2.0) == {"sft": {"wall_s": 1.0}}
    assert bench.demos_stage({"demos": {"wall_s": 9.0, "env_steps": 5}}, False, None)["demos"] == {
        "reused": True, "wall_s": None, "env_steps": 0, "recorded_wall_s": 9.0, "recorded_env_steps": 5}


def test_lines_are_relayed_while_the_pipeline_runs(bench, tmp_path):
    """The stand-in waits for its line to come out on stderr: with the output relayed only
    at the end (a captured subprocess, a pipe buffer) it would give up and exit 1."""
    _recorded(tmp_path / "demos")
    bench.mode = "handshake"
    run_dir = tmp_path / "run"
    run_dir.mkdir()

    def on_line(text: str) -> None:
        if "waiting for the relay" in text:
            (run_dir / "relayed").touch()

    res = bench.stream_pipeline(bench.pipeline_command("pi0", run_dir, tmp_path / "demos", []),
                                "pi0", run_dir / "bench_log.txt", echo=Echo(on_line),
                                env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert res["returncode"] == 0, res["tail"]
    assert res["tail"][-1] == "done" and not res["interrupted"]


def test_ctrl_c_is_forwarded_to_the_pipeline_in_its_own_session(bench, tmp_path):
    """A SIGINT to the benchmark reaches the pipeline (which runs in a session of its own, so
    a terminal's Ctrl-C reaches it once, through the benchmark); the benchmark waits for it
    to stop instead of killing it, and restores its own handler."""
    bench.mode = "interrupt"
    before = signal.getsignal(signal.SIGINT)
    seen: dict = {}

    def on_line(text: str) -> None:
        if "ready pid=" in text:
            fields = dict(f.split("=") for f in text.split("] ", 1)[1].split()[1:])
            seen.update(pid=int(fields["pid"]), sid=int(fields["sid"]))
            os.kill(os.getpid(), signal.SIGINT)  # the Ctrl-C, to this (the benchmark's) process

    res = bench.stream_pipeline(bench.pipeline_command("pi0", tmp_path / "run", tmp_path, []),
                                "pi0", tmp_path / "run" / "bench_log.txt", echo=Echo(on_line))
    assert seen["sid"] == seen["pid"] != os.getsid(0)
    assert res["interrupted"] and res["returncode"] == 130
    assert res["tail"][-1] == f"got signal {int(signal.SIGINT)}; stopping"
    assert signal.getsignal(signal.SIGINT) is before


def test_a_process_the_pipeline_left_does_not_hang_the_relay(bench, tmp_path, monkeypatch):
    bench.mode = "orphan"
    monkeypatch.setattr(bench, "PIPE_GRACE_S", 0.5)
    res = bench.stream_pipeline(bench.pipeline_command("pi0", tmp_path / "run", tmp_path, []),
                                "pi0", tmp_path / "run" / "bench_log.txt", echo=Echo())
    left = int(res["tail"][-1].split("left pid=")[1])
    try:
        assert res["returncode"] == 0 and res["wall_s"] < 30
    finally:
        os.kill(left, signal.SIGKILL)


def test_a_failed_pipeline_gives_its_error_in_the_json_line_and_exit_status_1(bench, tmp_path,
                                                                              monkeypatch, capsys):
    bench.mode = "fail"  # no demos record: the stand-in pipeline crashes (exit 1)
    monkeypatch.setattr(sys, "argv", ["bench_vla_learning.py", "--family", "pi0", "--out",
                                      str(tmp_path / "out"), "--demos", str(tmp_path / "demos")])
    monkeypatch.setattr(sys, "stderr", Echo())
    with pytest.raises(SystemExit) as e:
        bench.main()
    assert e.value.code == 1
    line = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert line["families"]["pi0"]["error"].startswith("sft-rl exited 1")


def test_suite_selects_the_pipeline_configs_and_refuses_a_family_without_one(monkeypatch, capsys):
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    import bench_vla_learning as bench

    assert bench.suite_families("maniskill_lang3") == ["openvla", "openvla_oft", "pi0", "pi05"]
    assert bench.suite_families("maniskill_lang3_peg") == ["openvla", "openvla_oft"]
    assert bench.config_path("openvla_oft", "maniskill_lang3_peg") == \
        "configs/sft/maniskill_lang3_peg_sft_rl_oft.yaml"
    monkeypatch.setattr(bench, "SUITE", "maniskill_lang3_peg")
    cmd = bench.pipeline_command("openvla", Path("r"), "d", [])
    assert cmd[4] == "configs/sft/maniskill_lang3_peg_sft_rl_openvla.yaml"
    with pytest.raises(SystemExit) as e:
        bench.config_path("pi0", "maniskill_lang3_peg")
    assert e.value.code == 2  # bad input, as the CLI's config errors
    assert re.fullmatch(r"error: suite maniskill_lang3_peg has no pi0 pipeline .*its "
                        r"families: openvla, openvla_oft\.\n", capsys.readouterr().err)


def test_summarizing_an_unfinished_pipeline_is_bad_input(monkeypatch, capsys, tmp_path):
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    import bench_vla_learning as bench

    (tmp_path / "sft").mkdir()  # SFT saved, no summary.json yet
    monkeypatch.setattr(sys, "argv", ["bench_vla_learning.py", "--summarize", str(tmp_path)])
    with pytest.raises(SystemExit) as e:
        bench.main()
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {tmp_path} has no summary.json") and "finetune" in err
    for d, says in ((tmp_path / "none", "does not exist"), (tmp_path / "sft", "is not an SFT -> RL")):
        monkeypatch.setattr(sys, "argv", ["bench_vla_learning.py", "--summarize", str(d)])
        with pytest.raises(SystemExit) as e:
            bench.main()
        assert e.value.code == 2 and says in capsys.readouterr().err


@pytest.mark.parametrize("suite", ["maniskill_lang3", "maniskill_lang3_peg"])
def test_quick_settings_give_every_family_a_valid_pipeline(monkeypatch, tmp_path, suite):
    # --quick's overrides must pass the checks the pipeline runs before any stage (they broke
    # once: the RL stage's rollout no longer covered --quick's 24-step episodes)
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    import bench_vla_learning as bench
    from rlinf_embodied.sft.pipeline import load_sft_config, validate_rl_stage

    monkeypatch.chdir(ROOT)
    for family in bench.suite_families(suite):
        cfg = load_sft_config(bench.config_path(family, suite),
                              [*bench.QUICK, bench.QUICK_IMAGE[family], f"run.dir={tmp_path}"])
        job = validate_rl_stage(cfg)
        assert job.env.max_episode_steps == cfg.env.max_episode_steps == 24, family
        assert job.trainer.iterations == 2 and job.env.num_envs == 4, family
