"""Elastic pool placement: preemptible workers that no node can take are reported, not
silently dropped (real Ray; the workers are trivial)."""

import sys

import pytest
import ray

from rlinf_embodied.runtime import Worker

RESOURCE = "rlinf_test_absent_resource"


class Idle(Worker):
    def __init__(self, kind: str):
        self.kind = kind


def test_unplaceable_preemptible_workers_warn_and_are_recorded(ray_session):
    from rlinf_embodied.config import ElasticConfig
    from rlinf_embodied.elastic.offload import PREEMPTIBLE, RESERVED
    from rlinf_embodied.elastic.pool import ElasticRolloutPool, UnplacedWorkersWarning

    # this test module is not importable in Ray's workers (tests/elastic is a package there)
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    e = ElasticConfig(reserved_workers=1, preemptible_workers=2, preemptible_resource=RESOURCE,
                      join_timeout_s=120)
    pool = ElasticRolloutPool(None, None, "", 1, None, elastic=e, num_shards=2,
                              worker_cls=Idle, init_args=())
    try:
        with pytest.warns(UnplacedWorkersWarning,
                          match=f"2 of 2 preemptible elastic workers have no node.*'{RESOURCE}'"
                                r".*1 reserved and 0 preemptible"):
            pool.start()
        assert [m.kind for m in pool.members] == [RESERVED]
        unplaced = [ev for ev in pool.events if ev["event"] == "unplaced"]
        assert len(unplaced) == 1 and unplaced[0]["workers"] == 2
        assert unplaced[0]["kind"] == PREEMPTIBLE and unplaced[0]["resource"] == RESOURCE
    finally:
        pool.shutdown()
