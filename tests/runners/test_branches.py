"""A run resumed from an older checkpoint sets aside the records of the iterations it trains
again (runners/branches.py): nothing deleted, nothing mixed."""

import json

from rlinf_embodied.checkpoint import atomic_write_json, checkpoint_dir
from rlinf_embodied.runners.branches import set_aside_after


def _run(tmp_path):
    run = tmp_path / "run"
    rows = [{"iteration": i, "env_steps": 8 * i, "time_s": 10.0 * i} for i in range(1, 6)]
    rows.insert(3, {"event": "restart", "iteration": 3, "env_steps": 24, "time_s": 31.0})
    rows.append({"event": "restart", "iteration": 5, "env_steps": 40, "time_s": 52.0})
    run.mkdir()
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"iterat')
    for i in (2, 4):
        atomic_write_json(run / "eval" / f"iter_{i:06d}.json", {"iteration": i, "success_once": i / 10})
    atomic_write_json(run / "eval" / "latest.json", {"iteration": 4, "success_once": 0.4})
    with checkpoint_dir(run, "best", update_latest=False) as d:
        atomic_write_json(d / "runner_state.json", {"iteration": 4, "env_steps": 32})
    return run


def test_records_after_the_checkpoint_are_moved_aside(tmp_path):
    run = _run(tmp_path)
    moved = set_aside_after(run, 3)
    assert moved == ["4 metrics.jsonl rows (iterations 4-5)", "2 eval record(s)", "checkpoints/best"]
    kept = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [(r.get("event"), r["iteration"]) for r in kept] == [
        (None, 1), (None, 2), (None, 3), ("restart", 3)]
    (dest,) = (run / "abandoned").iterdir()
    assert dest.name.startswith("after_iter_000003_")
    aside = (dest / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["iteration"] for line in aside[:3]] == [4, 5, 5]
    assert aside[3] == '{"iterat'  # the line a kill cut, kept as it was
    assert sorted(p.name for p in (run / "eval").iterdir()) == ["iter_000002.json"]
    assert sorted(p.name for p in (dest / "eval").iterdir()) == ["iter_000004.json", "latest.json"]
    assert not (run / "checkpoints" / "best").exists()
    assert json.loads((dest / "best" / "runner_state.json").read_text())["iteration"] == 4


def test_nothing_after_the_checkpoint_moves_nothing(tmp_path):
    run = _run(tmp_path)
    (run / "metrics.jsonl").write_text('{"iteration": 1, "time_s": 1.0}\n')
    for p in (run / "eval").iterdir():
        p.unlink()
    with checkpoint_dir(run, "best", update_latest=False) as d:
        atomic_write_json(d / "runner_state.json", {"iteration": 1})
    assert set_aside_after(run, 5) == []
    assert not (run / "abandoned").exists()
    assert (run / "metrics.jsonl").read_text() == '{"iteration": 1, "time_s": 1.0}\n'
    assert (run / "checkpoints" / "best").is_dir()
