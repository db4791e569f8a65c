"""One RL policy update: the registered advantage estimator, then minibatch epochs of the
registered loss with micro-batch gradient accumulation.

Shared by the actor worker (FSDP2-sharded policy) and the single-process baseline of
``benchmarks/bench_train.py`` (unsharded), so both run the same math. Nothing here branches on an
algorithm name: estimators and losses are looked up in the registry and called with the typed
batches of :mod:`rlinf_embodied.algorithms.batch`.
"""

from __future__ import annotations

import math
from typing import Callable, Dict

import torch

from rlinf_embodied.algorithms.batch import Advantages, LossBatch, RolloutBatch
from rlinf_embodied.algorithms.registry import get_advantage, get_loss

__all__ = ["actor_critic_parameters", "cap_log_std", "compute_advantages", "log_std_ceiling",
           "logprob_mismatch", "lr_lambda", "make_optimizer", "param_groups", "update_policy"]


def actor_critic_parameters(policy) -> tuple[list, list]:
    """``(actor, critic)``: ``policy``'s trainable parameters split by
    :meth:`~rlinf_embodied.policies.base.Policy.critic_parameters` (the critic's), in
    ``parameters()`` order.

    An FSDP2-sharded policy is resharded first, so that the registered parameters are the
    sharded ones the optimizer holds (a root module keeps its unsharded parameters registered
    after a forward without backward).
    """
    from torch.distributed.fsdp import FSDPModule

    if isinstance(policy, FSDPModule):
        policy.reshard()
    critic = {id(p) for p in policy.critic_parameters()}
    trainable = [p for p in policy.parameters() if p.requires_grad]
    return ([p for p in trainable if id(p) not in critic],
            [p for p in trainable if id(p) in critic])


def param_groups(policy, trainer) -> list[dict]:
    """Optimizer parameter groups of ``policy``'s trainable parameters: one at ``trainer.lr``,
    or, with ``trainer.critic_lr`` set, the actor's at ``trainer.lr`` then the critic's
    (:func:`actor_critic_parameters`) at ``trainer.critic_lr``.

    Raises:
        ValueError: ``trainer.critic_lr`` is set but the policy has no critic parameters.
    """
    if trainer.critic_lr is None:
        return [{"params": [p for p in policy.parameters() if p.requires_grad], "lr": trainer.lr}]
    actor, critic = actor_critic_parameters(policy)
    if not critic:
        raise ValueError(
            f"trainer.critic_lr is set but {type(policy).__name__} has no critic parameters "
            "(critic_parameters() is empty); set policy.critic=true or trainer.critic_lr=null."
        )
    return [{"params": actor, "lr": trainer.lr}, {"params": critic, "lr": trainer.critic_lr}]


def make_optimizer(policy, trainer):
    """The RL optimizer of ``policy`` and its LR schedule, as every training loop builds them:
    Adam (eps 1e-5, CleanRL / ManiSkill PPO) over :func:`param_groups`, and a ``LambdaLR`` of
    :func:`lr_lambda` stepped once per iteration.

    Returns:
        ``(optimizer, scheduler)``.
    """
    optimizer = torch.optim.Adam(param_groups(policy, trainer), lr=trainer.lr, eps=1e-5)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lr_lambda(trainer.lr_schedule, trainer.iterations))
    return optimizer, scheduler


def lr_lambda(schedule: str, total_iterations: int) -> Callable[[int], float]:
    """LR multiplier per scheduler step (one step per iteration).

    Raises:
        ValueError: for an unknown schedule.
    """
    if schedule == "constant":
        return lambda it: 1.0
    if schedule == "linear":
        return lambda it: max(0.0, 1.0 - it / max(1, total_iterations))
    if schedule == "cosine":
        return lambda it: 0.5 * (1.0 + math.cos(math.pi * min(it, total_iterations) / max(1, total_iterations)))
    raise ValueError(f"Unknown trainer.lr_schedule {schedule!r}; use constant, linear or cosine.")


def compute_advantages(batch: dict, cfg) -> Advantages:
    """The registered estimator ``cfg.algorithm.advantage`` on a time-major trajectory dict
    (rewards (T, N), values (T + 1, N) with a critic, flags, group ids; see
    :class:`~rlinf_embodied.algorithms.batch.RolloutBatch`)."""
    import rlinf_embodied.algorithms  # noqa: F401  (registers the built-ins)

    return get_advantage(cfg.algorithm.advantage)(RolloutBatch.from_trajectories(batch),
                                                  cfg.algorithm)


