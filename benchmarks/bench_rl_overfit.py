"""Overfit check of an RL config: does the update raise success on ONE initial state (or a few)?

The classic sanity check of an RL stack before a long run: every env resets to the same seed
(same task, same initial state) at every iteration, the policy is updated with the config's own
advantage estimator and loss (:func:`~rlinf_embodied.algorithms.update.update_policy`, the code
the actor workers run), and the success rate of the sampled policy on that one state is
recorded per iteration. With a correct pipeline it climbs towards 1 within a few iterations
whenever the start is neither 0 nor 1; a flat or falling curve points at the update (signs,
alignment of samples and advantages, step size), not at the amount of data.

In-process (no Ray, one env pool), so it isolates the math from the runtime. GRPO treats all
``--num-envs`` envs as one group. ``--num-states S`` trains on S states at once (reset seeds
``--reset-seed`` + 0..S-1, each a GRPO group of ``num_envs / S`` envs, every iteration): whether
the update learns several states together (against interference between them), and, evaluated
on held-out trials after ``--save``, whether what it learns transfers.

    python benchmarks/bench_rl_overfit.py --config configs/maniskill_lang3_grpo_openvla_oft_finetune.yaml \
        --set policy.pretrained=runs/x/sft/vla env.reward_mode=sparse --reset-seed 7 --iterations 8

``--quick`` runs the state-MLP GRPO config on PushCube from scratch (dense reward, 4 iterations),
the check that needs no SFT checkpoint.

Prints one JSON line last: ``success`` per iteration (sampled rollouts, before each update,
over all states), ``greedy_before`` / ``greedy_after`` (one greedy episode per env),
``success_per_state`` (sampled: before the first and after the last update), ``approx_kl`` and
``logprob_diff_max`` per update, the task(s), time per stage, load average.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from pathlib import Path

import torch

from rlinf_embodied.runners.single_process import rollout_batch


def _rollout(policy, env, seeds: list, group: int, steps: int, mode: str) -> dict:
    """One fixed-length episode per env, env i reset with ``seeds[i]``; the trajectory dict
    update_policy takes, each ``group`` consecutive envs (one seed) forming one GRPO group."""
    obs, _ = env.reset(seed=seeds)
    batch, _, _ = rollout_batch(policy, env, obs, steps, mode)
    batch["group_ids"] = torch.arange(env.num_envs) // group
    return batch


def _per_state(batch: dict, group: int) -> list:
    """Success of the episodes of each state (``group`` consecutive envs), in seed order."""
    return batch["success"].any(0).float().view(-1, group).mean(1).tolist()


def _args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", default="maniskill_pushcube_grpo_mlp",
                   help="an embodied RL job config: a YAML path or a shipped config's name "
                        "(default maniskill_pushcube_grpo_mlp)")
    p.add_argument("--set", nargs="*", default=[],
                   help="key=value overrides of that config, e.g. policy.pretrained=RUN/sft/vla")
    p.add_argument("--reset-seed", type=int, default=7,
                   help="the one reset seed every env uses (default 7); the first of several "
                        "with --num-states")
    p.add_argument("--num-states", type=int, default=1,
                   help="initial states trained together, seeds --reset-seed + 0..S-1, each a "
                        "GRPO group of num_envs / S envs (default 1)")
    p.add_argument("--num-envs", type=int, default=16,
                   help="envs: the GRPO group of the state, or all groups (default 16)")
    p.add_argument("--iterations", type=int, default=8, help="updates (default 8)")
    p.add_argument("--quick", action="store_true",
                   help="a smoke run of the mechanics: at most 4 iterations of 8 envs (with the "
                        "default config a state MLP from scratch, whose success stays near 0: "
                        "the check's verdict needs a policy whose success on the state lies "
                        "between 0 and 1, e.g. an SFT checkpoint)")
    p.add_argument("--save", default=None,
                   help="write the trained policy to this directory (save_policy layout), e.g. "
                        "to evaluate it on held-out trials with `rlinf-embodied eval --policy DIR`")
    args = p.parse_args()
    for flag in ("num_envs", "iterations", "num_states"):
        if getattr(args, flag) < 1:
            p.error(f"--{flag.replace('_', '-')} must be >= 1 (got {getattr(args, flag)})")
    if args.reset_seed < 0:
        p.error(f"--reset-seed must be >= 0 (got {args.reset_seed})")
    capped = ""
    if args.quick:
        capped = " (--quick caps --num-envs at 8)" if args.num_envs > 8 else ""
        args.iterations, args.num_envs = min(args.iterations, 4), min(args.num_envs, 8)
    if args.num_envs % args.num_states or args.num_envs // args.num_states < 2:
        p.error(f"--num-envs {args.num_envs}{capped} must be a multiple of --num-states "
                f"{args.num_states} with at least 2 envs per state (a GRPO group)")
    return args


def main() -> int:
    args = _args()
    from rlinf_embodied.config import ConfigError

    try:
        out = run(args)
    except (ConfigError, ValueError, FileNotFoundError, NotADirectoryError, PermissionError) as e:
        print(f"error: {str(e).splitlines()[0]}", file=sys.stderr)
        return 2
    print(json.dumps(out))
    return 0


def run(args) -> dict:
    """The check; returns the JSON record.

    Raises:
        ConfigError: a bad config or override (not an embodied RL job config).
        FileNotFoundError: ``policy.pretrained`` / ``policy.checkpoint`` names no checkpoint.
        NotADirectoryError, PermissionError: ``--save`` cannot be written (checked first).
    """
    from rlinf_embodied.algorithms.update import make_optimizer, update_policy
    from rlinf_embodied.config import ConfigError, load_config, save_config
    from rlinf_embodied.envs import make_env
    from rlinf_embodied.policies import build_policy, save_policy
    from rlinf_embodied.policies.base import SpaceSpec

    try:  # one group per state: dynamic sampling would drop it whenever all its envs fail
        cfg = load_config(args.config, [*args.set, "algorithm.filter_low=null",
                                        "algorithm.filter_high=null"])
    except ConfigError as e:
        try:
            load_config(args.config)
        except ConfigError:
            raise ConfigError(f"{str(e).splitlines()[0]} (this check takes an embodied RL job "
                              f"config, e.g. configs/maniskill_*.yaml; an SFT -> RL pipeline "
                              f"names its RL config under rl.config)") from e
        load_config(args.config, args.set)  # a bad --set, reported as given
        raise
    for key in ("pretrained", "checkpoint"):
        path = getattr(cfg.policy, key, None)
        if path and not Path(path).exists():
            raise FileNotFoundError(f"policy.{key}={path} does not exist; train one first (e.g. "
                                    f"`rlinf-embodied sft CONFIG` writes RUN/sft/vla) or fix the path")
    if args.save:
        if Path(args.save).exists() and not Path(args.save).is_dir():
            raise NotADirectoryError(f"--save {args.save} is a file; name a directory")
        Path(args.save).mkdir(parents=True, exist_ok=True)  # fails now, not after the run
    torch.manual_seed(cfg.run.seed)
    env = make_env(dataclasses.replace(cfg.env, num_envs=args.num_envs, ignore_terminations=True,
                                       video=False))
    try:
        group = env.num_envs // args.num_states
        seeds = [args.reset_seed + i // group for i in range(env.num_envs)]
        obs, _ = env.reset(seed=seeds)
        tasks = ([str(obs["task_descriptions"][i]) for i in range(0, env.num_envs, group)]
                 if "task_descriptions" in obs else [cfg.env.type] * args.num_states)
        policy = build_policy(cfg.policy, SpaceSpec.from_env(env, obs))
        optimizer, _ = make_optimizer(policy, cfg.trainer)
        steps = -(-(env.max_episode_steps or cfg.trainer.rollout_steps * cfg.policy.action_chunk)
                  // max(1, cfg.policy.action_chunk))

        def success(mode: str) -> float:
            return float(_rollout(policy, env, seeds, group, steps, mode)["success"].any(0).float().mean())

        t0 = time.perf_counter()
        out = {"config": os.path.basename(str(args.config)), "overrides": args.set,
               "task": tasks[0] if args.num_states == 1 else tasks,
               "reset_seed": args.reset_seed, "num_states": args.num_states,
               "num_envs": env.num_envs, "greedy_before": success("greedy"), "success": [],
               "return": [], "valid_fraction": [], "approx_kl": [], "logprob_diff_max": [],
               "rollout_s": 0.0, "train_s": 0.0}
        for it in range(args.iterations):
            t = time.perf_counter()
            batch = _rollout(policy, env, seeds, group, steps, "sample")
            out["rollout_s"] += time.perf_counter() - t
            ok = batch["valid"].float()
            if it == 0:
                out["success_per_state"] = {"before": _per_state(batch, group)}
            out["success"].append(float(batch["success"].any(0).float().mean()))
            out["return"].append(float((batch["rewards"] * ok).sum(0).mean()))
            t = time.perf_counter()
            m = update_policy(policy, optimizer, batch, cfg, it)
            out["train_s"] += time.perf_counter() - t
            valid = m.get("train/valid_fraction", 1.0)
            out["valid_fraction"].append(valid)
            out["approx_kl"].append(m.get("train/approx_kl"))
            # nothing to compare when no sample entered the loss
            out["logprob_diff_max"].append(m.get("train/rollout_logprob_diff_max") if valid > 0 else None)
            print(f"iteration {it + 1}: success {out['success'][-1]:.3f} return "
                  f"{out['return'][-1]:.2f} approx_kl {m.get('train/approx_kl', 0):.4f} grad_norm "
                  f"{m.get('train/grad_norm', 0):.3g}", flush=True)
        last = _rollout(policy, env, seeds, group, steps, "sample")
        out["success_after"] = float(last["success"].any(0).float().mean())
        out["success_per_state"]["after"] = _per_state(last, group)
        out["greedy_after"] = success("greedy")
        out["wall_s"] = time.perf_counter() - t0
        out["load_avg"] = os.getloadavg()[0]
        if args.save:
            out["saved"] = str(save_policy(policy, args.save))
            # the job config beside it (`rlinf-embodied eval --policy DIR` takes its env from
            # it), with the env count this check ran, and the check's record
            save_config(dataclasses.replace(cfg, env=dataclasses.replace(cfg.env, num_envs=env.num_envs)),
                        args.save)
            (Path(args.save) / "overfit_check.json").write_text(json.dumps(out, indent=1))
    finally:
        env.close()
    return out


if __name__ == "__main__":
    sys.exit(main())
