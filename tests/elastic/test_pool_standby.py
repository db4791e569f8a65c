"""Spare preemptible workers (``elastic.standby_workers``): started with the pool, idle until a
preemptible worker is lost, then in its place at once; their own replacement starts when the
rollout ends, not during it (real Ray; the workers are trivial)."""

import sys
import time

import ray

from rlinf_embodied.runtime import Worker


class Squares(Worker):
    """Shard s of iteration i is (i, s, s * s), after a short sleep."""

    def __init__(self, kind: str):
        self.kind = kind

    def run_shard(self, iteration: int, shard: int, version: int) -> dict:
        time.sleep(0.2)
        return {"shard": shard, "version": version, "kind": self.kind,
                "traj": (iteration, shard, shard * shard), "stats": {"env_steps": 1}}


def test_a_spare_replaces_a_preempted_worker_at_once(ray_session):
    from rlinf_embodied.config import ElasticConfig, PreemptionConfig, PreemptionEvent
    from rlinf_embodied.elastic.pool import ElasticRolloutPool

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    e = ElasticConfig(reserved_workers=1, preemptible_workers=1, standby_workers=1,
                      preemptible_resource="", join_timeout_s=120, preemption=PreemptionConfig(
                          mode="schedule", schedule=[PreemptionEvent(0, 0)]))
    pool = ElasticRolloutPool(None, None, "", 1, None, elastic=e, num_shards=6,
                              worker_cls=Squares, init_args=())
    try:
        pool.start()
        assert sorted((m.kind, m.standby) for m in pool.members) == [
            ("preemptible", False), ("preemptible", True), ("reserved", False)]
        res = pool.collect(0, 0)
        assert res.parts == [[(0, s, s * s) for s in range(6)]]  # every shard once, exact
        ev = res.record["events"]
        kinds = [x["event"] for x in ev]
        assert kinds.index("preempt") < kinds.index("lost") < kinds.index("promote")
        (lost,) = [x for x in ev if x["event"] == "lost"]
        (promote,) = [x for x in ev if x["event"] == "promote"]
        assert promote["replaces"] == lost["worker"] and promote["t"] - lost["t"] < 0.05
        spare = promote["worker"]
        assert spare.startswith("elastic-s")
        assert any(s["worker"] == spare for s in res.record["shards"])  # it served at once
        assert not [x for x in ev if x["event"] == "join"]  # nothing started during the rollout
        assert res.metrics["elastic/workers_preemptible"] == 1.0
        assert res.metrics["elastic/workers_standby"] == 0.0
        pool.wait_for_joins(standby=True)  # the spare's own replacement, started after it
        assert sum(m.standby for m in pool.members) == 1
        res = pool.collect(1, 0)
        assert res.parts == [[(1, s, s * s) for s in range(6)]]
        assert res.metrics["elastic/workers_standby"] == 1.0
    finally:
        pool.shutdown()
