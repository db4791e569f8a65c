"""Elastic rollout on the shared Ray session: preempted workers, re-run shards, exact training.

Preemptible workers here live on the driver's node (``elastic.preemptible_resource=""``); the
multi-node variants (a second raylet, a killed node) are in tests/runtime/test_multinode.py.
Each iteration kills the preemptible workers that get the first three preemptible requests (of
8 one-env shards on 1 reserved + 4 preemptible workers), so exactly 3 preemptions happen per
iteration whatever the timing; replacements join before the next iteration.
"""

import collections
import json

import pytest
import torch

from rlinf_embodied.config import load_config
from rlinf_embodied.elastic.runner import ElasticEmbodiedRunner, load_records
from tests.e2e.test_train import assert_same, weights

TOY = """
run: {{name: elastic_toy, seed: 5}}
cluster: {{num_cpu_devices: 1}}
placement: collocated
env: {{type: gym, env_id: toy/PointReach-v0, num_envs: 8, max_episode_steps: 6}}
policy: {{type: mlp, hidden_sizes: [16, 16]}}
algorithm: {{gamma: 0.9, gae_lambda: 0.95}}
trainer: {{iterations: {iterations}, rollout_steps: 10, update_epochs: 2, num_minibatches: 2,
          eval_every: 0, save_every: {iterations}}}
logging: {{tensorboard: false, console: false}}
elastic:
  enabled: true
  reserved_workers: 1
  preemptible_workers: 4
  preemptible_resource: ""
  shard_envs: 1
  wait_for_joins: true
  preemption: {{mode: {mode}, schedule: {schedule}, restart: immediate}}
"""


def toy_cfg(tmp_path, iterations, kills_per_iteration, overrides=()):
    events = [{"iteration": i, "dispatch": d} for i in range(iterations) for d in range(kills_per_iteration)]
    mode = "schedule" if kills_per_iteration else "off"
    job = tmp_path / f"elastic_{mode}.yaml"
    job.write_text(TOY.format(iterations=iterations, mode=mode, schedule=json.dumps(events)))
    return load_config(job, list(overrides))


def metrics(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def check_exactly_once(records, num_envs, rollout_steps, max_steps):
    """Every shard recorded once; every env's episodes present once each, complete in order."""
    for rec in records:
        assert [s["shard"] for s in rec["shards"]] == list(range(rec["num_shards"]))
        keys = [(e["env"], e["ordinal"]) for e in rec["episodes"]]
        assert len(keys) == len(set(keys)), "an episode was recorded twice"
        per_env = collections.Counter(e["env"] for e in rec["episodes"])
        assert sorted(per_env) == list(range(num_envs)), "an env lost its episodes"
        # an episode lasts at most max_steps queries: every env finishes >= T // max_steps
        assert min(per_env.values()) >= rollout_steps // max_steps
        for env in range(num_envs):
            assert sorted(e["ordinal"] for e in rec["episodes"] if e["env"] == env) == list(range(per_env[env]))


def run_pair(tmp_path, iterations):
    """The clean run is reserved-only (one worker, the same shards): the fallback RLBoost lacks,
    and the cheapest reference."""
    clean = tmp_path / "clean"
    ElasticEmbodiedRunner(toy_cfg(tmp_path, iterations, 0, ["elastic.preemptible_workers=0"]), clean).run()
    pre = tmp_path / "preempted"
    ElasticEmbodiedRunner(toy_cfg(tmp_path, iterations, 3), pre).run()
    return clean, pre


def assert_pair(clean, pre, iterations):
    rc, rp = load_records(clean), load_records(pre)
    assert len(rc) == len(rp) == iterations
    check_exactly_once(rp, 8, 10, 6)
    total_lost = 0
    for a, b in zip(rc, rp, strict=True):
        assert a["episodes"] == b["episodes"]  # same seeds -> the re-run episodes are identical
        lost = {e["shard"] for e in b["events"] if e["event"] == "lost" and e["shard"] is not None}
        assert sum(e["event"] == "preempt" for e in b["events"]) == 3
        # every shard that died with its worker ran again, and only those ran twice
        assert {s["shard"] for s in b["shards"] if s["attempts"] > 1} == lost
        total_lost += len(lost)
        assert not [e for e in a["events"] if e["event"] in ("preempt", "lost")]
    # the kills land while the shard is in flight (the kill follows its dispatch at once)
    assert total_lost >= iterations
    mc, mp = metrics(clean), metrics(pre)
    for a, b in zip(mc, mp, strict=True):
        assert b["elastic/preemptions"] == 3.0 and a["elastic/preemptions"] == 0.0
        # the 4th preemptible worker survives its first request: offload really happened
        assert a["elastic/reserved_share"] == 1.0 and b["elastic/reserved_share"] < 1.0
        for k in a:
            if k.startswith(("train/", "rollout/")):
                assert a[k] == b[k], k  # ... and training is the same as without preemptions
    assert_same(weights(clean), weights(pre))
    assert any(v.abs().sum() > 0 for v in weights(pre).values())


def test_preempted_run_matches_clean_run(ray_session, tmp_path):
    clean, pre = run_pair(tmp_path, iterations=1)
    assert_pair(clean, pre, 1)


@pytest.mark.slow
def test_ten_iterations_of_three_preemptions(ray_session, tmp_path):
    clean, pre = run_pair(tmp_path, iterations=10)
    assert_pair(clean, pre, 10)


@pytest.mark.slow
def test_elastic_without_preemptible_workers_matches_placed_rollout(ray_session, tmp_path):
    """Reserved-only (RLBoost cannot run so) and one shard of all envs: the elastic path
    reproduces the placed env + rollout groups' training bit for bit."""
    from rlinf_embodied.runners.embodied import EmbodiedRunner

    over = ["trainer.iterations=2", "trainer.save_every=2", "elastic.preemptible_workers=0",
            "elastic.shard_envs=8"]
    job = tmp_path / "job.yaml"
    job.write_text(TOY.format(iterations=2, mode="off", schedule="[]"))
    ElasticEmbodiedRunner(load_config(job, over), tmp_path / "elastic").run()
    EmbodiedRunner(load_config(job, over + ["elastic.enabled=false"]), tmp_path / "placed").run()
    assert_same(weights(tmp_path / "elastic"), weights(tmp_path / "placed"))
    (m_el,), (m_pl,) = metrics(tmp_path / "elastic")[-1:], metrics(tmp_path / "placed")[-1:]
    assert m_el["rollout/episode_return"] == m_pl["rollout/episode_return"]
    assert m_el["elastic/reserved_share"] == 1.0
    assert torch.isfinite(torch.tensor(m_el["train/grad_norm"]))
