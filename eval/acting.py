"""The ``act`` function an evaluation calls: a policy queried in eval mode, greedy or sampled.

:func:`policy_act` wraps a :class:`~rlinf_embodied.policies.base.Policy`-like object: ``greedy``
takes the distribution's mode in one batched pass; ``sample`` draws each env's actions under a
seed of its own (:func:`episode_seed` of the protocol's ``global_seed``, the task, the trial
and the query index), so a sampled episode is the same for any ``num_envs``. Actions come back
as chunks (N, K, A) (:func:`as_chunk`).
"""

from __future__ import annotations

import hashlib
from typing import Any, Callable, Dict, List, Mapping, Optional

import numpy as np
from rlinf_embodied.eval.protocols import POLICY_MODES

__all__ = ["policy_act", "episode_seed", "as_chunk"]


def as_chunk(actions: Any) -> Any:
    """(N, A) -> (N, 1, A); (N, K, A) unchanged (numpy or torch)."""
    if getattr(actions, "ndim", None) == 2:
        return actions[:, None]
    if getattr(actions, "ndim", None) != 3:
        raise ValueError(
            f"A policy must return actions of shape (N, A) or (N, K, A); got shape "
            f"{getattr(actions, 'shape', type(actions))}."
        )
    return actions


def policy_act(policy: Any, mode: str = "greedy", seed: int = 0) -> Callable[[Mapping[str, Any]], Any]:
    """``obs -> actions`` of a Policy-like object, in eval mode and without gradient.

    Args:
        policy: an object with ``act(obs, mode)`` (a :class:`~rlinf_embodied.policies.base.Policy`).
        mode: ``greedy`` (the distribution's mode) or ``sample`` (draws from it).
        seed: ``sample`` only: the protocol's ``global_seed``. Every call runs inside
            :func:`torch.random.fork_rng` (CPU, plus the CUDA device the policy is on), so the
            draws do not depend on other users of torch's global generator.

    The ``sample`` function takes ``act(obs, episodes=None)``: with ``episodes`` (one
    ``(task, trial, query)`` per env, None for an idle slot; what :func:`~rlinf_embodied.eval.episodes.run_pairs`
    passes) it queries the policy once per env, each under its own seed derived from
    ``(seed, task, trial, query)`` (:func:`episode_seed`), so an episode's actions do not depend
    on ``num_envs`` or on which envs share its batch; this costs N batch-1 forward passes per
    query (greedy evaluation keeps one batched pass). Without ``episodes`` it draws the batch
    from one stream seeded once by ``seed``, advancing over calls.

    Raises:
        ValueError: ``mode`` is not one of :data:`POLICY_MODES`.
    """
    import torch

    if mode not in POLICY_MODES:
        raise ValueError(f"policy_mode must be one of {', '.join(POLICY_MODES)} (got {mode!r}).")
    if hasattr(policy, "eval"):
        policy.eval()
    if mode == "greedy":
        def act(obs: Mapping[str, Any]) -> Any:
            with torch.no_grad():
                out = policy.act(obs, mode="greedy")
            return as_chunk(getattr(out, "actions", out))

        return act

    device = torch.device(getattr(policy, "device", "cpu"))
    cuda = [device.index or 0] if device.type == "cuda" else []
    state: Dict[str, Any] = {}

    def draw(obs: Mapping[str, Any]) -> Any:
        out = policy.act(obs, mode="sample")
        return as_chunk(getattr(out, "actions", out))

    def sample(obs: Mapping[str, Any], episodes: Optional[List[Optional[tuple]]] = None) -> Any:
        with torch.random.fork_rng(devices=cuda, device_type="cuda"), torch.no_grad():
            if episodes is not None:
                rows, idle = [], []
                for i, key in enumerate(episodes):
                    if key is None:
                        idle.append(i)
                        rows.append(None)
                        continue
                    torch.manual_seed(episode_seed(seed, *key))  # seeds CUDA too
                    rows.append(draw({k: _row(v, i) for k, v in obs.items()}))
                like = next((r for r in rows if r is not None), None)
                if like is None:
                    return draw(obs)  # every slot idle: the actions are ignored
                zero = like * 0  # idle slots: actions the loop ignores
                rows = [zero if r is None else r for r in rows]
                cat = np.concatenate if isinstance(like, np.ndarray) else torch.cat
                return cat(rows, 0)
            if not state:
                torch.manual_seed(seed)
            else:
                torch.set_rng_state(state["cpu"])
                if cuda:
                    torch.cuda.set_rng_state(state["cuda"], cuda[0])
            out = draw(obs)
            state["cpu"] = torch.get_rng_state()
            if cuda:
                state["cuda"] = torch.cuda.get_rng_state(cuda[0])
        return out

    sample.per_episode = True  # run_pairs passes each env's (task, trial, query)
    return sample


def episode_seed(seed: int, task: Any, trial: int, query: int) -> int:
    """Seed of the ``query``-th policy query of trial ``trial`` of ``task`` in a sampled
    evaluation with ``global_seed`` ``seed``: the first 8 bytes of a sha256 over the four
    (stable across processes and Python versions, unlike ``hash``), as a non-negative int63."""
    text = f"{int(seed)}|{task!r}|{int(trial)}|{int(query)}".encode()
    return int.from_bytes(hashlib.sha256(text).digest()[:8], "little") >> 1


def _row(value: Any, i: int) -> Any:
    """Row ``i`` of one observation entry, keeping its batch dimension (tensor, array, list)."""
    if hasattr(value, "shape") or isinstance(value, (list, tuple)):
        return value[i:i + 1]
    return value
