"""WorkerGroup call round trip: fan out a no-op method to 4 ranks and wait for all results.

Prints one JSON line last: ``dispatch_us`` (median microseconds per group call, driver side)
plus the median of a raw Ray baseline (4 actor calls + ray.get) for comparison.

Usage: python benchmarks/bench_dispatch.py [--quick]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import ray

from rlinf_embodied.runtime import Cluster, Worker, WorkerGroup

RANKS = 4


class Noop(Worker):
    def noop(self):
        return None


@ray.remote(num_cpus=0)
class RawNoop:
    def noop(self):
        return None


def median_us(call, n: int) -> float:
    """Median wall time of ``call()`` over ``n`` runs, in microseconds."""
    samples = []
    for _ in range(n):
        start = time.perf_counter()
        call()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer calls (CI smoke run)")
    args = parser.parse_args()
    n = 200 if args.quick else 1000
    cluster = Cluster(log_to_driver=False)
    group = WorkerGroup(cluster, Noop, "noop", devices="0", procs_per_device=RANKS)
    ranks = range(RANKS)
    raw = [RawNoop.remote() for _ in ranks]
    ray.get([a.noop.remote() for a in raw])
    median_us(lambda: group.noop().wait(), 20)  # warm up
    dispatch = median_us(lambda: group.noop().wait(), n)
    baseline = median_us(lambda: ray.get([a.noop.remote() for a in raw]), n)
    group.shutdown()
    cluster.shutdown()
    print(json.dumps({"ranks": RANKS, "calls": n, "dispatch_us": round(dispatch, 1),
                      "raw_ray_us": round(baseline, 1)}))


if __name__ == "__main__":
    main()
