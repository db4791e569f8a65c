"""A resumed run's time goes on from the run it resumes: ``time_s`` of ``metrics.jsonl`` (and
the console's seconds) start at the elapsed time stored with the checkpoint, not at 0."""

import json

from rlinf_embodied.checkpoint import atomic_write_json, checkpoint_dir
from rlinf_embodied.metrics import MetricLogger, last_time_s, read_history
from rlinf_embodied.runners.embodied import read_state


def test_the_logger_counts_on_from_the_elapsed_seconds_it_is_given(tmp_path, capsys):
    log = MetricLogger(tmp_path, tensorboard=False, console=True, elapsed_s=1234.0)
    log.log({"rollout/success_once": 0.5}, step=10, iteration=3)
    log.event("restart", 10, 3, **{"restart/count": 1})
    log.close()
    row, event = read_history(tmp_path, events=True)
    assert 1234.0 <= row["time_s"] < 1234.0 + 60 and 1234.0 <= event["time_s"] < 1234.0 + 60
    assert "| 1234s" in capsys.readouterr().out  # the console's elapsed seconds too
    fresh = MetricLogger(tmp_path / "new", tensorboard=False, console=False)
    assert 0.0 <= fresh.elapsed() < 60
    fresh.close()


def test_a_checkpoint_gives_its_elapsed_seconds_or_else_the_history_s(tmp_path):
    with checkpoint_dir(tmp_path, "iter_000002") as d:
        atomic_write_json(d / "runner_state.json",
                          {"iteration": 2, "env_steps": 80, "elapsed_s": 57.5})
    state, elapsed = read_state(tmp_path / "checkpoints" / "iter_000002", tmp_path)
    assert state == {"iteration": 2, "env_steps": 80} and elapsed == 57.5
    # a checkpoint saved before elapsed_s was stored: the last metric record at or before its
    # iteration (event rows and later iterations, run again after the resume, left out)
    rows = [{"iteration": 1, "env_steps": 40, "time_s": 20.0},
            {"iteration": 2, "env_steps": 80, "time_s": 41.0},
            {"event": "restart", "iteration": 2, "env_steps": 80, "time_s": 90.0},
            {"iteration": 3, "env_steps": 120, "time_s": 63.0}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    with checkpoint_dir(tmp_path, "iter_000003") as d:
        atomic_write_json(d / "runner_state.json", {"iteration": 2, "env_steps": 80})
    state, elapsed = read_state(tmp_path / "checkpoints" / "iter_000003", tmp_path)
    assert state == {"iteration": 2, "env_steps": 80} and elapsed == 41.0
    assert last_time_s(tmp_path, 0) == 0.0 and last_time_s(tmp_path / "none", 5) == 0.0


def test_history_skips_a_line_cut_by_a_kill(tmp_path):
    from rlinf_embodied.metrics import last_time_s, read_history

    (tmp_path / "metrics.jsonl").write_text('{"iteration": 1, "time_s": 4.5}\n'
                                            '{"event": "restart", "iteration": 1, "time_s": 5.0}\n'
                                            '{"iteration": 2, "time_')
    assert [r["iteration"] for r in read_history(tmp_path)] == [1]
    assert len(read_history(tmp_path, events=True)) == 2
    assert last_time_s(tmp_path, 5) == 4.5
