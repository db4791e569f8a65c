"""Supervised fine-tuning of a VLA policy (OpenVLA, OpenVLA-OFT, π0, π0.5) on RGB demonstrations.

The loss is each published model's own training objective on the demonstrated action chunks
(``policy.sft_loss`` of ``policy.demo_forward_inputs``): next-token cross-entropy of the
action tokens at temperature 1 (OpenVLA; OFT's discrete head), the L1 distance of the
normalised chunk (OFT's continuous head), or the flow-matching velocity error (π0 / π0.5,
:meth:`~rlinf_embodied.policies.pi0.FlowVLAPolicy.sft_loss`). Actions are normalised with the
demonstrations' own statistics (q01/q99; π0: mean/std), installed in the policy first
(``policy.set_dataset_statistics``) and saved with the checkpoint as the published models carry
them, so SFT, RL and evaluation un-normalise alike.

With ``bc.value_gamma`` and a value head (PPO), the value head alone (on the detached hidden
state) is fitted to the demonstrations' discounted returns in the same passes, so PPO does not
start from a random critic and the action objective is not disturbed. ``bc.image_shift`` adds random-shift augmentation (pad by edge pixels, crop back).
"""

from __future__ import annotations

import math
import time
from typing import Any

import torch

from rlinf_embodied.sft.config import BCConfig

__all__ = ["shift_images", "train_vla_bc"]


def shift_images(images: torch.Tensor, pad: int, gen: torch.Generator) -> torch.Tensor:
    """(B, H, W, 3) uint8 images, each shifted by up to ``pad`` pixels in x and y (edge
    padding, then a random H x W crop; DrQ's augmentation). ``pad`` 0 returns them unchanged."""
    if pad <= 0:
        return images
    b, h, w, _ = images.shape
    x = images.permute(0, 3, 1, 2).float()
    x = torch.nn.functional.pad(x, (pad, pad, pad, pad), mode="replicate")
    dx = torch.randint(0, 2 * pad + 1, (b,), generator=gen)
    dy = torch.randint(0, 2 * pad + 1, (b,), generator=gen)
    rows = (dy[:, None] + torch.arange(h)[None, :])[:, None, :, None].expand(b, 3, h, w + 2 * pad)
    x = x.gather(2, rows)
    cols = (dx[:, None] + torch.arange(w)[None, :])[:, None, None, :].expand(b, 3, h, w)
    x = x.gather(3, cols)
    return x.permute(0, 2, 3, 1).to(torch.uint8)


def train_vla_bc(policy, data: Any, cfg: BCConfig, log=print) -> dict[str, float]:
    """Fine-tune ``policy`` on ``data`` in place.

    Args:
        policy: an OpenVLA / OpenVLA-OFT / π0 / π0.5 policy whose dataset statistics are the
            demos'.
        data: a :class:`~rlinf_embodied.sft.dataset.RGBDemoDataset`.
        cfg: ``steps``, ``batch_size``, ``lr``, ``weight_decay``, ``max_grad_norm``, ``seed``,
            ``value_gamma``, ``image_shift``.
        log: progress printer (every 10% of the steps).

    Returns:
        ``{"bc/loss": final-10% mean loss, "bc/token_accuracy" or "bc/l1" (none for π0),
        "bc/value_mse", "bc/seconds", "bc/transitions", "bc/steps"}``.

    Raises:
        ValueError: the demonstrations' action width differs from the policy's.
    """
    A, K = policy.spec.action_dim, policy.action_chunk
    if data.actions.shape[-1] != A:
        raise ValueError(f"The demonstrations have {data.actions.shape[-1]}-dim actions but the "
                         f"policy acts in {A} dims; record them in the policy's env.control_mode.")
    torch.manual_seed(cfg.seed)
    gen = torch.Generator().manual_seed(cfg.seed)
    fit_value = cfg.value_gamma is not None and policy.value_head is not None
    returns = data.returns(cfg.value_gamma) if fit_value else None
    params = [p for p in policy.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    warmup = max(1, cfg.steps // 20)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / warmup) * 0.5 * (
        1.0 + math.cos(math.pi * min(s, cfg.steps) / max(1, cfg.steps))))
    M = len(data)
    policy.train()
    t0 = time.perf_counter()
    tail: dict[str, list] = {}
    for step in range(cfg.steps):
        idx = torch.randint(0, M, (min(cfg.batch_size, M),), generator=gen)
        obs = data.obs(idx)
        obs["main_images"] = shift_images(obs["main_images"], cfg.image_shift, gen)
        fi = policy.demo_forward_inputs(obs, data.chunks(idx, K))
        out = policy.sft_loss(fi)
        loss, values = out.loss, out.values
        metrics = {"loss": float(loss.detach()), **(out.metrics or {})}
        if fit_value:
            vloss = 0.5 * ((values.float() - returns[idx].to(values.device)) ** 2).mean()
            loss = loss + vloss
            metrics["value_mse"] = float(2 * vloss.detach())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm)
        opt.step()
        sched.step()
        if step >= cfg.steps - max(1, cfg.steps // 10):
            for k, v in metrics.items():
                tail.setdefault(k, []).append(v)
        if (step + 1) % max(1, cfg.steps // 10) == 0:
            shown = ", ".join(f"{k} {v:.3f}" for k, v in metrics.items())
            log(f"  sft step {step + 1}/{cfg.steps}: {shown} ({time.perf_counter() - t0:.0f} s)")
    policy.eval()
    out = {f"bc/{k}": sum(v) / len(v) for k, v in tail.items()}
    out.update({"bc/seconds": time.perf_counter() - t0, "bc/transitions": float(M),
                "bc/steps": float(cfg.steps)})
    return out
