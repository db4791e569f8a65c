"""Training throughput: the framework against a single-process loop, pipelining, context switching.

Prints one JSON line last:

* ``framework_vs_single_process``: env steps/s of the PushCube PPO job (collocated, Ray
  workers, FSDP actor) over a single-process CleanRL-style PPO loop on the same env pool and the
  same model and update code (``update_policy``). Target >= 0.85.
* ``pipeline2_vs_1``: rollout throughput with ``trainer.pipeline_stages=2`` over 1, envs
  in-process in the env worker (one core) and a policy whose inference time is close to the
  env step time on the rollout worker (the other core): the compute-bound token policy of
  benchmarks/token_policy.py, its depth calibrated (``pipeline_policy``). Target >= 1.6 (limit 2.0).
* ``pipelined_vs_single_process``: the same calibrated setting, the framework with 2 stages
  over a naive single-process rollout loop that steps the same envs in-process and runs the
  same policy in turn. Target >= 1.5 (limit 2.0).
* ``query_overhead_ms``: time per policy query beyond the policy's forward (1 stage, steady
  state): env put + env wait for the reply - rollout forward. Target <= 0.5.
* The three pipelining figures are steady state: medians of per-rollout rates over 6 timed
  rollouts (12 without ``--quick``) after ``WARMUP_ITERATIONS`` untimed ones, for both sides
  of each ratio; every timed rate is in ``hops_stage*.steps_per_s``.
* ``hops_stage1`` / ``hops_stage2``: per-query breakdown in ms (env step, env put, env wait, rollout wait,
  rollout forward, rollout put), and per message of each direction (``request_*``: env ->
  rollout, end-of-stream messages included; ``reply_*``: rollout -> env) the transport's parts:
  ``encode`` (producer), ``wire`` (sent to arrival: system call, wake-up, any wait in the
  socket while the consumer is busy), ``decode`` and ``handoff`` (decoded to taken by ``get``).
* ``cold_encode_us``: one message's encode warm and right after 10 ms of other work (see
  :func:`cold_encode_us`): the machine's price of a cold hop.
* ``framework_iteration``: the main job's mean iteration after the first, in seconds: wall
  ``iteration_s`` and the runner's ``time/...`` parts (``rollout_s`` contains ``env_step_s`` and
  ``generate_s``, which overlap).
* ``context_switch_ms``: per-iteration device-lock acquire + onload + offload + release overhead
  in collocated mode (the max over groups; on CPU onload/offload move nothing).

Usage: ``python benchmarks/bench_train.py [--quick]``
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rlinf_embodied.config import load_config  # noqa: E402

MAIN = ROOT / "configs" / "maniskill_pushcube_ppo_mlp.yaml"


ITERATION_PARTS = ("rollout_s", "env_step_s", "generate_s", "train_s", "weight_sync_s", "context_switch_s")
"""The main job's per-iteration ``time/...`` metrics that ``framework_iteration`` averages."""


WARMUP_ITERATIONS = 3
"""Untimed rollouts before the pipelining and hop figures are timed. Measured on the 2-core
machine: with one warm-up rollout the 8-env forward of the calibrated policy still took 23 ms
against 16 ms calibrated over the next two rollouts (Ray's start-up work and first-touch
allocations share the cores), which put pipeline2_vs_1 at 1.20 instead of 1.6; from the third
rollout on it runs at the calibrated speed (steady state, as the targets ask)."""


def framework_steps_per_s(cfg, run_dir: Path) -> tuple[float, float, dict]:
    """(env steps/s after the first iteration, mean context switch ms per iteration, the mean
    iteration breakdown in seconds: wall ``iteration_s`` and the runner's ``time/...`` parts)."""
    from rlinf_embodied.runners.embodied import EmbodiedRunner

    EmbodiedRunner(cfg, run_dir).run()
    hist = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = hist[-1]["env_steps"] - hist[0]["env_steps"]
    secs = hist[-1]["time_s"] - hist[0]["time_s"]
    switch = [h["time/context_switch_s"] for h in hist[1:]]
    timed = hist[1:]  # the first iteration warms up
    parts = {"iteration_s": round(secs / max(1, len(timed)), 4)}
    parts.update({k: round(sum(h[f"time/{k}"] for h in timed) / max(1, len(timed)), 4) for k in ITERATION_PARTS})
    return steps / secs, 1000 * sum(switch) / max(1, len(switch)), parts


