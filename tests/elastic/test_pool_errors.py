"""A shard that fails on every attempt ends the rollout with one error that names the worker
it last failed on (real Ray; the worker is trivial)."""

import sys

import pytest
import ray

from rlinf_embodied.runners.errors import short_error
from rlinf_embodied.runtime import Worker


class Broken(Worker):
    """Every shard raises, as a simulator that cannot step would."""

    def __init__(self, kind: str):
        self.kind = kind

    def run_shard(self, iteration: int, shard: int, version: int) -> dict:
        raise ValueError(f"shard {shard} cannot run")


def test_a_shard_that_keeps_failing_names_its_worker(ray_session):
    from rlinf_embodied.config import ElasticConfig
    from rlinf_embodied.elastic.pool import ElasticRolloutPool

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    e = ElasticConfig(reserved_workers=1, preemptible_workers=0, preemptible_resource="",
                      join_timeout_s=120, max_attempts=2)
    pool = ElasticRolloutPool(None, None, "", 1, None, elastic=e, num_shards=1,
                              worker_cls=Broken, init_args=())
    try:
        pool.start()
        (member,) = pool.members
        with pytest.raises(RuntimeError) as info:
            pool.collect(0, 0)
        line = short_error(info.value)
        assert "shard 0 of iteration 0 failed 2 times" in line
        assert f"last on worker {member.name}" in line.splitlines()[0]  # the first line keeps it
        assert "ValueError: shard 0 cannot run" in line
        kinds = [x["event"] for x in pool.events]
        assert kinds.count("shard_error") == 1  # the first failure is retried, the second raises
    finally:
        pool.shutdown()
