"""The in-training evaluation record of a multi-task run: overall rates stay overall.

Regression: the record's ``success_once`` was overwritten by the last task's rate (the per-task
metric keys ``eval/success_once/<task>`` were cut at their second ``/``), so a suite run's
``best`` checkpoint followed one task's success.
"""

from __future__ import annotations

import pytest

from rlinf_embodied.runners.embodied import eval_record, mixed_group_rates


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


def test_mixed_groups_are_counted_per_task_across_ranks():
    """GRPO's signal per task: groups whose envs disagree (some succeeded, some not)."""
    import torch

    from rlinf_embodied.workers.env_worker import _count_groups

    # rank 0: groups of 4; group 0 (push) mixed, group 1 (pull) all failed
    rank0 = _count_groups(torch.tensor([1, 0, 0, 1, 0, 0, 0, 0], dtype=torch.bool),
                          ["push"] * 4 + ["pull"] * 4, torch.tensor([0, 0, 0, 0, 1, 1, 1, 1]))
    assert rank0 == {"push": [1, 1], "pull": [1, 0]}
    # rank 1: group 2 (pull) all succeeded, group 3 (pull) mixed
    rank1 = _count_groups(torch.tensor([1, 1, 1, 1, 0, 1, 0, 0], dtype=torch.bool),
                          ["pull"] * 8, torch.tensor([2, 2, 2, 2, 3, 3, 3, 3]))
    assert rank1 == {"pull": [2, 1]}
    rates = mixed_group_rates([{"per_task_groups": rank0}, {"per_task_groups": rank1}])
    assert rates == {"rollout/mixed_groups": 0.5, "rollout/mixed_groups/pull": pytest.approx(1 / 3),
                     "rollout/mixed_groups/push": 1.0}
    assert mixed_group_rates([{"per_task_groups": {"": [4, 1]}}]) == {"rollout/mixed_groups": 0.25}
    assert mixed_group_rates([{}]) == {}