def single_process_steps_per_s(cfg) -> float:
    """CleanRL-style loop: one process, same env pool, same policy and update code."""
    from rlinf_embodied.envs import make_env
    from rlinf_embodied.policies import build_policy
    from rlinf_embodied.policies.base import SpaceSpec
    from rlinf_embodied.algorithms.update import make_optimizer, update_policy
    from rlinf_embodied.runners.single_process import rollout_batch

    torch.set_num_threads(1)
    env = make_env(cfg.env)
    obs, _ = env.reset(seed=0)
    spec = SpaceSpec.from_env(env, obs)
    torch.manual_seed(cfg.run.seed)
    policy = build_policy(cfg.policy, spec)
    opt, _ = make_optimizer(policy, cfg.trainer)
    T = cfg.trainer.rollout_steps
    steps, t_start = 0, None
    for it in range(cfg.trainer.iterations):
        if it == 1:
            t_start, steps = time.perf_counter(), 0
        obs, _ = env.reset(seed=1000 * it)
        batch, obs, n = rollout_batch(policy, env, obs, T)
        steps += n
        update_policy(policy, opt, batch, cfg, it)
    env.close()
    return steps / (time.perf_counter() - t_start)


def rollout_steps_per_s(cfg, stages: int, iterations: int, warmup: int = WARMUP_ITERATIONS) -> tuple[float, dict]:
    """Env steps/s of the rollout phase (the actor drains trajectories untimed) with ``stages``
    pipeline stages: the median over ``iterations`` timed rollouts after ``warmup`` untimed
    ones (the machine is shared: a mean takes in every preemption of either worker), and the
    per-hop breakdown of the timed rollouts (ms per policy query): env step, env put, env wait for the
    reply, rollout wait for a request, rollout forward, rollout put; ``steps_per_s``: every
    timed rollout's rate."""
    from rlinf_embodied.runners.setup import launch_groups
    from rlinf_embodied.runtime import wait_all

    cfg = dataclasses.replace(cfg, trainer=dataclasses.replace(cfg.trainer, pipeline_stages=stages))
    with tempfile.TemporaryDirectory() as d:
        g = launch_groups(cfg, Path(d), f"bench-pipe{stages}-{os.getpid()}", None)
        try:
            g.sync.push(0)
            rates = []
            hops = dict.fromkeys(("env_step", "env_put", "env_wait", "rollout_wait", "rollout_forward", "rollout_put"), 0.0)
            queries = 0
            messages = {"request": 0, "reply": 0}  # the per-message parts are per message
            for it in range(warmup + iterations):
                t0 = time.perf_counter()
                env_out, srv_out = wait_all(g.env.rollout(it), _serve(g, 0))
                if it >= warmup:
                    rates.append(sum(s["env_steps"] for s in env_out) / (time.perf_counter() - t0))
                    queries += sum(s["queries"] for s in env_out)
                    for s in env_out:
                        hops["env_step"] += s["env_time_s"]
                        hops["env_put"] += s["put_s"]
                        hops["env_wait"] += s["wait_s"]
                    for s in srv_out:
                        hops["rollout_wait"] += s["wait_s"]
                        hops["rollout_forward"] += s["forward_s"]
                        hops["rollout_put"] += s["put_s"]
                    for side, profiles in (("request", [s["request_hops"] for s in srv_out]),
                                           ("reply", [s["reply_hops"] for s in env_out])):
                        for p in profiles:
                            messages[side] += p["messages"]
                            for part in ("encode", "wire", "decode", "handoff"):
                                hops[f"{side}_{part}"] = hops.get(f"{side}_{part}", 0.0) + p[f"{part}_s"]
                g.actor.on(list(range(g.actor.world_size))).train(it).wait()  # drain trajectories
            breakdown = {f"{k}_ms": round(1000 * v / max(1, messages.get(k.split("_")[0], queries)), 3)
                         for k, v in hops.items()}
            breakdown["request_messages"] = messages["request"]
            breakdown["queries"] = queries
            breakdown["steps_per_s"] = [round(r, 1) for r in rates]
            return statistics.median(rates), breakdown
        finally:
            g.shutdown()