def update_policy(policy, optimizer, batch: dict, cfg, iteration: int, rank: int = 0,
                  device: str = "cpu", mean_across_ranks=lambda x: x) -> Dict[str, float]:
    """One RL update of ``policy`` on a time-major batch (T, N): advantages, then
    ``trainer.update_epochs`` x ``trainer.num_minibatches`` optimizer steps, each accumulated
    over micro-batches of ``trainer.micro_batch_size`` samples, with gradient clipping and the
    optional ``algorithm.target_kl`` early stop (mean over ranks); then the policy's running
    observation statistics take in the batch (:meth:`Policy.update_obs_stats`). Minibatch order
    is seeded by (run seed, iteration, rank). While ``iteration <
    trainer.critic_warmup_iterations`` only the critic's parameters
    (:meth:`~rlinf_embodied.policies.base.Policy.critic_parameters`) require gradients (the
    others are set ``requires_grad=False`` for the update and restored after it) and get
    optimizer steps, and the observation statistics stay as they are: the policy acts
    bit-identically while the value head fits the RL returns. After any other update, with
    ``algorithm.log_std_anneal_to`` set, the log-std is capped by :func:`log_std_ceiling`.

    Args:
        policy: a :class:`~rlinf_embodied.policies.Policy` (sharded or not).
        optimizer: its optimizer.
        batch: the trajectory dict: ``forward_inputs``, ``actions``, ``logprobs`` (T, N, ...),
            ``rewards``/``valid``/flags (T, N), ``values`` (T + 1, N) with a critic.
        cfg: the job config (``trainer``, ``algorithm``, ``policy.logprob_granularity``,
            ``run.seed``).
        iteration: the training iteration (seeds the minibatch order).
        rank, device, mean_across_ranks: the actor rank, its torch device, and an all-reduce
            mean for the early-stop KL.

    Returns:
        Metrics averaged over the minibatches (``train/...``; ``train/critic_warmup`` is 1.0
        during the critic warm-up, else 0.0; ``train/log_std_ceiling`` when capped;
        ``train/rollout_logprob_diff_max``: the largest |rollout - recomputed| log-prob of the
        first minibatch, before any optimizer step, see :func:`logprob_mismatch`).

    Raises:
        ValueError: a critic warm-up iteration for a policy without critic parameters, or
            ``algorithm.log_std_anneal_to`` for a policy without a log-std.
    """
    import rlinf_embodied.algorithms  # noqa: F401  (registers the built-ins)

    t = cfg.trainer
    frozen = []
    warmup = iteration < t.critic_warmup_iterations
    if warmup:
        frozen, critic = actor_critic_parameters(policy)
        if not critic:
            raise ValueError(
                f"trainer.critic_warmup_iterations > 0 but {type(policy).__name__} has no "
                "critic parameters (critic_parameters() is empty); set policy.critic=true or "
                "the warm-up to 0."
            )
    # Frozen for this update only: backward computes no gradient for them, the optimizer
    # skips them (no grad: no step, no weight decay), and clipping sees the critic's alone.
    for p in frozen:
        p.requires_grad_(False)
    try:
        metrics = _update(policy, optimizer, batch, cfg, iteration, rank, device,
                          mean_across_ranks, warmup)
    finally:
        for p in frozen:
            p.requires_grad_(True)
    ceiling = log_std_ceiling(cfg, iteration)
    if ceiling is not None and not warmup:
        cap_log_std(policy, ceiling)
        metrics["train/log_std_ceiling"] = ceiling
    return metrics


def log_std_ceiling(cfg, iteration: int) -> float | None:
    """The log-std ceiling after the update of ``iteration`` (0-based) under
    ``algorithm.log_std_anneal_to``: linear from ``policy.init_log_std`` to it over
    ``trainer.iterations``, then constant; None when the option is off."""
    to = cfg.algorithm.log_std_anneal_to
    if to is None:
        return None
    start = float(cfg.policy.init_log_std)
    frac = min(1.0, (iteration + 1) / max(1, cfg.trainer.iterations))
    return start + (float(to) - start) * frac


@torch.no_grad()
def cap_log_std(policy, ceiling: float) -> None:
    """Set every log-std of ``policy`` (:meth:`Policy.log_std_parameters`) above ``ceiling``
    to it, in place (on FSDP2 shards each rank caps its own shard: elementwise, so the
    result equals capping the full tensor).

    Raises:
        ValueError: ``policy`` exposes no log-std (a categorical or token head).
    """
    from torch.distributed.fsdp import FSDPModule

    if isinstance(policy, FSDPModule):
        policy.reshard()  # the registered parameters are then the sharded ones
    params = policy.log_std_parameters()
    if not params:
        raise ValueError(
            f"algorithm.log_std_anneal_to caps a Gaussian head's log-std, and "
            f"{type(policy).__name__} has none (discrete or token actions); set it to null."
        )
    for p in params:
        p.clamp_(max=ceiling)


def logprob_mismatch(recomputed: torch.Tensor, rollout: torch.Tensor, valid: torch.Tensor) -> float:
    """Largest ``|recomputed - rollout|`` log-prob over the valid samples (0.0 when none).

    Before the first optimizer step of an update the two must agree (same weights, same
    inputs): a policy left in another mode on one side (dropout), log-probs over another unit
    or another temperature show up here first (RL4VLA issue 12).

    Args:
        recomputed: log-probs from ``Policy.evaluate`` (B, ...) at the policy's granularity.
        rollout: the rollout's log-probs, same shape.
        valid: (B,) bool.
    """
    d = (recomputed.detach().float() - rollout.float()).abs().reshape(recomputed.shape[0], -1)
    d = d[valid.bool()]
    return float(d.max()) if d.numel() else 0.0


