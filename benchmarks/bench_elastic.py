"""Elastic rollout: throughput with 0/1/2 extra preemptible workers, join and recovery latency.

The workload is a sleep-based env (toy/Countdown-v0 with ``step_sleep_s``) so that a shard's
cost is controlled (T queries x n envs x sleep) and extra workers can show scaling on a 2-core
machine; the policy is a small MLP. One reserved worker always runs; the pool's preemptible
workers live on the same Ray node here (``elastic.preemptible_resource=""``).

Prints one JSON line last:

    throughput_env_steps_per_s   {"reserved_only", "plus_1_preemptible", "plus_2_preemptible",
                                 "plus_2_preempted", "plus_2_preempted_no_standby"}: the
                                 preempted runs lose 2 preemptible workers in every measured
                                 iteration (each one's second request), with 2 spares
                                 (``elastic.standby_workers``) started with the pool, or none
    speedup_vs_reserved_only     the same, divided by reserved-only
    preempted, preempted_no_standby
                                 where a preemption's cost goes: detect_s (kill -> its shard back
                                 in the queue), rerun_s (kill -> the lost shard done elsewhere),
                                 rejoin_s (a replacement's spawn -> ready), each mean/max/n
    preempted_episodes_equal_reserved_only
                                 the preempted runs' episodes equal the reserved-only run's
    join_first_request_s         a replacement worker: spawn -> ready -> its first shard served
                                 (ready time + first shard's duration)
    join_ready_s                 spawn -> process, envs, policy and current weights ready
    recovery_s                   an unannounced SIGKILL of a worker's process mid-shard -> its
                                 shard finished elsewhere (breakdown.preemption.detect_s: -> the
                                 pool knew, from Ray's death report)
    breakdown                    per setting: rollout wall, shard seconds, reserved share
    reasoning                    the reasoning workflow's elastic generation (tiny Qwen2 from
                                 config, every generated token costs ``token_cost_s`` of sleep):
                                 tokens_per_s with 0/1/2 preemptible workers and the two
                                 preempted runs, speedup, the preemption times as above,
                                 migrated responses, resumed (not regenerated) tokens, the bound
                                 on lost tokens, and whether its responses equal the
                                 reserved-only run's bit for bit

Throughput counts the seconds inside the measured iterations' rollouts; workers still starting
(replacements, spares) are waited for between and after them untimed, as a run trains there
and, on a real cluster, its replacements start on other machines (here every worker shares the
machine's cores, so a start-up during a rollout would slow it; the JSON's rejoin_s says how long
they take).

Usage: python benchmarks/bench_elastic.py [--quick]
(run measurements under ``flock /work/measure.lock``, see the project rules)
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


KILLS = 2
"""Preemptions per measured iteration in the preempted runs."""


def kill_schedule(iterations: int, kills: int) -> list:
    """The preempted runs' kills: in every measured iteration (1..iterations), the workers that
    get preemptible requests 1, 3, 5, ... (each preemptible worker's second request while
    both serve: they have done some work, as a preempted spot instance has)."""
    return [{"iteration": i, "dispatch": 1 + 2 * k} for i in range(1, iterations + 1) for k in range(kills)]


def preemption_times(records: list, events: list) -> dict:
    """Where a preemption's cost goes, from the measured iterations' records and the pool's
    events (``events`` also holds joins that finished after the measurement):

    detect_s   kill -> the pool knows (its shard back in the queue)
    rerun_s    kill -> the lost shard (or piece) finished on another worker
    rejoin_s   the replacement's spawn -> ready (process, envs, model, weights), which runs
               beside the step when the replacement starts at once
    """
    out = {"preemptions": 0, "lost_shards": 0, "detect_s": [], "rerun_s": [], "rejoin_s": []}
    for rec in records:
        ev = rec["events"]
        done = {s["shard"]: s["t_done"] for s in rec["shards"]}
        for kill in (e for e in ev if e["event"] == "preempt"):
            out["preemptions"] += 1
            lost = next((e for e in ev if e["event"] == "lost" and e["worker"] == kill["worker"]), None)
            if lost is None:
                continue
            out["detect_s"].append(round(lost["t"] - kill["t"], 4))
            if lost["shard"] is not None:
                out["lost_shards"] += 1
                out["rerun_s"].append(round(done[lost["shard"]] - kill["t"], 4))
        kills = [e["t"] for e in ev if e["event"] == "preempt"]
        for j in (e for e in events if e["event"] == "join" and kills):
            if j["t"] - j["start_s"] >= min(kills) - 1e-3:
                out["rejoin_s"].append(round(j["start_s"], 4))
    for k in ("detect_s", "rerun_s", "rejoin_s"):
        v = out[k]
        out[k] = {"mean": sum(v) / len(v), "max": max(v), "n": len(v)} if v else None
    return out


def timed_iterations(pool, iterations: int, collect) -> tuple:
    """``collect(i)`` for measured iterations 1..``iterations``: (results, seconds inside the
    collects). Between and after them the workers still starting (replacements, spares) are
    waited for untimed, as a run trains there and its replacements start on other machines."""
    res, wall = [], 0.0
    for i in range(1, iterations + 1):
        t0 = time.perf_counter()
        res.append(collect(i))
        wall += time.perf_counter() - t0
        pool.wait_for_joins(standby=True)
    return res, wall


def measure_throughput(cfg, spec, store_name, iterations: int) -> dict:
    from rlinf_embodied.elastic.pool import ElasticRolloutPool

    pool = ElasticRolloutPool(cfg, spec, store_name)
    try:
        t0 = time.perf_counter()
        pool.start()
        start_s = time.perf_counter() - t0
        pool.collect(0, 0)  # warm-up: first shard per worker, estimates measured
        res, wall = timed_iterations(pool, iterations, lambda i: pool.collect(i, 0))
    finally:
        pool.shutdown()
    steps = sum(s["env_steps"] for r in res for s in r.stats)
    shard_s = [s["seconds"] for r in res for s in r.record["shards"]]
    out = {"env_steps_per_s": steps / wall, "wall_s": wall, "pool_start_s": start_s,
           "mean_shard_s": sum(shard_s) / len(shard_s),
           "reserved_share": sum(r.metrics["elastic/reserved_share"] for r in res) / len(res),
           "episodes": [[(e["env"], e["ordinal"], e["return"]) for e in r.record["episodes"]] for r in res]}
    if cfg.elastic.preemption.mode != "off":
        out["times"] = preemption_times([r.record for r in res], pool.events)
    return out


def measure_preemption(cfg, spec, store_name, shard_s: float) -> dict:
    """Iteration 1 SIGKILLs the first preemptible worker's process halfway through a shard,
    unannounced: the pool learns of it as of a real preemption (the call fails), so
    ``detect_s`` is Ray's death report; the shard is re-run elsewhere, the replacement starts
    at once and serves its first shard in iteration 2."""
    import os
    import signal
    import threading

    from rlinf_embodied.elastic.offload import PREEMPTIBLE
    from rlinf_embodied.elastic.pool import ElasticRolloutPool

    pool = ElasticRolloutPool(cfg, spec, store_name)
    kill = {}
    try:
        pool.start()
        pool.collect(0, 0)
        victim = next(m for m in pool.members if m.kind == PREEMPTIBLE)
        pid = victim.group.on([0])._rt_ping().wait()[0]

        def killer():
            while victim.handle is None:
                time.sleep(0.002)
            time.sleep(shard_s / 2)
            kill["t"] = pool.clock()
            os.kill(pid, signal.SIGKILL)

        threading.Thread(target=killer, daemon=True).start()
        res = pool.collect(1, 0)
        t_wait = time.monotonic()
        pool.wait_for_joins()  # the replacement (joins mid-iteration when rollouts are longer)
        wait_s = time.monotonic() - t_wait
        res2 = pool.collect(2, 0)
    finally:
        pool.shutdown()
    ev = res.record["events"]
    lost = next(e for e in ev if e["event"] == "lost" and e["worker"] == victim.name)
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


def reasoning_setup(root, prompts: int, group: int, max_new_tokens: int):
    """The tiny reasoning job, its model directory, the weight store (version 0) and each
    step's prompts."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rlinf_embodied.config import load_config as load
    from rlinf_embodied.elastic.weights import weight_store
    from rlinf_embodied.reasoning.config import ReasoningJobConfig
    from rlinf_embodied.reasoning.launch import prepare_model_dir
    from rlinf_embodied.llm.messages import PromptRequest
    from rlinf_embodied.llm.tasks import format_prompt, load_problems

    cfg = load("configs/reasoning_grpo_tiny.yaml", [
        f"rollout.prompts_per_step={prompts}", f"algorithm.group_size={group}",
        f"rollout.max_new_tokens={max_new_tokens}", "task.num_train=64"], schema=ReasoningJobConfig)
    model_dir = prepare_model_dir(cfg, root)
    tok = AutoTokenizer.from_pretrained(model_dir)
    probs = load_problems(cfg.task, "train")
    reqs = [PromptRequest(j, p.uid, format_prompt(tok, cfg.task, p.question), p.answer)
            for j, p in enumerate(probs[:prompts])]
    store = weight_store("bench-reasoning-weights", create=True)
    state = AutoModelForCausalLM.from_pretrained(model_dir).state_dict()
    ray.get(store.publish.remote(0, [ray.put(state)]))
    return cfg, model_dir, reqs, store