def _serve(g, version):
    """The rollout group's ``serve`` call of one training rollout, as the runner makes it."""
    return g.rollout.serve(version)


def single_process_rollout_steps_per_s(cfg, iterations: int, warmup: int = WARMUP_ITERATIONS) -> float:
    """Env steps/s of a naive rollout loop: one process steps the same envs in-process and runs
    the same policy in turn (act on all envs, step all envs), ``rollout_steps`` queries per
    rollout: the median over ``iterations`` timed rollouts after ``warmup`` untimed ones."""
    from rlinf_embodied.envs import make_env
    from rlinf_embodied.policies import build_policy
    from rlinf_embodied.policies.base import SpaceSpec

    torch.set_num_threads(1)
    env = make_env(cfg.env)
    obs, _ = env.reset(seed=0)
    spec = SpaceSpec.from_env(env, obs)
    torch.manual_seed(cfg.run.seed)
    policy = build_policy(cfg.policy, spec).eval()
    rates = []
    with torch.no_grad():
        for it in range(warmup + iterations):
            t0 = time.perf_counter()
            obs, _ = env.reset(seed=1000 * it)
            n = 0
            for _ in range(cfg.trainer.rollout_steps):
                out = policy.act(obs)
                obs, r, term, trunc, info = env.chunk_step(out.actions)
                n += int(info["num_substeps"].sum())
            policy.predict_values(obs)
            if it >= warmup:
                rates.append(n / (time.perf_counter() - t0))
    env.close()
    return statistics.median(rates)


TOKEN_POLICY = ["policy.type=benchmarks.token_policy:TokenMLPPolicy", "policy.num_tokens=64"]
"""The calibrated policy: compute-bound, its forward proportional to the batch (see
benchmarks/token_policy.py for why a wide plain MLP is not a fair stand-in)."""


def calibrate_layers(cfg, n: int) -> tuple[int, float, float]:
    """Per-token layers of the token policy whose ``act`` on n observations takes about as long
    as one step of n in-process envs (the regime where pipelining can approach 2x). The env
    steps with actions the initial policy samples from its live observations (as in a
    rollout: 13.3 ms per step of 8 PushCube envs measured, against 10.6 ms with zero actions).

    Times are medians of repeated calls (the machine is shared: a mean takes in every
    preemption). Layers grow over a coarse grid until ``act`` is slower than the env step, then
    every layer count between the last two grid points is tried.

    Returns:
        (layers, env step ms, act ms) at n.
    """
    import statistics

    from rlinf_embodied.envs import make_env
    from rlinf_embodied.policies import build_policy
    from rlinf_embodied.policies.base import SpaceSpec

    def median_s(fn, reps: int) -> float:
        fn()
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        return statistics.median(times)

    torch.set_num_threads(1)
    env = make_env(dataclasses.replace(cfg.env, num_envs=n, num_processes=0))
    obs, _ = env.reset(seed=0)
    spec = SpaceSpec.from_env(env, obs)
    torch.manual_seed(cfg.run.seed)
    sampler = build_policy(cfg.policy, spec)
    live = {"obs": obs}

    def step() -> None:  # the policy's own sampled actions: contacts make it slower than zeros
        with torch.no_grad():
            actions = sampler.act(live["obs"]).actions
        t0 = time.perf_counter()
        live["obs"] = env.chunk_step(actions)[0]
        times.append(time.perf_counter() - t0)

    times: list[float] = []
    for _ in range(31):
        step()
    env_s = statistics.median(times[1:])
    env.close()
    acts: dict[int, float] = {}

    def act_s(layers: int) -> float:
        if layers not in acts:
            pcfg = load_config(MAIN, TOKEN_POLICY + [f"policy.token_layers={layers}"]).policy
            policy = build_policy(pcfg, spec)
            with torch.no_grad():
                acts[layers] = median_s(lambda: policy.act(obs), 15)
        return acts[layers]

    grid = (1, 2, 3, 4, 6, 8, 10, 12, 16, 20, 24, 32)
    prev = grid[0]
    for layers in grid:
        if act_s(layers) > env_s:
            for between in range(prev + 1, layers):
                act_s(between)
            break
        prev = layers
    best = min(acts, key=lambda k: abs(acts[k] - env_s))
    return best, round(1000 * env_s, 2), round(1000 * acts[best], 2)