def _update(policy, optimizer, batch, cfg, iteration, rank, device, mean_across_ranks,
            warmup) -> Dict[str, float]:
    t = cfg.trainer
    adv = compute_advantages(batch, cfg)
    T, N = batch["rewards"].shape
    flat = lambda x: x.reshape(T * N, *x.shape[2:]).to(device)  # noqa: E731
    data = {
        "fi": {k: flat(v) for k, v in batch["forward_inputs"].items()},
        "actions": flat(batch["actions"]),
        "old_logprobs": flat(batch["logprobs"]),
        "adv": flat(adv.advantages),
        "ret": flat(adv.returns),
        "valid": flat(adv.valid),
    }
    if "values" in batch:
        data["old_values"] = flat(batch["values"][:-1])
    B = T * N
    n_mb = max(1, min(t.num_minibatches, B))
    mb_size = B // n_mb
    micro = t.micro_batch_size or mb_size
    loss_fn = get_loss(cfg.algorithm.loss)
    gen = torch.Generator().manual_seed(cfg.run.seed * 100_003 + iteration * 101 + rank)
    sums: Dict[str, float] = {}
    count = 0
    stop = False
    first_diff = None  # max |rollout - recomputed log-prob| of the first minibatch
    for epoch in range(t.update_epochs):
        perm = torch.randperm(B, generator=gen)
        for m in range(n_mb):
            idx = perm[m * mb_size:(m + 1) * mb_size]
            n_valid = max(1, int(data["valid"][idx].sum()))
            optimizer.zero_grad(set_to_none=True)
            mb_metrics: Dict[str, float] = {}
            if adv.minibatch_normalize:
                sel = data["adv"][idx][data["valid"][idx]]
                mean, std = (sel.mean(), sel.std()) if sel.numel() > 1 else (0.0, None)
            for s in range(0, len(idx), micro):
                sub = idx[s:s + micro]
                mask = data["valid"][sub]
                adv_mb = data["adv"][sub]
                if adv.minibatch_normalize and std is not None:
                    adv_mb = (adv_mb - mean) / (std + 1e-8)
                ev = policy.evaluate({k: v[sub] for k, v in data["fi"].items()}, data["actions"][sub])
                if epoch == 0 and m == 0:  # weights still those of the rollout
                    first_diff = max(first_diff or 0.0, logprob_mismatch(
                        ev.logprobs, data["old_logprobs"][sub], mask))
                with_values = ev.values is not None
                loss, met = loss_fn(LossBatch(
                    logprobs=ev.logprobs, old_logprobs=data["old_logprobs"][sub],
                    advantages=adv_mb, mask=mask, granularity=cfg.policy.logprob_granularity,
                    entropy=ev.entropy, values=ev.values,
                    returns=data["ret"][sub] if with_values else None,
                    old_values=data["old_values"][sub] if with_values and "old_values" in data else None,
                ), cfg.algorithm)
                share = int(mask.sum()) / n_valid
                (loss * share).backward()
                for k, v in met.items():
                    mb_metrics[k] = mb_metrics.get(k, 0.0) + float(v) * share
            grad_norm = torch.nn.utils.clip_grad_norm_(
                [p for p in policy.parameters() if p.requires_grad], t.max_grad_norm
            )
            if hasattr(grad_norm, "full_tensor"):
                grad_norm = grad_norm.full_tensor()
            optimizer.step()
            mb_metrics["grad_norm"] = float(grad_norm)
            for k, v in mb_metrics.items():
                sums[k] = sums.get(k, 0.0) + v
            count += 1
            if cfg.algorithm.target_kl is not None and mean_across_ranks(
                    mb_metrics.get("approx_kl", 0.0)) > cfg.algorithm.target_kl:
                stop = True
                break
        if stop:
            break
    # Running observation statistics move only between updates, so this update's ratios
    # started at exactly 1 and the next rollout normalises with the refreshed numbers.
    if not warmup:
        policy.update_obs_stats(data["fi"], data["valid"])
    out = {f"train/{k}": v / max(1, count) for k, v in sums.items()}
    out["train/minibatches"] = float(count)
    if first_diff is not None:
        out["train/rollout_logprob_diff_max"] = first_diff
    out["train/critic_warmup"] = float(warmup)
    out["train/valid_fraction"] = float(adv.valid.float().mean())
    signal = adv.advantages[adv.valid]
    # 0 when every GRPO group's rewards are equal (e.g. all 0 early on): no policy gradient
    out["train/nonzero_advantage_fraction"] = float((signal != 0).float().mean()) if signal.numel() else 0.0
    return out
