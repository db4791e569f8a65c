"""The ``act`` function an evaluation calls: a policy queried in eval mode, greedy or sampled.

:func:`policy_act` wraps a :class:`~rlinf_embodied.policies.base.Policy`-like object. By default
it is *batch-invariant*: the policy runs on each env's row alone (a batch of 1,
:func:`~rlinf_embodied.policies.base.act_rows`), so an episode's actions do not depend on
``num_envs``, on which envs share its batch or on the env placement; ``sample`` draws each row
under a seed of its own (:func:`episode_seed` of the protocol's ``global_seed``, the task, the
trial and the query index). With ``batch_invariant=False`` it runs one batched forward per
query (faster for large policies; a batch rounds differently from a row, so results then depend
on ``num_envs`` in the last bits, which contact dynamics can amplify). Actions come back as
chunks (N, K, A) (:func:`as_chunk`).
"""

from __future__ import annotations

import hashlib
from typing import Any, Callable, Dict, List, Mapping, Optional

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


def policy_act(policy: Any, mode: str = "greedy", seed: int = 0,
               batch_invariant: bool = True) -> Callable[..., Any]:
    """``obs -> actions`` of a Policy-like object, in eval mode and without gradient.

    Args:
        policy: an object with ``act(obs, mode)`` (a :class:`~rlinf_embodied.policies.base.Policy`).
        mode: ``greedy`` (the distribution's mode) or ``sample`` (draws from it).
        seed: the protocol's ``global_seed``, for ``sample`` (and ``greedy`` with a policy
            whose greedy mode draws noise, see below). Every sampling call runs inside
            :func:`torch.random.fork_rng` (CPU, plus the CUDA device the policy is on), so the
            draws do not depend on other users of torch's global generator.
        batch_invariant: run the policy row by row (batch of 1), so that an env's actions are
            the same whatever batch it is in; False runs one batched forward per query.

    Batch-invariant, the function takes ``act(obs, episodes=None)``: with ``episodes`` (one
    ``(task, trial, query)`` per env, None for an idle slot; what
    :func:`~rlinf_embodied.eval.episodes.run_pairs` passes) it queries the policy once per
    active env (idle slots get zero actions, which the loop ignores), a sampled row under its
    own seed from ``(seed, task, trial, query)`` (:func:`episode_seed`). Without ``episodes``
    every row runs, and sampled rows draw one after another from one stream seeded once by
    ``seed``, advancing over calls. With ``batch_invariant=False`` the function takes
    ``act(obs)``: one forward of the whole batch, sampled from that stream.

    A policy whose greedy mode draws noise (``policy.greedy_draws``: π0 with
    ``policy.greedy_noise: fresh``) has its greedy queries seeded exactly as sampled ones.

    Raises:
        ValueError: ``mode`` is not one of :data:`POLICY_MODES`.
    """
    import torch

    if mode not in POLICY_MODES:
        raise ValueError(f"policy_mode must be one of {', '.join(POLICY_MODES)} (got {mode!r}).")
    if hasattr(policy, "eval"):
        policy.eval()
    draws = mode != "greedy" or bool(getattr(policy, "greedy_draws", False))
    device = torch.device(getattr(policy, "device", "cpu"))
    cuda = [device.index or 0] if device.type == "cuda" else []
    state: Dict[str, Any] = {}

    def stream(run: Callable[[], Any]) -> Any:
        """``run()`` on the evaluation's own sampling stream (seeded once, then continued)."""
        with torch.random.fork_rng(devices=cuda, device_type="cuda"):
            if not state:
                torch.manual_seed(seed)
            else:
                torch.set_rng_state(state["cpu"])
                if cuda:
                    torch.cuda.set_rng_state(state["cuda"], cuda[0])
            out = run()
            state["cpu"] = torch.get_rng_state()
            if cuda:
                state["cuda"] = torch.cuda.get_rng_state(cuda[0])
        return out

    if not batch_invariant:
        def batched(obs: Mapping[str, Any]) -> Any:
            with torch.no_grad():
                if not draws:
                    out = policy.act(obs, mode="greedy")
                else:
                    out = stream(lambda: policy.act(obs, mode=mode))
            return as_chunk(getattr(out, "actions", out))

        return batched

    from rlinf_embodied.policies.base import act_rows, obs_rows

    def rows(obs: Mapping[str, Any], episodes: Optional[List[Optional[tuple]]] = None) -> Any:
        with torch.no_grad():
            if episodes is None:
                if not draws:
                    out = act_rows(policy, obs, "greedy")
                else:
                    out = stream(lambda: act_rows(policy, obs, mode))
                return as_chunk(getattr(out, "actions", out))
            active = [i for i, key in enumerate(episodes) if key is not None]
            if not active:  # every slot idle: the loop ignores the actions
                active = [0]
            part = obs_rows(obs, active)
            if not draws:
                out = act_rows(policy, part, "greedy")
            else:
                seeds = [episode_seed(seed, *episodes[i]) for i in active]
                with torch.random.fork_rng(devices=cuda, device_type="cuda"):
                    out = act_rows(policy, part, mode, seeds)
            actions = as_chunk(getattr(out, "actions", out))
            if len(active) == len(episodes):
                return actions
            return _scatter(actions, active, len(episodes))

    rows.per_episode = True  # run_pairs passes each env's (task, trial, query)
    return rows


def episode_seed(seed: int, task: Any, trial: int, query: int) -> int:
    """Seed of the ``query``-th policy query of trial ``trial`` of ``task`` in a sampled
    evaluation with ``global_seed`` ``seed``: the first 8 bytes of a sha256 over the four
    (stable across processes and Python versions, unlike ``hash``), as a non-negative int63."""
    text = f"{int(seed)}|{task!r}|{int(trial)}|{int(query)}".encode()
    return int.from_bytes(hashlib.sha256(text).digest()[:8], "little") >> 1


def _scatter(actions: Any, rows: List[int], n: int) -> Any:
    """(len(rows), K, A) actions placed at ``rows`` of an (n, K, A) batch of zeros."""
    import numpy as np

    if isinstance(actions, np.ndarray):
        out = np.zeros((n, *actions.shape[1:]), actions.dtype)
    else:
        out = actions.new_zeros((n, *actions.shape[1:]))
    out[rows] = actions
    return out
