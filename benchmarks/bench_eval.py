"""Evaluation throughput: LIBERO episodes per hour with the random policy, and what the
batch-invariant policy path costs.

Runs ``rlinf_embodied.eval.run.evaluate`` on libero_spatial task 0 for state-only and rendered
(two cameras) observations, with 1 and 2 env processes (one env per process), and reports
episodes per hour measured from the moment the env is built to the last finished episode (env
construction excluded: it is paid once per evaluation). The random policy never succeeds, so
every episode runs to max steps.

Batch invariance (issue 38): the same evaluation with and without ``batch_invariant`` (one
forward per env row vs one batched forward per query), N = 8 envs in-process, for an MLP
checkpoint (random weights) on toy/PointReach-v0 (a near-free env: the policy's share is
largest) and on ManiSkill PushCube-v1 (state), plus the policy alone (``*_policy_*``) for that
MLP and a tiny OpenVLA-OFT (64 px, two cameras, proprio), with torch's default threads and with
one. Each reports env steps/s (or queries/s), policy forwards/s (a row is one forward when
invariant, a batch of N when not), the seconds spent in the policy, and
``..._invariant_vs_batched``: throughput with the invariant path over without (1.0 = free).

Full mode uses the openvla_v1 settings (220 max steps, 256 px); ``--quick`` shortens episodes
(40 steps) and renders 128 px. Prints one JSON line last; ``libero_rgb_eph_2proc_vs_1`` is the
scaling of rendered evaluation from 1 to 2 processes (target >= 1.6 on an idle 2-core machine).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("MUJOCO_GL", "egl")
# One core per env process (ENVIRONMENT.md): Mesa's software rasteriser (llvmpipe) otherwise
# starts one render thread per CPU in every process, so a single process already uses every
# core and process scaling measures contention. Inherited by the pool workers.
os.environ.setdefault("LP_NUM_THREADS", "1")


def run_one(obs_mode: str, procs: int, episodes: int, max_steps: int, image_size: int,
            workdir: Path) -> float:
    """Episodes per hour of one configuration."""
    from rlinf_embodied.envs.registry import make_env
    from rlinf_embodied.eval.request import EvalRequest
    from rlinf_embodied.eval.run import evaluate

    built = {}

    def factory(cfg):
        env = make_env(cfg)
        built["t"] = time.perf_counter()
        return env

    out = workdir / f"{obs_mode}_{procs}.json"
    res = evaluate(EvalRequest(
        env="libero", suite="libero_spatial", tasks=[0], trials_per_task=episodes,
        num_envs=procs, num_processes=procs, obs_mode=obs_mode, policy="random",
        max_steps=max_steps, image_size=image_size if obs_mode == "rgb" else None,
        output=str(out), reports=False, env_factory=factory,
    ))
    elapsed = time.perf_counter() - built["t"]
    assert len(res.episodes) == episodes
    return episodes / elapsed * 3600.0


def _counted(log: dict):
    """A ``run_pairs`` that times and counts the policy calls of one evaluation into ``log``."""
    import rlinf_embodied.eval.run as run_mod

    real = run_mod.run_pairs

    def run_pairs(env, act, *args, **kwargs):
        invariant = getattr(act, "per_episode", False)

        def timed(obs, episodes=None):
            t0 = time.perf_counter()
            out = act(obs, episodes) if invariant else act(obs)
            log["policy_s"] += time.perf_counter() - t0
            # invariant: one forward per active env; batched: one forward of the whole batch
            log["forwards"] += sum(k is not None for k in episodes) if invariant else 1
            return out

        timed.per_episode = invariant
        return real(env, timed, *args, **kwargs)

    return real, run_pairs


def invariance_cost(env: str, num_envs: int, episodes: int, max_steps: int,
                    workdir: Path, repeats: int = 2) -> dict:
    """Env steps/s and policy forwards/s of one evaluation with and without batch invariance.

    The two settings alternate (batched first) ``repeats`` times and each keeps its fastest
    run, so warm-up and a busy machine's bursts bias neither.

    Args:
        env: ``gym`` (toy/PointReach-v0) or ``maniskill`` (PushCube-v1, state, physx_cpu).
        num_envs: N, envs in-process.
        episodes: trials.
        max_steps: steps per episode.
        workdir: where the checkpoint and results files go.
        repeats: runs of each setting.
    """
    import torch

    import rlinf_embodied.eval.run as run_mod
    from rlinf_embodied.envs.registry import make_env
    from rlinf_embodied.eval.request import EvalRequest
    from rlinf_embodied.policies.base import SpaceSpec
    from rlinf_embodied.policies.configuration_actor_critic import MLPPolicyConfig
    from rlinf_embodied.policies.registry import build_policy, save_policy

    if env == "gym":
        where = dict(env="gym", task="toy/PointReach-v0")
        spec = SpaceSpec(action_low=[-1.0] * 2, action_high=[1.0] * 2, state_dim=4)
    else:
        where = dict(env="maniskill", task="PushCube-v1", obs_mode="state",
                     env_overrides={"sim_backend": "physx_cpu"})
        spec = SpaceSpec(action_low=[-1.0] * 8, action_high=[1.0] * 8, state_dim=35)
    torch.manual_seed(0)
    ckpt = save_policy(build_policy(MLPPolicyConfig(hidden_sizes=[256, 256]), spec),
                       workdir / f"{env}_mlp")
    out = {}
    for run, invariant in enumerate([False, True] * repeats):
        log = {"policy_s": 0.0, "forwards": 0}
        built = {}

        def factory(cfg):
            e = make_env(cfg)
            built["t"] = time.perf_counter()
            return e

        real, counted = _counted(log)
        run_mod.run_pairs = counted
        try:
            res = run_mod.evaluate(EvalRequest(
                policy=str(ckpt), trials_per_task=episodes, num_envs=num_envs, num_processes=0,
                max_steps=max_steps, device="cpu", reports=False, env_factory=factory,
                batch_invariant=invariant, output=str(workdir / f"{env}_{run}.json"),
                **where))
        finally:
            run_mod.run_pairs = real
        elapsed = time.perf_counter() - built["t"]
        steps = sum(e.steps for e in res.episodes)
        tag = "invariant" if invariant else "batched"
        if steps / elapsed <= out.get(f"{env}_mlp_{tag}_env_steps_per_s", 0.0):
            continue  # a slower repeat
        out[f"{env}_mlp_{tag}_env_steps_per_s"] = round(steps / elapsed, 1)
        out[f"{env}_mlp_{tag}_forwards_per_s"] = round(log["forwards"] / elapsed, 1)
        out[f"{env}_mlp_{tag}_policy_s"] = round(log["policy_s"], 3)
    out[f"{env}_mlp_invariant_vs_batched"] = round(
        out[f"{env}_mlp_invariant_env_steps_per_s"] / out[f"{env}_mlp_batched_env_steps_per_s"], 3)
    return out


def _policy(kind: str):
    """A tiny policy with random weights and an observation batch maker for it: ``mlp``
    (PushCube state, 2 x 256) or ``oft`` (OpenVLA-OFT, 64 px, two cameras, proprio, K = 8)."""
    import torch

    from rlinf_embodied.policies.base import SpaceSpec
    from rlinf_embodied.policies.registry import build_policy

    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    if kind == "mlp":
        from rlinf_embodied.policies.configuration_actor_critic import MLPPolicyConfig

        spec = SpaceSpec(action_low=[-1.0] * 8, action_high=[1.0] * 8, state_dim=35)
        return (build_policy(MLPPolicyConfig(hidden_sizes=[256, 256]), spec),
                lambda n: {"states": torch.randn(n, 35, generator=g)})
    from rlinf_embodied.policies.configuration_openvla import OpenVLAOFTPolicyConfig

    h = 64
    spec = SpaceSpec(action_low=[-1.0] * 7, action_high=[1.0] * 7, state_dim=8,
                     image_shape=(h, h, 3), wrist_image_shape=(h, h, 3))
    policy = build_policy(OpenVLAOFTPolicyConfig(action_chunk=8, use_wrist_image=True,
                                                 use_proprio=True, proprio_dim=8,
                                                 max_prompt_tokens=192, critic=False), spec)

    def obs(n):
        img = lambda: torch.randint(0, 256, (n, h, h, 3), dtype=torch.uint8, generator=g)  # noqa: E731
        return {"main_images": img(), "wrist_images": img(), "states": torch.rand(n, 8, generator=g),
                "task_descriptions": ["put the black bowl on the plate"] * n}

    return policy, obs


def policy_cost(kind: str, num_envs: int, seconds: float) -> dict:
    """Queries/s of a tiny policy (:func:`_policy`) on N observations, the policy alone (no
    env): one batched forward vs N forwards of one row, with torch's default intra-op threads
    and with one thread (a busy machine's thread pool can make the batched forward the slower
    one; one thread shows the compute alone). Each setting runs about ``seconds``."""
    import torch

    from rlinf_embodied.eval.acting import policy_act

    policy, make_obs = _policy(kind)
    obs = make_obs(num_envs)
    episodes = [("t", i, 0) for i in range(num_envs)]
    default = torch.get_num_threads()
    out = {f"{kind}_policy_threads": default}
    try:
        for threads in (default, 1):
            torch.set_num_threads(threads)
            tag_t = "" if threads == default else "_1thread"
            for invariant in (False, True):
                act = policy_act(policy, "greedy", batch_invariant=invariant)
                call = (lambda: act(obs, episodes)) if invariant else (lambda: act(obs))
                call()  # warm-up
                calls, t0 = 0, time.perf_counter()
                while calls < 2 or time.perf_counter() - t0 < seconds:
                    call()
                    calls += 1
                dt = time.perf_counter() - t0
                tag = f"{kind}_policy{tag_t}_{'invariant' if invariant else 'batched'}"
                out[f"{tag}_queries_per_s"] = round(calls * num_envs / dt, 2)
                out[f"{tag}_forwards_per_s"] = round(calls * (num_envs if invariant else 1) / dt, 2)
            out[f"{kind}_policy{tag_t}_invariant_vs_batched"] = round(
                out[f"{kind}_policy{tag_t}_invariant_queries_per_s"]
                / out[f"{kind}_policy{tag_t}_batched_queries_per_s"], 3)
    finally:
        torch.set_num_threads(default)
    return out


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="short episodes, 128 px")
    ap.add_argument("--episodes", type=int, default=None, help="episodes per configuration")
    ap.add_argument("--only-invariance", action="store_true",
                    help="skip the LIBERO episodes-per-hour part")
    args = ap.parse_args(argv)
    max_steps, size = (40, 128) if args.quick else (220, 256)
    episodes = args.episodes or 4
    result = {"bench": "eval", "quick": args.quick, "suite": "libero_spatial",
              "max_steps": max_steps, "image_size": size, "episodes": episodes,
              "cpus": os.cpu_count(), "load_avg_start": os.getloadavg()[0]}
    with tempfile.TemporaryDirectory() as tmp:
        n = 8
        result["invariance_num_envs"] = n
        for env, steps in (("gym", 50), ("maniskill", 25 if args.quick else 50)):
            result.update(invariance_cost(env, n, 2 * n, steps, Path(tmp)))
            print(f"{env}: batch-invariant / batched env steps/s "
                  f"{result[f'{env}_mlp_invariant_vs_batched']}", file=sys.stderr)
        for kind in ("mlp", "oft"):
            result.update(policy_cost(kind, n, 3.0 if args.quick else 15.0))
        for mode in (() if args.only_invariance else ("state", "rgb")):
            for procs in (1, 2):
                eph = run_one(mode, procs, episodes, max_steps, size, Path(tmp))
                result[f"libero_{mode}_eph_{procs}proc"] = round(eph, 1)
                print(f"{mode} {procs} proc: {eph:.0f} episodes/hour", file=sys.stderr)
            result[f"libero_{mode}_eph_2proc_vs_1"] = round(
                result[f"libero_{mode}_eph_2proc"] / result[f"libero_{mode}_eph_1proc"], 3)
    result["load_avg_end"] = os.getloadavg()[0]
    result["target_rgb_2proc_vs_1"] = 1.6
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
