"""Behaviour cloning through the policy contract.

The loss is the policy's own supervised objective, :meth:`Policy.sft_loss`: by default the
negative log-likelihood of the demonstrated actions, ``-mean log pi(a_demo | o)`` from
:meth:`Policy.evaluate` (the method PPO uses for its ratios), so the Gaussian MLP/CNN heads fit
their mean and log-std and token-based VLAs get the cross-entropy of the action tokens; flow
policies (π0, π0.5) use the flow-matching loss. Nothing here branches on the policy family.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from rlinf_embodied.sft.config import BCConfig
from rlinf_embodied.sft.dataset import DemoDataset

__all__ = ["fit_log_std", "space_spec_of", "train_bc"]


def space_spec_of(env_cfg: Any):
    """The :class:`~rlinf_embodied.policies.base.SpaceSpec` of ``env_cfg`` (builds one env).

    Args:
        env_cfg: an EnvConfig (its ``num_envs`` is ignored).
    """
    import dataclasses

    from rlinf_embodied.envs import make_env
    from rlinf_embodied.policies.base import SpaceSpec

    env = make_env(dataclasses.replace(env_cfg, num_envs=1, num_processes=0, video=False))
    try:
        obs, _ = env.reset(seed=0)
        return SpaceSpec.from_env(env, obs)
    finally:
        env.close()


def fit_log_std(policy, data: DemoDataset, cfg: BCConfig) -> torch.Tensor | None:
    """Set a Gaussian head's log-std from the demos, in place, after its mean is fitted.

    With ``cfg.fit_log_std`` the log-std becomes the maximum-likelihood value of a
    state-independent Gaussian around the greedy actions: the log RMS residual per action dim,
    in the head's normalised units (its gradient steps move it by about ``lr`` per step, far
    too slowly to get there). Then ``cfg.min_log_std`` / ``cfg.max_log_std`` bound it.

    Args:
        policy: the behaviour-cloned policy.
        data: the demonstrations (states (M, S), actions (M, K, A) in env units).
        cfg: ``fit_log_std``, ``min_log_std``, ``max_log_std``.

    Returns:
        The head's log-std (K * A,) after the fit, or None for a head without one.
    """
    head = getattr(policy, "action_head", None)
    log_std = getattr(head, "log_std", None)
    if log_std is None:
        return None
    with torch.no_grad():
        if cfg.fit_log_std:
            greedy = policy.act({"states": data.states}, mode="greedy").actions
            res = head.samples_from_actions(data.actions) - head.samples_from_actions(greedy)
            rms = (res.float() ** 2).mean(0).sqrt().reshape(log_std.shape)
            log_std.copy_(rms.clamp(min=1e-6).log())
        if cfg.min_log_std is not None:
            log_std.clamp_(min=cfg.min_log_std)
        if cfg.max_log_std is not None:
            log_std.clamp_(max=cfg.max_log_std)
    return log_std.detach()


def train_bc(policy, data: DemoDataset, cfg: BCConfig, log=print) -> dict[str, float]:
    """Fit ``policy`` to the demonstrations in place.

    Args:
        policy: a :class:`~rlinf_embodied.policies.base.Policy` whose ``inputs_from_obs``
            reads ``states`` (the ``mlp`` policy).
        data: the demonstrations; ``data.actions`` (M, 1, A) must fit the policy's action
            space (same controller).
        cfg: optimisation settings.
        log: progress printer (called every 10% of the steps).

    Returns:
        ``{"bc/nll": the SFT loss of all demos at the end (NLL per action dim with the final
        log-std; the flow-matching loss for flow policies), "bc/mse": mean squared error of the greedy
        action in env units, "bc/value_mse": critic error on the demo returns (NaN when
        not fitted), "bc/log_std": mean log-std after the floor, "bc/seconds": wall,
        "bc/transitions": M}``.

    Raises:
        ValueError: the dataset's action width differs from the policy's.
    """
    A = policy.spec.action_dim
    if data.actions.shape[-1] != A:
        raise ValueError(
            f"The demonstrations have {data.actions.shape[-1]}-dim actions but the policy acts "
            f"in {A} dims; record the demos in the policy's env.control_mode."
        )
    torch.manual_seed(cfg.seed)
    critic = {id(p) for p in policy.critic_parameters()}
    fit_value = cfg.value_gamma is not None and bool(critic)
    returns = data.returns(cfg.value_gamma) if fit_value else None
    params = [p for p in policy.parameters() if fit_value or id(p) not in critic]
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=max(1, cfg.steps))
    gen = torch.Generator().manual_seed(cfg.seed)
    M = len(data)
    policy.train()
    t0 = time.perf_counter()
    nll = torch.tensor(0.0)
    for step in range(cfg.steps):
        idx = torch.randint(0, M, (min(cfg.batch_size, M),), generator=gen)
        inputs = policy.inputs_from_obs({"states": data.states[idx]})
        out = policy.sft_loss(inputs, data.actions[idx])
        nll = loss = out.loss
        if fit_value:
            vloss = 0.5 * ((out.values - returns[idx]) ** 2).mean()
            loss = loss + vloss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm)
        opt.step()
        sched.step()
        if (step + 1) % max(1, cfg.steps // 10) == 0:
            extra = f", value loss {float(vloss.detach()):.3f}" if fit_value else ""
            log(f"  bc step {step + 1}/{cfg.steps}: nll per action dim {float(nll.detach()):.3f}{extra}")
    policy.eval()
    with torch.no_grad():
        out = policy.act({"states": data.states}, mode="greedy")
        mse = float(((out.actions.float() - data.actions) ** 2).mean())
        value_mse = float(((out.values - returns) ** 2).mean()) if fit_value else float("nan")
    log_std = fit_log_std(policy, data, cfg)
    with torch.no_grad():
        nll = policy.sft_loss(policy.inputs_from_obs({"states": data.states}), data.actions).loss
    return {
        "bc/value_mse": value_mse,
        "bc/nll": float(nll),
        "bc/mse": mse,
        "bc/log_std": float(log_std.mean()) if log_std is not None else float("nan"),
        "bc/log_std_min": float(log_std.min()) if log_std is not None else float("nan"),
        "bc/log_std_max": float(log_std.max()) if log_std is not None else float("nan"),
        "bc/seconds": time.perf_counter() - t0,
        "bc/transitions": float(M),
    }
