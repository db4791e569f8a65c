"""One GRPO update of a policy on a single group of N sampled actions from one observation
(half rewarded), shared by the VLA families' update-direction tests."""

from __future__ import annotations

import torch

from rlinf_embodied.algorithms.update import update_policy


def one_group_update(p, out, cfg, lr: float, rewards: torch.Tensor | None = None
                     ) -> tuple[torch.Tensor, torch.Tensor, dict]:
    """Update ``p`` once (plain SGD at ``lr``: the step follows the clipped gradient, where
    Adam's first step is a sign step of the same size for every weight) on ``out`` (an
    ``act`` output of N samples) with rewards 1, 0, 1, 0, ... (or ``rewards``, (N,)) in one
    group.

    Returns ``(up, down, metrics)``: the summed log-prob change per sample of the rewarded and
    the unrewarded samples, and the update's metrics.
    """
    n = out.actions.shape[0]
    rewards = (torch.tensor([1.0, 0.0] * (n // 2)) if rewards is None else rewards)[None]  # (T=1, N)
    batch = {"forward_inputs": {k: v[None] for k, v in out.forward_inputs.items()},
             "actions": out.actions[None], "logprobs": out.logprobs[None], "rewards": rewards,
             "terminations": torch.zeros(1, n, dtype=torch.bool),
             "truncations": torch.ones(1, n, dtype=torch.bool),
             "valid": torch.ones(1, n, dtype=torch.bool), "success": rewards.bool(),
             "group_ids": torch.zeros(n, dtype=torch.long)}
    opt = torch.optim.SGD(p.parameters(), lr=lr)
    p.train()
    metrics = update_policy(p, opt, batch, cfg, iteration=0)
    with torch.no_grad():
        after = p.evaluate(out.forward_inputs).logprobs
    per_sample = (after - out.logprobs).reshape(n, -1).sum(1)
    return per_sample[rewards[0] > 0], per_sample[rewards[0] == 0], metrics
