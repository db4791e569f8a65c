"""``trainer.max_time_s`` is a budget: the run stops before an iteration that would end past it.

Regression: the check compared the time already spent with the budget after each iteration, so
the last iteration (and the in-training evaluation due with it) started just under the budget and
ended past it: a 1,500 s GRPO stage stopped at 1,582 s and 1,885 s (session 24's peg runs).

The runner's iteration is driven here with a fake clock and fake worker groups: every rollout and
update takes 30 s, every evaluation 10 s, the budget is 100 s.
"""

from __future__ import annotations

import pytest

import rlinf_embodied.runners.embodied as embodied
from rlinf_embodied.config import load_config


class _Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class _Done:
    def __init__(self, value):
        self.value = value

    def wait(self):
        return self.value


class _Group:
    def context_switch_seconds(self):
        return _Done([0.0])


class _Groups:
    def __init__(self):
        self.env = self.rollout = self.actor = _Group()
        self.sync = type("Sync", (), {"push": staticmethod(lambda it: 0.0)})()


class _Log:
    def __init__(self, clock):
        self.rows, self.clock = [], clock

    def log(self, m, env_steps, iteration):
        self.rows.append(iteration)

    def elapsed(self):  # MetricLogger's: the run's seconds (here from the fake clock's 0)
        return self.clock.now


def _runner(monkeypatch, tmp_path, eval_every: int):
    clock = _Clock()
    monkeypatch.setattr(embodied.time, "time", clock)
    cfg = load_config("configs/maniskill_pushcube_ppo_mlp.yaml", [
        "trainer.iterations=100", "trainer.max_time_s=100", f"trainer.eval_every={eval_every}",
        "trainer.save_every=0"])
    r = embodied.EmbodiedRunner.__new__(embodied.EmbodiedRunner)
    r.cfg, r.run_dir, r.g, r.log = cfg, tmp_path, _Groups(), _Log(clock)
    r.state, r._eval_s, r.evaluated = {"iteration": 0, "env_steps": 0}, 0.0, []

    def rollout_and_train(it, m):
        clock.now += 30.0
        m.update({"time/rollout_s": 20.0, "time/train_s": 10.0})
        return [{"env_steps": 64, "episodes": 0, "env_errors": 0, "per_task": {}}], [{"train/loss": 0.0}]

    def evaluate(iteration, videos=0):
        clock.now += 10.0
        r.evaluated.append((iteration, clock.now))
        return {"eval/success_once": 0.0}

    r._rollout_and_train, r.evaluate = rollout_and_train, evaluate
    return r, clock


def _run(r) -> int:
    for _ in range(100):
        if r._iteration(0.0):
            break
    return r.state["iteration"]


def test_the_last_iteration_ends_within_the_budget(monkeypatch, tmp_path):
    r, clock = _runner(monkeypatch, tmp_path, eval_every=0)
    # 30 s each: after 3 (90 s) a 4th would end at 120 s (checking only the time spent, as
    # before, ran it)
    assert _run(r) == 3 and clock.now == pytest.approx(90.0)
    assert r.log.rows == [1, 2, 3]


def test_the_evaluation_due_counts_toward_the_next_iterations_forecast(monkeypatch, tmp_path):
    r, clock = _runner(monkeypatch, tmp_path, eval_every=1)
    # iteration 1 ends at 30 s, its evaluation at 40 s (no evaluation timed yet: forecast 60 s);
    # iteration 2 ends at 70 s: its evaluation (10 s, as the last) and a third iteration (30 s)
    # would end at 110 s, so it is the last; its evaluation is the final one
    assert _run(r) == 2
    assert r.evaluated == [(1, pytest.approx(40.0)), (2, pytest.approx(80.0))]
    assert clock.now <= 100.0
