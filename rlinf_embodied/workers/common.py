"""Helpers that several worker roles share (embodied and reasoning, rollout and training).

Public here so that no role imports another role's private helpers: trajectory concatenation
along the env axis, per-query sampling seeds, peak accelerator memory for profiling, moving an
optimizer's state between devices, and synthetic observations for profiling policies.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional

import torch

__all__ = ["cat_env_axis", "move_optimizer", "peak_bytes", "request_seed", "synthetic_obs"]


def cat_env_axis(parts: List[dict]) -> dict:
    """Concatenate trajectory dicts along the env axis (axis 1; ``group_ids`` axis 0)."""
    out = {}
    for k, v in parts[0].items():
        if isinstance(v, dict):
            out[k] = {kk: torch.cat([p[k][kk] for p in parts], 1) for kk in v}
        else:
            out[k] = torch.cat([p[k] for p in parts], 0 if k == "group_ids" else 1)
    return out


def request_seed(run_seed: int, iteration: int, stream: int, step: int, phase: int = 0) -> int:
    """Sampling seed of one policy query: a pure function of where it sits in the run."""
    return (((run_seed * 1_000_003 + phase) * 100_003 + iteration) * 1009 + stream) * 10_007 + step


def peak_bytes() -> float:
    """Peak accelerator memory of this process so far (0 without one)."""
    return float(torch.cuda.max_memory_allocated()) if torch.cuda.is_available() else 0.0


def synthetic_obs(spec: dict, batch: int, task: str = "do the task") -> dict:
    """An observation batch of the env's shapes (zeros), for profiling policies."""
    obs: Dict[str, Any] = {"task_descriptions": [task] * batch}
    if spec.get("state_dim"):
        obs["states"] = torch.zeros(batch, spec["state_dim"])
    for key, shape_key in (("main_images", "image_shape"), ("wrist_images", "wrist_image_shape")):
        if spec.get(shape_key):
            obs[key] = torch.zeros(batch, *spec[shape_key], dtype=torch.uint8)
    return obs


def move_optimizer(opt: Optional[torch.optim.Optimizer], device: str) -> None:
    """Move ``opt``'s state tensors (e.g. Adam moments) to ``device`` (no-op for None)."""
    if opt is None:
        return
    for state in opt.state.values():
        for k, v in state.items():
            if isinstance(v, torch.Tensor):
                state[k] = v.to(device, non_blocking=True)