def measure_reasoning(cfg, model_dir, reqs, preemptible: int, iterations: int, cost_s: float,
                      chunk: int, shard_responses: int, kills: int = 0, standby: int = 0) -> dict:
    """Generate ``iterations`` steps (after a warm-up step) on 1 reserved + ``preemptible``
    workers; with ``kills``, the workers that get preemptible requests 1, 3, 5, ... are killed
    (replacements join at once)."""
    from rlinf_embodied.config import ElasticConfig, PreemptionConfig, PreemptionEvent
    from rlinf_embodied.elastic.pool import ElasticRolloutPool
    from rlinf_embodied.reasoning.elastic import ElasticReasoningWorker, migration_metrics, shard_items

    G = cfg.algorithm.group_size
    sched = [PreemptionEvent(**e) for e in kill_schedule(iterations, kills)]
    e = ElasticConfig(reserved_workers=1, preemptible_workers=preemptible, preemptible_resource="",
                      standby_workers=standby,
                      shard_responses=shard_responses, chunk_tokens=chunk, wait_for_joins=True,
                      preemption=PreemptionConfig(mode="schedule" if kills else "off", schedule=sched))
    n = len(reqs) * G // shard_responses
    pool = ElasticRolloutPool(cfg, None, "bench-reasoning-weights", elastic=e, num_shards=n,
                              worker_cls=ElasticReasoningWorker,
                              init_args=(cfg, model_dir, "bench-reasoning-weights", chunk, cost_s))
    try:
        t0 = time.perf_counter()
        pool.start()
        start_s = time.perf_counter() - t0
        pool.collect(0, 0, shard_items(reqs, G, cfg.run.seed, 0, shard_responses))  # warm-up
        res, wall = timed_iterations(pool, iterations, lambda i: pool.collect(
            i, 0, shard_items(reqs, G, cfg.run.seed, i, shard_responses)))
    finally:
        pool.shutdown()
    items = [[it for part in r.parts[0] for it in part] for r in res]
    tokens = sum(len(it["response_ids"]) for its in items for it in its)
    mig = [migration_metrics(its, r.record["events"], chunk, shard_responses) for its, r in zip(items, res)]
    out = {"tokens_per_s": tokens / wall, "tokens": tokens, "wall_s": wall, "pool_start_s": start_s,
           "reserved_share": sum(r.metrics["elastic/reserved_share"] for r in res) / len(res),
           "preemptions": sum(r.metrics["elastic/preemptions"] for r in res),
           "lost_shards": sum(r.metrics["elastic/lost_shards"] for r in res)}
    for k in mig[0]:
        out[k.split("/")[1]] = sum(m[k] for m in mig)
    if kills:
        out["times"] = preemption_times([r.record for r in res], pool.events)
    out["responses"] = [[(it["group"], it["sample"], it["response_ids"], it["logprobs"]) for it in its]
                        for its in items]
    return out


