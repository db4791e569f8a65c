"""The offload planner and the preemption simulator: pure functions, exact values."""

import pytest

from rlinf_embodied.config import ConfigError, PreemptionConfig, PreemptionEvent, load_config
from rlinf_embodied.elastic.offload import OffloadPlanner, finish_time
from rlinf_embodied.elastic.preemption import PreemptionSimulator


def test_finish_time_is_greedy_list_scheduling():
    assert finish_time(0, []) == 0.0
    assert finish_time(1, []) == float("inf")
    # one worker, 3 shards of 2 s, starting after 1 s
    assert finish_time(3, [(1.0, 2.0)]) == 7.0
    # a 1 s worker and a 3 s worker: shards land at 1, 2, 3 (fast) and 3 (slow) -> 4 shards by 3 s
    assert finish_time(4, [(0.0, 1.0), (0.0, 3.0)]) == 3.0
    assert finish_time(5, [(0.0, 1.0), (0.0, 3.0)]) == 4.0


def test_planner_split_follows_measured_throughput():
    p = OffloadPlanner(ema=1.0)
    assert p.planned_share(1, 1, 8) == 0.5  # nothing measured: equal estimates
    p.observe("reserved", [3.0, 3.0])
    p.observe("preemptible", [1.0])
    # 1 reserved (3 s) + 1 preemptible (1 s), 8 shards: the preemptible worker does 6
    assert p.planned_share(1, 1, 8) == 0.25
    assert p.planned_share(1, 0, 8) == 1.0  # reserved-only: everything on the reserved worker
    p.observe("preemptible", [3.0])
    assert p.planned_share(1, 1, 8) == 0.5  # and back, once they are as slow


def test_planner_ema_and_prior():
    p = OffloadPlanner(ema=0.5, prior_s=2.0)
    assert p.estimate("reserved") == 2.0
    p.observe("preemptible", [4.0])
    assert p.estimate("reserved") == 4.0  # unmeasured class borrows the measured one
    p.observe("preemptible", [2.0])
    assert p.estimate("preemptible") == 3.0


def test_slow_idle_worker_leaves_the_last_shard_to_a_fast_one():
    p = OffloadPlanner(ema=1.0)
    p.observe("reserved", [10.0])
    p.observe("preemptible", [1.0])
    # one shard left, the fast worker is busy for 0.5 s more: waiting (1.5 s) beats 10 s
    assert not p.should_take("reserved", 1, [("preemptible", 0.5)])
    # many shards left: the slow worker helps
    assert p.should_take("reserved", 30, [("preemptible", 0.5)])
    # no preemptible worker alive: reserved-only, it takes everything
    assert p.should_take("reserved", 1, [])
    # a straggler (busy for more than twice its estimate) does not count as capacity
    assert p.should_take("reserved", 1, [("preemptible", 5.0)])


def test_simulator_schedule_counts_preemptible_requests_per_iteration():
    cfg = PreemptionConfig(mode="schedule", schedule=[PreemptionEvent(0, 1), PreemptionEvent(0, 2),
                                                      PreemptionEvent(1, 0), PreemptionEvent(0, 9)])
    sim = PreemptionSimulator(cfg, num_shards=4)
    sim.begin_iteration(0)
    assert [sim.on_dispatch(i) for i in range(4)] == [False, True, True, False]
    sim.begin_iteration(1)  # iteration 0's kill at request 9 never came: dropped
    assert [sim.on_dispatch(i) for i in range(10)] == [True] + [False] * 9


def test_simulator_random_is_seeded():
    cfg = PreemptionConfig(mode="random", seed=7, kills_per_iteration=3)
    a, b = PreemptionSimulator(cfg, 8), PreemptionSimulator(cfg, 8)
    assert [a.kill_indices(i) for i in range(5)] == [b.kill_indices(i) for i in range(5)]
    assert all(len(a.kill_indices(i)) == 3 for i in range(5))
    other = PreemptionSimulator(PreemptionConfig(mode="random", seed=8, kills_per_iteration=3), 8)
    assert [a.kill_indices(i) for i in range(5)] != [other.kill_indices(i) for i in range(5)]
    assert PreemptionSimulator(PreemptionConfig(), 8).kill_indices(0) == []


def test_elastic_config_block_loads_and_checks():
    cfg = load_config("configs/gym_pointreach_ppo_mlp.yaml", [
        "elastic.enabled=true", "elastic.preemptible_workers=2", "elastic.preemption.mode=schedule",
        "elastic.preemption.schedule=[{iteration: 0, dispatch: 1}]"])
    assert cfg.elastic.preemption.schedule == [PreemptionEvent(iteration=0, dispatch=1)]
    assert cfg.elastic.num_shards_for(8) == 4  # 8 envs / 3 workers -> shards of 2
    assert cfg.elastic.num_shards_for(8, actor_ranks=2) == 4
    with pytest.raises(ConfigError, match="elastic.preemption.mode"):
        load_config(None, ["elastic.preemption.mode=sometimes"])
    with pytest.raises(ConfigError, match="elastic.reserved_workers"):
        load_config(None, ["elastic.reserved_workers=0"])
    with pytest.raises(ConfigError, match="elastic.preemptiblee_workers|preemptible_workers"):
        load_config(None, ["elastic.preemptiblee_workers=1"])
