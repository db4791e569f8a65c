"""A lost rank of the placed groups restarts them from the newest checkpoint
(``trainer.max_restarts``): the run finishes, and its weights equal a run stopped and resumed
there by hand. The multi-node variant (a reserved node's raylet killed) is in
tests/runtime/test_cli_cluster.py."""

import json
import os
import signal

import pytest

from rlinf_embodied.runners.embodied import EmbodiedRunner
from rlinf_embodied.runners.restarts import RunLostError
from tests.e2e.test_train import assert_same, make_cfg, weights


class KillsAnActorRank(EmbodiedRunner):
    """Kills actor rank 0's process (SIGKILL) in iteration ``kill_in`` (0-based), after its
    rollout and before its update, the first ``kills`` times that iteration runs."""

    kill_in, kills = 3, 1

    def _rollout_and_train(self, it, m):
        if it == self.kill_in and self.kills > 0:
            self.kills -= 1
            pid = self.g.actor.on([0])._rt_ping().wait()[0]
            os.kill(pid, signal.SIGKILL)
        return super()._rollout_and_train(it, m)


def history(run_dir):
    return [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_lost_actor_rank_restarts_from_checkpoint_like_a_resume_by_hand(ray_session, tmp_path, capsys):
    over = ["trainer.save_every=2"]
    run = KillsAnActorRank(make_cfg(tmp_path, iterations=4, overrides=over), tmp_path / "killed")
    state = run.run()
    assert state["iteration"] == 4 and run.restarts == 1
    out = capsys.readouterr().out
    assert "restart 1/3: lost actor[rank 0] on " in out and "during iteration 4" in out
    assert "from checkpoint iter_000002 (iteration 2): iterations 3-4 run again" in out
    assert "restart 1/3: groups up again after " in out
    rows = history(tmp_path / "killed")
    (event,) = [r for r in rows if r.get("event") == "restart"]
    assert event["restart/from_iteration"] == 2 and event["restart/lost_iterations"] == 1
    assert event["restart/count"] == 1 and event["restart/lost"][0].startswith("actor[rank 0]")
    # iterations 1-2, the restart, iterations 3-4 again: the lost iteration 3's row is set
    # aside (as a resume by hand sets it aside), so the history has one row per iteration
    assert [r.get("event", r["iteration"]) for r in rows] == [1, 2, "restart", 3, 4]
    assert "the records of the iterations run again (1 metrics.jsonl row (iteration 3))" in out
    (aside,) = (tmp_path / "killed" / "abandoned").glob("after_iter_000002_*/metrics.jsonl")
    assert [json.loads(x)["iteration"] for x in aside.read_text().splitlines()] == [3]

    # by hand: stop after the checkpoint of iteration 2, resume to 4
    EmbodiedRunner(make_cfg(tmp_path, iterations=2, overrides=over), tmp_path / "by_hand").run()
    EmbodiedRunner(make_cfg(tmp_path, iterations=4, overrides=over), tmp_path / "by_hand",
                   resume=True).run()
    assert_same(weights(tmp_path / "killed"), weights(tmp_path / "by_hand"))
    a = [r for r in rows if r.get("event") is None][-1]
    b = history(tmp_path / "by_hand")[-1]
    assert {k: v for k, v in a.items() if k.startswith("train/")} == \
        {k: v for k, v in b.items() if k.startswith("train/")}


def test_restarts_are_bounded(ray_session, tmp_path):
    cfg = make_cfg(tmp_path, iterations=2, overrides=["trainer.max_restarts=0"])
    run = KillsAnActorRank(cfg, tmp_path / "run")
    run.kill_in = 1
    with pytest.raises(RunLostError, match=r"lost actor\[rank 0\] on .* during iteration 2; "
                                           r"trainer.max_restarts=0 restart\(s\) used up"):
        run.run()
    assert run.state["iteration"] == 1 and run.saved.name == "iter_000001"
