"""A small multi-node scenario on real raylets (run in a fresh process by
tests/runtime/test_multinode.py): resumable shards on 1 reserved worker (head node) and
1 preemptible worker (a second raylet); the second node is killed while its worker is in the
middle of a shard, the shard resumes from its last reported state on the head, the node comes
back and its new worker serves the next iteration. Prints one JSON line last.

The workload is a seeded recurrence (``steps`` updates per shard, ``piece`` per call, a short
sleep per update), so results are checked against a local computation.

Usage: python tests/elastic/multinode_resume_scenario.py
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from rlinf_embodied.runtime import Worker  # noqa: E402

STEPS, PIECE, SLEEP_S, SHARDS = 12, 3, 0.05, 4
MOD = 2**31 - 1


def advance(acc: int, pos: int, seed: int) -> int:
    """One update of the recurrence (what a shard computes STEPS times)."""
    return (acc * 48_271 + pos * 7 + seed) % MOD


def expected(iteration: int, shard: int) -> int:
    acc = 1
    for pos in range(STEPS):
        acc = advance(acc, pos, iteration * 100 + shard)
    return acc


class RecurrenceWorker(Worker):
    """Resumable shards: each call does PIECE updates and reports the state back."""

    def __init__(self, kind: str):
        import ray

        self.kind, self.node = kind, ray.get_runtime_context().get_node_id()

    def run_shard(self, iteration: int, shard: int, version: int, state: dict) -> dict:
        state = dict(state, log=state["log"] + [[self.node, state["pos"]]])
        for _ in range(PIECE):
            state["acc"] = advance(state["acc"], state["pos"], iteration * 100 + shard)
            state["pos"] += 1
            time.sleep(SLEEP_S)
        if state["pos"] < STEPS:
            return {"partial": state}
        return {"shard": shard, "version": version, "kind": self.kind, "traj": state["acc"],
                "stats": {"log": state["log"]}}


def main() -> None:
    from rlinf_embodied.config import ElasticConfig, PreemptionConfig, PreemptionEvent
    from rlinf_embodied.elastic.multinode import LocalMultiNodeCluster
    from rlinf_embodied.elastic.pool import ElasticRolloutPool

    out: dict = {"steps": STEPS, "piece": PIECE, "shards": SHARDS}
    t0 = time.monotonic()
    with LocalMultiNodeCluster(head_cpus=2, preemptible_nodes=1, node_cpus=1) as mn:
        out["head"], out["second"] = mn.head_node_id, mn.worker_node_ids()[0]
        out["cluster_start_s"] = time.monotonic() - t0
        # the preemptible worker's 2nd request is the continuation of its first shard
        e = ElasticConfig(reserved_workers=1, preemptible_workers=1, wait_for_joins=True,
                          join_timeout_s=120, preemption=PreemptionConfig(
                              mode="schedule", target="node", restart="immediate",
                              schedule=[PreemptionEvent(0, 1)]))
        pool = ElasticRolloutPool(None, None, "", 1, mn, elastic=e, num_shards=SHARDS,
                                  worker_cls=RecurrenceWorker, init_args=())
        try:
            pool.start()
            its = []
            for it in range(2):
                init = {s: {"pos": 0, "acc": 1, "log": []} for s in range(SHARDS)}
                res = pool.collect(it, 0, init)
                its.append({"results": res.parts[0], "logs": [s["log"] for s in res.stats],
                            "expected": [expected(it, s) for s in range(SHARDS)],
                            "record": res.record, "metrics": res.metrics})
        finally:
            pool.shutdown()
        out["iterations"] = its
        out["killed_nodes"] = mn.killed
        out["live_worker_nodes"] = mn.worker_node_ids()
    out["seconds"] = time.monotonic() - t0
    print(json.dumps(out))


if __name__ == "__main__":
    main()
