"""Trial bookkeeping, errors and resume on the real gymnasium adapter (toy/PointReach-v0).

PointReach episode lengths depend on the reset seed (start-target distance), so slots free up
at different times and a wrong trial -> seed mapping changes the recorded step counts.
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import eval_helpers
import pytest
from rlinf_embodied.eval.request import EvalRequest
from rlinf_embodied.eval.results import ResultsError, ResultsFile
from rlinf_embodied.eval.run import evaluate

TASK = "toy/PointReach-v0"


def _req(tmp_path, name, **kw):
    base = dict(env="gym", task=TASK, policy="eval_helpers:reach", trials_per_task=7,
                num_envs=3, num_processes=0, output=str(tmp_path / name), reports=False)
    base.update(kw)
    return EvalRequest(**base)


def test_each_pair_once_and_independent_of_num_envs(tmp_path):
    runs = {}
    for n in (1, 3, 4):
        res = evaluate(_req(tmp_path, f"n{n}.json", num_envs=n))
        keys = [e.key for e in res.episodes]
        assert sorted(keys) == [(TASK, i) for i in range(7)]  # each pair exactly once
        runs[n] = {e.trial: (e.steps, e.success) for e in res.episodes}
    assert runs[1] == runs[3] == runs[4]  # trial i always gets seed env_seed + i
    assert len({s for s, _ in runs[1].values()}) > 1  # lengths differ, so slots desynchronise
    assert all(ok for _, ok in runs[1].values())


def test_raising_policy_fails_episodes_in_flight(tmp_path):
    eval_helpers.CALLS["n"] = 0
    eval_helpers.RAISE_AT.update(value_error=4, interrupt=None)
    res = evaluate(_req(tmp_path, "err.json", policy="eval_helpers:flaky"))
    failed = [e for e in res.episodes if e.error]
    assert len(failed) == 3  # the three episodes in flight at call 4
    assert all(not e.success and e.error.startswith("ValueError: policy exploded") for e in failed)
    assert all(e.steps == 3 for e in failed)
    assert sorted(e.trial for e in res.episodes) == list(range(7))
    assert sum(e.success for e in res.episodes) == 4
    on_disk = json.loads(Path(res.path).read_text())
    assert {"task", "trial", "success", "steps", "error", "video"} <= set(on_disk["episodes"][0])


def test_resume_after_interrupt_runs_only_missing_pairs(tmp_path):
    eval_helpers.CALLS["n"] = 0
    eval_helpers.RAISE_AT.update(value_error=None, interrupt=30)
    with pytest.raises(KeyboardInterrupt):
        evaluate(_req(tmp_path, "r.json", policy="eval_helpers:flaky"))
    first = ResultsFile.load(tmp_path / "r.json")
    assert 0 < len(first.episodes) < 7
    eval_helpers.RAISE_AT.update(interrupt=None)
    seen = []
    res = evaluate(_req(tmp_path, "r.json", policy="eval_helpers:flaky",
                        progress=lambda d, t, e: seen.append(e.key)))
    assert sorted(seen) == sorted(set((TASK, i) for i in range(7)) - first.done_pairs())
    assert [e.to_dict() for e in res.episodes if e.key in first.done_pairs()] == \
        [e.to_dict() for e in first.episodes]
    assert res.header["resumed_at"]
    # Resuming with another policy is refused.
    with pytest.raises(ResultsError, match="policy.sha256"):
        evaluate(_req(tmp_path, "r.json", policy="eval_helpers:zero"))
    # So is resuming under other env settings: the recorded episodes ran under the old ones
    before = (tmp_path / "r.json").read_bytes()
    with pytest.raises(ResultsError, match=r"env_config kwargs: \{\} in the file vs \{'dim': 3\} now"):
        evaluate(_req(tmp_path, "r.json", policy="eval_helpers:flaky", env_overrides={"kwargs": {"dim": 3}}))
    assert (tmp_path / "r.json").read_bytes() == before
    # and so is fewer trials (the header would not cover the recorded ones); more are added
    with pytest.raises(ResultsError, match=r"holds 4 episode\(s\) outside this evaluation's tasks "
                                           r"and trials \(e.g. task toy/PointReach-v0 trial 3; "
                                           r"the file's: tasks \['toy/PointReach-v0'\], 7 trials"):
        evaluate(_req(tmp_path, "r.json", policy="eval_helpers:flaky", trials_per_task=3))
    assert (tmp_path / "r.json").read_bytes() == before
    res = evaluate(_req(tmp_path, "r.json", policy="eval_helpers:flaky", trials_per_task=9))
    assert sorted(e.trial for e in res.episodes) == list(range(9)) and res.header["trials_per_task"] == 9


def test_resume_after_kill(tmp_path):
    out = tmp_path / "killed.json"
    cmd = [sys.executable, "-m", "rlinf_embodied.eval.cli", "--env", "gym", "--task", TASK,
           "--policy", "eval_helpers:slow_random", "--trials-per-task", "12", "--num-envs", "2",
           "--num-processes", "0", "--no-report", "-o", str(out)]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([eval_helpers.__file__.rsplit("/", 1)[0],
                                                       os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 60
        while time.time() < deadline:
            if out.exists() and len(ResultsFile.load(out).episodes) >= 2:
                break
            time.sleep(0.05)
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.wait(10)
    before = ResultsFile.load(out)  # atomically written: always parses
    assert 2 <= len(before.episodes) < 12
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    after = ResultsFile.load(out)
    assert sorted(e.trial for e in after.episodes) == list(range(12))
    old = {e.key: e.to_dict() for e in before.episodes}
    assert all(old[e.key] == e.to_dict() for e in after.episodes if e.key in old)
    assert f"resuming {out}: {len(before.episodes)} of 12 episodes are there already" in done.stderr
    reran = [ln for ln in done.stderr.splitlines() if ln.startswith("[")]
    assert len(reran) == 12 - len(before.episodes)
