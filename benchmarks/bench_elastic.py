"""Elastic rollout: throughput with 0/1/2 extra preemptible workers, join and recovery latency.

The workload is a sleep-based env (toy/Countdown-v0 with ``step_sleep_s``) so that a shard's
cost is controlled (T queries x n envs x sleep) and extra workers can show scaling on a 2-core
machine; the policy is a small MLP. One reserved worker always runs; the pool's preemptible
workers live on the same Ray node here (``elastic.preemptible_resource=""``).

Prints one JSON line last:

    throughput_env_steps_per_s   {"reserved_only", "plus_1_preemptible", "plus_2_preemptible"}
    speedup_vs_reserved_only     the same, divided by reserved-only
    join_first_request_s         a replacement worker: spawn -> ready -> its first shard served
                                 (ready time + first shard's duration)
    join_ready_s                 spawn -> process, envs, policy and current weights ready
    recovery_s                   kill -> the killed worker's shard finished elsewhere
    breakdown                    per setting: rollout wall, shard seconds, reserved share

Usage: python benchmarks/bench_elastic.py [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import time

import ray

from rlinf_embodied.config import load_config


def job(preemptible: int, shards: int, shard_envs: int, steps: int, sleep_s: float, extra=()):
    return load_config(None, [
        "env.type=gym", "env.env_id=toy/Countdown-v0", f"env.num_envs={shards * shard_envs}",
        "env.num_processes=0", "env.kwargs={length: 5, step_sleep_s: %g}" % sleep_s,
        "policy.type=mlp", "policy.hidden_sizes=[16]", f"trainer.rollout_steps={steps}",
        "elastic.enabled=true", "elastic.reserved_workers=1", f"elastic.preemptible_workers={preemptible}",
        "elastic.preemptible_resource=''", f"elastic.shard_envs={shard_envs}", "elastic.wait_for_joins=true",
        *extra])


def space_spec(cfg) -> dict:
    import dataclasses

    from rlinf_embodied.envs import make_env
    from rlinf_embodied.policies.base import SpaceSpec

    env = make_env(dataclasses.replace(cfg.env, num_envs=1))
    obs, _ = env.reset(seed=0)
    spec = SpaceSpec.from_env(env, obs).to_dict()
    env.close()
    return spec


def publish(cfg, spec, name):
    """A weight store with version 0 of a freshly built policy (what the actor would publish)."""
    from rlinf_embodied.policies import build_policy
    from rlinf_embodied.policies.base import SpaceSpec

    from rlinf_embodied.elastic.weights import weight_store

    store = weight_store(name, create=True)
    state = build_policy(cfg.policy, SpaceSpec.from_dict(spec)).state_dict()
    ray.get(store.publish.remote(0, [ray.put(state)]))
    return store


def measure_throughput(cfg, spec, store_name, iterations: int) -> dict:
    from rlinf_embodied.elastic.pool import ElasticRolloutPool

    pool = ElasticRolloutPool(cfg, spec, store_name)
    try:
        t0 = time.perf_counter()
        pool.start()
        start_s = time.perf_counter() - t0
        pool.collect(0, 0)  # warm-up: first shard per worker, estimates measured
        t0 = time.perf_counter()
        res = [pool.collect(i, 0) for i in range(1, iterations + 1)]
        wall = time.perf_counter() - t0
    finally:
        pool.shutdown()
    steps = sum(s["env_steps"] for r in res for s in r.stats)
    shard_s = [s["seconds"] for r in res for s in r.record["shards"]]
    return {"env_steps_per_s": steps / wall, "wall_s": wall, "pool_start_s": start_s,
            "mean_shard_s": sum(shard_s) / len(shard_s),
            "reserved_share": sum(r.metrics["elastic/reserved_share"] for r in res) / len(res)}


def measure_preemption(cfg, spec, store_name) -> dict:
    """Iteration 1 kills the first preemptible worker as soon as it has a shard (its shard is
    re-run elsewhere); the replacement starts at once and serves its first shard in iteration 2."""
    from rlinf_embodied.elastic.pool import ElasticRolloutPool

    pool = ElasticRolloutPool(cfg, spec, store_name)
    try:
        pool.start()
        pool.collect(0, 0)
        res = pool.collect(1, 0)
        t_wait = time.monotonic()
        pool.wait_for_joins()  # the replacement (joins mid-iteration when rollouts are longer)
        wait_s = time.monotonic() - t_wait
        res2 = pool.collect(2, 0)
    finally:
        pool.shutdown()
    ev = res.record["events"]
    kill = next(e for e in ev if e["event"] == "preempt")
    lost = next(e for e in ev if e["event"] == "lost")
    redone = next(s for s in res.record["shards"] if s["shard"] == lost["shard"])
    join = [e for e in pool.events if e["event"] == "join" and e["t"] > kill["t"]][0]
    first = min((s for s in res2.record["shards"] if s["worker"] == join["worker"]),
                key=lambda s: s["t_done"])
    return {
        "recovery_s": redone["t_done"] - kill["t"],
        "detect_s": lost["t"] - kill["t"],
        "join_ready_s": join["start_s"],
        "join_first_request_s": join["start_s"] + first["seconds"],
        "first_shard_s": first["seconds"],
        "waited_for_join_s": wait_s,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    shards, shard_envs, steps = (6, 1, 10) if args.quick else (12, 2, 10)
    sleep_s = 0.01 if args.quick else 0.02
    iterations = 1 if args.quick else 3
    load_before = open("/proc/loadavg").read().split()[:3]
    t_all = time.perf_counter()
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False, namespace="bench_elastic")
    try:
        base = job(0, shards, shard_envs, steps, sleep_s)
        spec = space_spec(base)
        store = publish(base, spec, "bench-weights")  # noqa: F841 - the handle keeps it alive
        out = {}
        for p, key in ((0, "reserved_only"), (1, "plus_1_preemptible"), (2, "plus_2_preemptible")):
            out[key] = measure_throughput(job(p, shards, shard_envs, steps, sleep_s), spec,
                                          "bench-weights", iterations)
        pre = job(1, shards, shard_envs, steps, sleep_s, [
            "elastic.wait_for_joins=false", "elastic.preemption.mode=schedule",
            "elastic.preemption.schedule=[{iteration: 1, dispatch: 0}]"])
        rec = measure_preemption(pre, spec, "bench-weights")
    finally:
        ray.shutdown()
    tput = {k: v["env_steps_per_s"] for k, v in out.items()}
    result = {
        "bench": "elastic", "quick": args.quick,
        "workload": {"shards": shards, "shard_envs": shard_envs, "rollout_steps": steps,
                     "step_sleep_s": sleep_s, "nominal_shard_s": steps * shard_envs * sleep_s},
        "throughput_env_steps_per_s": tput,
        "speedup_vs_reserved_only": {k: v / tput["reserved_only"] for k, v in tput.items()},
        "join_first_request_s": rec["join_first_request_s"],
        "join_ready_s": rec["join_ready_s"],
        "recovery_s": rec["recovery_s"],
        "breakdown": {**out, "preemption": rec},
        "loadavg_before": load_before, "loadavg_after": open("/proc/loadavg").read().split()[:3],
        "cpus": os.cpu_count(), "seconds": time.perf_counter() - t_all,
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
