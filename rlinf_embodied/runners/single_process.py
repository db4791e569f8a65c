"""A plain single-process rollout (no Ray, no channels): the baseline the framework is measured
against (``benchmarks/bench_train.py``) and the in-process learning loop of
``benchmarks/bench_learning.py``."""

from __future__ import annotations

import torch

__all__ = ["rollout_batch"]


def rollout_batch(policy, env, obs: dict, steps: int, mode: str = "sample") -> tuple[dict, dict, int]:
    """Run ``policy`` for ``steps`` queries on ``env`` and stack a time-major trajectory dict.

    Args:
        policy: a :class:`~rlinf_embodied.policies.Policy`.
        env: a BatchedEnv with N envs (NEXT_STEP autoreset).
        obs: the env's current observation.
        steps: T, policy queries per env.
        mode: ``"sample"`` or ``"greedy"`` (:meth:`Policy.act`).

    Returns:
        ``(batch, obs, env_steps)``: the dict :func:`~rlinf_embodied.algorithms.update.update_policy`
        takes (``actions``/``logprobs``/``forward_inputs`` (T, N, ...), ``values`` (T + 1, N)
        for a policy with a critic, ``rewards``/``terminations``/``truncations``/``valid``/
        ``success`` (T, N)), the last observation, and the env steps taken (sub-steps of
        action chunks counted).
    """
    rec, env_steps = [], 0
    for _ in range(steps):
        with torch.no_grad():
            out = policy.act(obs, mode=mode)
        obs, r, term, trunc, info = env.chunk_step(out.actions)
        rec.append((out, r.sum(-1).float(), term.any(-1), trunc.any(-1),
                    ~info["autoreset"].bool(), info["success_once"].bool()))
        env_steps += int(info["num_substeps"].sum())
    outs = [x[0] for x in rec]
    batch = {
        "actions": torch.stack([o.actions for o in outs]),
        "logprobs": torch.stack([o.logprobs for o in outs]),
        "forward_inputs": {k: torch.stack([o.forward_inputs[k] for o in outs])
                           for k in outs[0].forward_inputs},
        **{k: torch.stack([x[i] for x in rec]) for i, k in enumerate(
            ("rewards", "terminations", "truncations", "valid", "success"), start=1)},
    }
    if outs[0].values is not None:
        with torch.no_grad():
            last = policy.predict_values(obs)
        batch["values"] = torch.stack([o.values for o in outs] + [last])
    return batch, obs, env_steps