def cold_encode_us(reps: int = 50) -> dict:
    """What one message costs this machine's CPU warm and cold: median microseconds to encode a
    PolicyRequest of 16 state observations back to back (``warm``) and right after 10 ms of
    other work (``after_10ms_work``, a policy query's rhythm: every hop of a query runs after
    an env step, a forward or a wait). The gap is the cache and TLB refill that every hop of
    ``query_overhead_ms`` pays; it belongs to the machine, not to the transport's code."""
    from rlinf_embodied.runtime.transports.codec import encode
    from rlinf_embodied.workers.messages import PolicyRequest

    torch.set_num_threads(1)
    req = PolicyRequest({"states": torch.randn(16, 42)}, 0, "e0s0")
    w, x = torch.randn(256, 256), torch.randn(1024, 256)
    warm, cold = [], []
    for _ in range(reps):
        end = time.perf_counter() + 0.01
        while time.perf_counter() < end:
            x = torch.tanh(x @ w)
        t0 = time.perf_counter()
        encode(("r0", req))
        t1 = time.perf_counter()
        encode(("r0", req))
        cold.append(t1 - t0)
        warm.append(time.perf_counter() - t1)
    return {"warm": round(1e6 * statistics.median(warm), 1), "after_10ms_work": round(1e6 * statistics.median(cold), 1)}


def _loadavg() -> str:
    """The 1, 5 and 15 minute load averages (the machine may be shared)."""
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return ""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer iterations (about 3 minutes)")
    args = ap.parse_args()
    # Ray workers import the calibrated policy by its module path (benchmarks.token_policy)
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    iters = 4 if args.quick else 8
    common = [f"trainer.iterations={iters}", "trainer.eval_every=0", "trainer.save_every=0",
              "logging.tensorboard=false", "logging.console=false", "trainer.max_time_s=null"]
    result = {"quick": args.quick}
    with tempfile.TemporaryDirectory() as d:
        cfg = load_config(MAIN, common + [f"run.dir={d}/fw"])
        fw, switch_ms, fw_parts = framework_steps_per_s(cfg, Path(d) / "fw")
    sp = single_process_steps_per_s(cfg)
    result.update(framework_steps_per_s=round(fw, 1), single_process_steps_per_s=round(sp, 1),
                  framework_vs_single_process=round(fw / sp, 3), context_switch_ms=round(switch_ms, 2),
                  framework_iteration=fw_parts)
    # Pipelining: envs in the env worker's process (one core), a policy as slow as the envs.
    layers, env_ms, act_ms = calibrate_layers(cfg, 8)
    result["pipeline_policy"] = {"token_layers": layers, "env_step_ms_8": env_ms, "act_ms_8": act_ms}
    pipe = load_config(MAIN, common + ["env.num_processes=0", "env.num_envs=16", *TOKEN_POLICY,
                                       f"policy.token_layers={layers}", "trainer.rollout_steps=25",
                                       "placement=disaggregated", "cluster.num_cpu_devices=3",
                                       "cluster.num_cpus=1",  # one torch thread per worker, as calibrated
                                       "trainer.update_epochs=1", "trainer.num_minibatches=1"])
    rollouts = 6 if args.quick else 12  # timed, after WARMUP_ITERATIONS (about 1.5 s each)
    p1, hops1 = rollout_steps_per_s(pipe, 1, rollouts)
    p2, hops2 = rollout_steps_per_s(pipe, 2, rollouts)
    naive = single_process_rollout_steps_per_s(pipe, rollouts)
    result.update(rollout1_steps_per_s=round(p1, 1), rollout2_steps_per_s=round(p2, 1),
                  pipeline2_vs_1=round(p2 / p1, 3), naive_rollout_steps_per_s=round(naive, 1),
                  pipelined_vs_single_process=round(p2 / naive, 3),
                  # one stage: the env waits for every reply, so its wait beyond the forward is
                  # what a query costs the framework (transport, wake-ups, serialisation)
                  query_overhead_ms=round(hops1["env_put_ms"] + hops1["env_wait_ms"] - hops1["rollout_forward_ms"], 3),
                  hops_stage1=hops1, hops_stage2=hops2, cold_encode_us=cold_encode_us(), loadavg=_loadavg())
    print(json.dumps(result))


if __name__ == "__main__":
    main()
