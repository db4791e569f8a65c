"""The in-training evaluation record of a multi-task run: overall rates stay overall.

Regression: the record's ``success_once`` was overwritten by the last task's rate (the per-task
metric keys ``eval/success_once/<task>`` were cut at their second ``/``), so a suite run's
``best`` checkpoint followed one task's success.
"""

from __future__ import annotations

import pytest

from rlinf_embodied.runners.embodied import eval_record


def _rank(per_task: dict, trials: list) -> dict:
    n = sum(e for e, _ in per_task.values())
    ok = sum(k for _, k in per_task.values())
    return {"episodes": n, "success_once": ok, "success_at_end": ok - 1, "episode_return": 10.0 * ok,
            "per_task": per_task, "videos": [], "trials": trials}


def test_overall_rates_and_per_task_rates_are_kept_apart():
    stats = [_rank({"push the cube": [4, 3], "pull the cube": [4, 0]}, [{"trial": 2}, {"trial": 0}]),
             _rank({"push the cube": [4, 1], "pull the cube": [4, 0]}, [{"trial": 1}])]
    metrics, record = eval_record(stats, iteration=10, env_steps=640, batch_invariant=True)
    assert record["episodes"] == 16
    assert record["success_once"] == pytest.approx(4 / 16)  # not pull's 0 nor push's 0.5
    assert record["success_at_end"] == pytest.approx(2 / 16)
    assert record["episode_return"] == pytest.approx(40 / 16)
    assert record["success_once_per_task"] == {"pull_the_cube": 0.0, "push_the_cube": 0.5}
    assert metrics["eval/success_once"] == record["success_once"]
    assert metrics["eval/success_once/push_the_cube"] == 0.5
    assert [t["trial"] for t in record["trials"]] == [0, 1, 2]
    assert record["iteration"] == 10 and record["env_steps"] == 640


def test_one_task_has_no_breakdown():
    _, record = eval_record([_rank({"push": [5, 5]}, [])], 1, 0, False)
    assert record["success_once"] == 1.0 and record["success_once_per_task"] == {}