def bench_reasoning(quick: bool) -> dict:
    import tempfile

    prompts, group, max_new = (4, 4, 6) if quick else (8, 4, 8)
    cost_s, chunk, shard_responses = (0.02, 2, 2) if quick else (0.05, 2, 2)  # sleep >> a tiny forward
    iterations = 1 if quick else 3
    with tempfile.TemporaryDirectory() as root:
        cfg, model_dir, reqs, store = reasoning_setup(root, prompts, group, max_new)  # noqa: F841
        runs = {key: measure_reasoning(cfg, model_dir, reqs, p, iterations, cost_s, chunk, shard_responses)
                for p, key in ((0, "reserved_only"), (1, "plus_1_preemptible"), (2, "plus_2_preemptible"))}
        runs["plus_2_preempted"] = measure_reasoning(cfg, model_dir, reqs, 2, iterations, cost_s, chunk,
                                                     shard_responses, kills=KILLS, standby=KILLS)
        runs["plus_2_preempted_no_standby"] = measure_reasoning(
            cfg, model_dir, reqs, 2, iterations, cost_s, chunk, shard_responses, kills=KILLS)
    same = all(runs[k]["responses"] == runs["reserved_only"]["responses"]
               for k in ("plus_2_preempted", "plus_2_preempted_no_standby"))
    for r in runs.values():
        del r["responses"]
    tput = {k: v["tokens_per_s"] for k, v in runs.items()}
    pre = runs["plus_2_preempted"]
    return {"workload": {"prompts": prompts, "group_size": group, "max_new_tokens": max_new,
                         "token_cost_s": cost_s, "chunk_tokens": chunk, "shard_responses": shard_responses,
                         "steps": iterations},
            "tokens_per_s": tput,
            "speedup_vs_reserved_only": {k: v / tput["reserved_only"] for k, v in tput.items()},
            "preempted": {k: pre[k] for k in ("preemptions", "lost_shards", "migrated_responses",
                                              "resumed_tokens", "lost_token_bound", "times")},
            "preempted_no_standby": runs["plus_2_preempted_no_standby"]["times"],
            "preempted_responses_equal_reserved_only": same,
            "breakdown": runs}


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
        kills = ["elastic.preemption.mode=schedule",
                 f"elastic.preemption.schedule={json.dumps(kill_schedule(iterations, KILLS))}"]
        out["plus_2_preempted"] = measure_throughput(job(2, shards, shard_envs, steps, sleep_s, [
            *kills, f"elastic.standby_workers={KILLS}"]), spec, "bench-weights", iterations)
        out["plus_2_preempted_no_standby"] = measure_throughput(
            job(2, shards, shard_envs, steps, sleep_s, kills), spec, "bench-weights", iterations)
        same = all(out[k]["episodes"] == out["reserved_only"]["episodes"]
                   for k in ("plus_2_preempted", "plus_2_preempted_no_standby"))
        for v in out.values():
            del v["episodes"]
        rec = measure_preemption(job(1, shards, shard_envs, steps, sleep_s,
                                     ["elastic.wait_for_joins=false"]), spec, "bench-weights",
                                 steps * shard_envs * sleep_s)
        reasoning = bench_reasoning(args.quick)
    finally:
        ray.shutdown()
    tput = {k: v["env_steps_per_s"] for k, v in out.items()}
    result = {
        "bench": "elastic", "quick": args.quick,
        "workload": {"shards": shards, "shard_envs": shard_envs, "rollout_steps": steps,
                     "step_sleep_s": sleep_s, "nominal_shard_s": steps * shard_envs * sleep_s},
        "throughput_env_steps_per_s": tput,
        "speedup_vs_reserved_only": {k: v / tput["reserved_only"] for k, v in tput.items()},
        "preempted": out["plus_2_preempted"]["times"],
        "preempted_no_standby": out["plus_2_preempted_no_standby"]["times"],
        "preempted_episodes_equal_reserved_only": same,
        "join_first_request_s": rec["join_first_request_s"],
        "join_ready_s": rec["join_ready_s"],
        "recovery_s": rec["recovery_s"],
        "breakdown": {**out, "preemption": rec},
        "reasoning": reasoning,
        "loadavg_before": load_before, "loadavg_after": open("/proc/loadavg").read().split()[:3],
        "cpus": os.cpu_count(), "seconds": time.perf_counter() - t_all,
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
