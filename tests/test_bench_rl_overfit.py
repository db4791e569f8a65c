"""benchmarks/bench_rl_overfit.py end to end on the state-MLP PushCube GRPO config (a real
ManiSkill env pool, the real update), and its one-line refusals of bad input."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "bench_rl_overfit.py"


def _run(*args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT)


def test_overfit_check_runs_the_update_on_one_state(tmp_path):
    pytest.importorskip("mani_skill")
    r = _run("--quick", "--num-envs", "4", "--num-states", "2", "--iterations", "2",
             "--save", str(tmp_path / "pol"), "--set", "env.num_processes=0")
    assert r.returncode == 0, r.stderr[-2000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["num_envs"] == 4 and out["task"] == ["push the cube to the goal region"] * 2
    assert out["num_states"] == 2
    for when in ("before", "after"):  # two groups of 2: success in {0, 0.5, 1} each
        assert len(out["success_per_state"][when]) == 2
        assert all(v in (0.0, 0.5, 1.0) for v in out["success_per_state"][when])
    assert len(out["success"]) == len(out["return"]) == len(out["valid_fraction"]) == 2
    # dynamic sampling is off, so the one group enters every update (dense reward: a gradient)
    assert out["valid_fraction"] == [1.0, 1.0]
    assert all(k > 0 for k in out["approx_kl"][1:])  # after an update the policy has moved
    assert all(d is not None and d < 1e-5 for d in out["logprob_diff_max"])
    assert 0.0 <= out["greedy_after"] <= 1.0
    assert (tmp_path / "pol" / "model.safetensors").is_file()
    # the job config travels with it, so `eval --policy DIR` finds the env it was trained on
    from rlinf_embodied.eval.request import run_env_config

    env, path = run_env_config(str(tmp_path / "pol"))
    assert path == tmp_path / "pol" / "config.yaml"
    assert env["type"] == "maniskill" and env["env_id"] == "PushCube-v1" and env["num_processes"] == 0
    assert env["num_envs"] == 4  # what the check ran, not the config's 16
    record = json.loads((tmp_path / "pol" / "overfit_check.json").read_text())
    assert record["success"] == out["success"] and record["num_states"] == 2


@pytest.mark.parametrize("args, expected", [
    (["--iterations", "0"], "--iterations must be >= 1"),
    (["--num-envs", "0"], "--num-envs must be >= 1"),
    (["--num-states", "3"], "must be a multiple of --num-states 3"),
    (["--quick", "--num-states", "3", "--num-envs", "12"], "(--quick caps --num-envs at 8)"),
    (["--reset-seed", "-1"], "--reset-seed must be >= 0"),
    (["--set", "env.num_envz=3"], "Did you mean 'env.num_envs'?"),
    (["--config", "reasoning_grpo_tiny"], "takes an embodied RL job config"),
])
def test_bad_input_is_one_line(args, expected):
    r = _run(*args, timeout=120)
    assert r.returncode == 2
    assert expected in r.stderr
    assert "Traceback" not in r.stderr


def test_bad_save_path_and_override_are_one_line(tmp_path):
    (tmp_path / "f").write_text("")
    r = _run("--save", str(tmp_path / "f"), timeout=120)
    assert r.returncode == 2 and "is a file; name a directory" in r.stderr, r.stderr
    r = _run("--set", "bogus.key=1", timeout=120)
    assert r.returncode == 2 and "bogus" in r.stderr
    assert "filter_low" not in r.stderr and "rl.config" not in r.stderr  # no hidden overrides
