"""The policy contract shared by small actor-critics and VLAs (DESIGN.md "The two contracts").

A :class:`Policy` is an ``nn.Module`` built from a policy config and a :class:`SpaceSpec`
(what the env observes and accepts). Rollout calls :meth:`Policy.act` on a batch of env
observations; training calls :meth:`Policy.evaluate` on the ``forward_inputs`` that ``act``
returned and must get the rollout's log-probs back when the weights are unchanged.

Observation dict (envs/base.py): ``states`` (N, S) float32, ``main_images`` (N, H, W, 3)
uint8, optional ``wrist_images`` (N, H', W', 3) uint8, ``task_descriptions`` list[str] of
length N. Absent keys are absent.

Log-prob granularity (``policy.logprob_granularity``; :mod:`rlinf_embodied.algorithms.utils`):
``token`` (N, K, A) one entry per action dimension (a VLA action token, a Gaussian dim),
``action`` (N, K), ``chunk`` (N,). Entropies come at the same granularity.
"""

from __future__ import annotations

import abc
import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import torch
from torch import nn

from rlinf_embodied.algorithms.utils import sum_to_level
from rlinf_embodied.config import PolicyConfig

__all__ = [
    "GREEDY",
    "SAMPLE",
    "ActionOutput",
    "Evaluation",
    "Policy",
    "SFTLoss",
    "SpaceSpec",
    "act_rows",
    "cat_rows",
    "check_mode",
    "obs_rows",
    "obs_tensor",
]

SAMPLE = "sample"
"""``act`` mode: draw actions from the policy's distribution (training rollouts)."""
GREEDY = "greedy"
"""``act`` mode: the distribution's mode (evaluation)."""


def _opt_floats(x: Sequence[float] | None) -> tuple[float, ...] | None:
    return None if x is None else tuple(float(v) for v in x)


def _opt_ints(x: Sequence[int] | None) -> tuple[int, ...] | None:
    return None if x is None else tuple(int(v) for v in x)


@dataclass
class SpaceSpec:
    """What a policy needs to know about an env to be built: action and observation spaces.

    Exactly one action space: a Box (``action_low``/``action_high``, each (A,) floats in env
    units, +-inf allowed for unbounded dims) or a Discrete (``action_n`` choices, A = 1).

    Attributes:
        action_low: (A,) lower bounds of a Box action space.
        action_high: (A,) upper bounds of a Box action space.
        action_n: number of choices of a Discrete action space.
        state_dim: S, width of ``states``; 0 when the env has no state observation.
        image_shape: (H, W, 3) of ``main_images``; None when absent.
        wrist_image_shape: (H', W', 3) of ``wrist_images``; None when absent.
    """

    action_low: tuple[float, ...] | None = None
    action_high: tuple[float, ...] | None = None
    action_n: int | None = None
    state_dim: int = 0
    image_shape: tuple[int, ...] | None = None
    wrist_image_shape: tuple[int, ...] | None = None

    def __post_init__(self):
        self.action_low = _opt_floats(self.action_low)
        self.action_high = _opt_floats(self.action_high)
        self.image_shape = _opt_ints(self.image_shape)
        self.wrist_image_shape = _opt_ints(self.wrist_image_shape)
        box = self.action_low is not None or self.action_high is not None
        if box == (self.action_n is not None):
            raise ValueError(
                "SpaceSpec needs exactly one action space: action_low and action_high for a "
                "Box, or action_n for a Discrete."
            )
        if box:
            if self.action_low is None or self.action_high is None:
                raise ValueError("SpaceSpec: give both action_low and action_high for a Box.")
            if len(self.action_low) != len(self.action_high) or not self.action_low:
                raise ValueError(
                    f"SpaceSpec: action_low {self.action_low} and action_high "
                    f"{self.action_high} must be non-empty and of equal length A."
                )
            if any(lo > hi for lo, hi in zip(self.action_low, self.action_high)):
                raise ValueError(
                    f"SpaceSpec: action_low {self.action_low} exceeds action_high "
                    f"{self.action_high} somewhere; swap them."
                )
        elif self.action_n < 2:
            raise ValueError(f"SpaceSpec: action_n must be >= 2 (got {self.action_n}).")
        for name in ("image_shape", "wrist_image_shape"):
            shape = getattr(self, name)
            if shape is not None and (len(shape) != 3 or shape[2] != 3):
                raise ValueError(f"SpaceSpec: {name} must be (H, W, 3); got {shape}.")

    @property
    def discrete(self) -> bool:
        """True for a Discrete action space."""
        return self.action_n is not None

    @property
    def action_dim(self) -> int:
        """A: Box dimension, or 1 for a Discrete space."""
        return 1 if self.discrete else len(self.action_low)

    @classmethod
    def from_spaces(
        cls,
        action_space: Any,
        state_dim: int = 0,
        image_shape: Sequence[int] | None = None,
        wrist_image_shape: Sequence[int] | None = None,
    ) -> SpaceSpec:
        """Spec from a gymnasium ``Box`` (flattened to (A,)) or ``Discrete`` action space of
        one env (not the batched space).

        Raises:
            ValueError: for another action space (MultiDiscrete, Dict, a Discrete with
                ``start != 0``, ...).
        """
        from gymnasium import spaces  # lazy: only the env-facing constructor needs it

        if isinstance(action_space, spaces.Discrete) and int(action_space.start) == 0:
            return cls(
                action_n=int(action_space.n),
                state_dim=state_dim,
                image_shape=image_shape,
                wrist_image_shape=wrist_image_shape,
            )
        if isinstance(action_space, spaces.Box):
            low = torch.as_tensor(action_space.low, dtype=torch.float64).reshape(-1)
            high = torch.as_tensor(action_space.high, dtype=torch.float64).reshape(-1)
            return cls(
                action_low=low.tolist(),
                action_high=high.tolist(),
                state_dim=state_dim,
                image_shape=image_shape,
                wrist_image_shape=wrist_image_shape,
            )
        raise ValueError(
            f"Unsupported action space {action_space!r}; policies take a Box or a Discrete "
            "starting at 0 (wrap the env to map other spaces onto one)."
        )

    @classmethod
    def from_obs(cls, obs: Mapping[str, Any], action_space: Any) -> SpaceSpec:
        """Spec from one batched observation dict of the env contract and its action space."""
        states = obs.get("states")
        main = obs.get("main_images")
        wrist = obs.get("wrist_images")
        return cls.from_spaces(
            action_space,
            state_dim=int(states.shape[-1]) if states is not None else 0,
            image_shape=tuple(main.shape[1:]) if main is not None else None,
            wrist_image_shape=tuple(wrist.shape[1:]) if wrist is not None else None,
        )

    def to_dict(self) -> dict[str, Any]:
        """Plain-data view (lists, not tuples) for YAML; infinities stay floats."""
        return {
            k: (list(v) if isinstance(v, tuple) else v) for k, v in dataclasses.asdict(self).items()
        }

    @classmethod
    def from_env(cls, env: Any, obs: Mapping[str, Any]) -> SpaceSpec:
        """The spec of a BatchedEnv from its action spec and one observation batch ``obs``
        (``states`` (N, S), ``main_images`` / ``wrist_images`` (N, H, W, 3); absent keys give
        0 / None)."""
        a = env.action_spec
        return cls(
            action_low=None if a.discrete else a.low.tolist(),
            action_high=None if a.discrete else a.high.tolist(),
            action_n=a.n if a.discrete else None,
            state_dim=int(obs["states"].shape[-1]) if "states" in obs else 0,
            image_shape=tuple(obs["main_images"].shape[1:]) if "main_images" in obs else None,
            wrist_image_shape=tuple(obs["wrist_images"].shape[1:]) if "wrist_images" in obs else None,
        )

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> SpaceSpec:
        """Inverse of :meth:`to_dict`.

        Raises:
            ValueError: for unknown keys, listing the valid ones.
        """
        valid = {f.name for f in dataclasses.fields(cls)}
        unknown = set(d) - valid
        if unknown:
            raise ValueError(
                f"Unknown SpaceSpec keys {sorted(unknown)}; valid keys: {sorted(valid)}."
            )
        return cls(**d)

    def matches(self, other: SpaceSpec) -> bool:
        """Equal up to float rounding of the bounds (for checkpoint compatibility checks)."""

        def close(a, b):
            if a is None or b is None:
                return a is b
            return len(a) == len(b) and all(
                (x == y) or math.isclose(x, y, rel_tol=1e-6, abs_tol=1e-6) for x, y in zip(a, b)
            )

        return (
            close(self.action_low, other.action_low)
            and close(self.action_high, other.action_high)
            and self.action_n == other.action_n
            and self.state_dim == other.state_dim
            and self.image_shape == other.image_shape
            and self.wrist_image_shape == other.wrist_image_shape
        )


@dataclass
class ActionOutput:
    """What :meth:`Policy.act` returns for a batch of N observations.

    Attributes:
        actions: (N, K, A) in env units: float32 for a Box, int64 indices for a Discrete
            (A = 1). Already clipped/squashed into the action space.
        logprobs: log-probs of the sampled actions at the policy's granularity: (N, K, A)
            ``token``, (N, K) ``action`` or (N,) ``chunk``; float32.
        values: (N,) float32 state values, or None for a policy without a critic.
        forward_inputs: tensors (leading dim N) that :meth:`Policy.evaluate` needs to
            recompute ``logprobs``: the encoded observation inputs and the policy's own action
            samples (``action_samples``, e.g. the pre-clip Gaussian sample or token ids).
    """

    actions: torch.Tensor
    logprobs: torch.Tensor
    values: torch.Tensor | None
    forward_inputs: dict[str, torch.Tensor] = field(default_factory=dict)


class _EvaluationFields(NamedTuple):
    logprobs: torch.Tensor
    entropy: torch.Tensor
    values: torch.Tensor | None


class Evaluation(_EvaluationFields):
    """What :meth:`Policy.evaluate` returns (unpacks as ``logprobs, entropy, values``).

    Views (e.g. ``values[..., 0]``) are copied on construction: FSDP2 registers its pre-backward
    hook on the outputs of a sharded module's forward methods, and an in-place op on a view
    output would drop that hook (torch warns "returned a view tensor").

    Attributes:
        logprobs: at the policy's granularity, like :attr:`ActionOutput.logprobs` (with grad).
        entropy: entropy of the action distribution at the same granularity (with grad).
        values: (N,) or None.
    """

    __slots__ = ()

    def __new__(cls, logprobs, entropy, values=None):
        own = lambda t: t.clone() if isinstance(t, torch.Tensor) and t._base is not None else t  # noqa: E731
        return super().__new__(cls, own(logprobs), own(entropy), own(values))


class SFTLoss(NamedTuple):
    """What :meth:`Policy.sft_loss` returns.

    Attributes:
        loss: scalar imitation objective with gradient (per action dimension).
        values: (B,) values of the same forward pass (behaviour cloning fits the critic on demo
            returns with them), or None without a critic.
        metrics: what the SFT loop logs besides the loss (``token_accuracy``, ``l1``), or None.
    """

    loss: torch.Tensor
    values: torch.Tensor | None
    metrics: dict[str, float] | None = None


class Policy(nn.Module, abc.ABC):
    """Base class of every policy (small actor-critics and VLAs alike).

    Subclasses set :attr:`config_class`, take ``(config, spec)`` in ``__init__`` and implement
    :meth:`act` and :meth:`evaluate`; they are registered by ``policy.type`` in
    :mod:`rlinf_embodied.policies.registry`.

    Attributes:
        config: the policy config (a :class:`~rlinf_embodied.config.PolicyConfig` subclass).
        spec: the :class:`SpaceSpec` the policy was built for.
    """

    config_class: type = PolicyConfig

    def __init__(self, config: PolicyConfig, spec: SpaceSpec):
        super().__init__()
        self.config = config
        self.spec = spec

    @property
    def action_chunk(self) -> int:
        """K, actions per query."""
        return self.config.action_chunk

    @property
    def greedy_draws(self) -> bool:
        """Whether ``act(mode="greedy")`` draws from torch's generator (π0 with
        ``policy.greedy_noise: fresh``); evaluations then seed greedy queries per trial and
        query as they seed sampled ones. False: greedy actions are a function of the input."""
        return False

    @property
    def granularity(self) -> str:
        """``token``, ``action`` or ``chunk`` (``policy.logprob_granularity``)."""
        return self.config.logprob_granularity

    @property
    def device(self) -> torch.device:
        """Device of the policy's first parameter (CPU for a parameter-less policy)."""
        for p in self.parameters():
            return p.device
        return torch.device("cpu")

    def to_granularity(self, per_token: torch.Tensor) -> torch.Tensor:
        """Sum (N, K, A) per-token log-probs or entropies to the policy's granularity."""
        return sum_to_level(per_token, self.granularity)

    @abc.abstractmethod
    def act(self, obs: Mapping[str, Any], mode: str = SAMPLE) -> ActionOutput:
        """Actions for a batch of observations (no gradient).

        Args:
            obs: env observation dict with leading dim N (see the module docstring).
            mode: ``"sample"`` draws from the distribution, ``"greedy"`` takes its mode.

        Returns:
            An :class:`ActionOutput`.

        Raises:
            ValueError: for an unknown mode or an observation missing a key the policy needs.
        """

    @abc.abstractmethod
    def evaluate(
        self, forward_inputs: Mapping[str, torch.Tensor], actions: torch.Tensor | None = None
    ) -> Evaluation:
        """Recompute log-probs, entropy and values (with gradient) for stored rollout data.

        Args:
            forward_inputs: :attr:`ActionOutput.forward_inputs`, possibly re-batched (B, ...).
            actions: (B, K, A) env-unit actions; used only when ``forward_inputs`` lacks the
                policy's own samples (e.g. scoring demonstration actions).

        Returns:
            An :class:`Evaluation`; with unchanged weights its log-probs equal the rollout's.
        """

    def update_obs_stats(self, forward_inputs: Mapping[str, torch.Tensor],
                         valid: torch.Tensor | None = None) -> None:
        """Refresh running observation statistics from one update's batch (after the update).

        Called by :func:`~rlinf_embodied.algorithms.update.update_policy` on every actor rank
        (a collective when the policy normalises observations and there are several ranks).
        Policies without observation normalisation ignore it.

        Args:
            forward_inputs: the batch's encoder inputs (B, ...).
            valid: (B,) bool, the rows to use; None = all.
        """

    def log_std_parameters(self) -> list[nn.Parameter]:
        """The state-independent log-std parameters of a Gaussian action head, each (A,) or
        (K * A,), as registered on the modules (sharded under FSDP2); what
        ``algorithm.log_std_anneal_to`` caps. The base class has none ([]): a policy with
        discrete actions, or one that does not expose them."""
        return []

    def critic_parameters(self) -> list[nn.Parameter]:
        """The parameters that only the critic uses (value head, a critic trunk of its own).

        Parameters the actor shares with the critic (a shared trunk, a VLA's LoRA backbone)
        belong to the actor. The RL update reads this for ``trainer.critic_lr`` (the critic's
        optimizer group) and ``trainer.critic_warmup_iterations`` (every other parameter is
        frozen); a policy with a critic must override it. The base class has no critic.

        Returns:
            The parameter objects as registered on the modules (also after FSDP2 sharding,
            whose registered parameters are these modules' own); [] without a critic.
        """
        return []

    def sft_loss(self, forward_inputs: Mapping[str, torch.Tensor], actions: torch.Tensor) -> SFTLoss:
        """Supervised objective on demonstrated actions (behaviour cloning, rlinf_embodied/sft).

        The default is the negative log-likelihood per action dimension from :meth:`evaluate`
        (Gaussian heads, action tokens); policies without a tractable likelihood override it
        (flow matching: policies/pi0.py).

        Args:
            forward_inputs: the encoded demonstration observations (B rows).
            actions: (B, K, A) demonstrated env-unit actions.
        """
        ev = self.evaluate(forward_inputs, actions)
        per_query = ev.logprobs.reshape(ev.logprobs.shape[0], -1).shape[1]
        return SFTLoss(-ev.logprobs.mean() / (actions.shape[1] * actions.shape[2] / per_query), ev.values)

    def fsdp_units(self) -> list[nn.Module]:
        """Submodules that FSDP2 shards as units of their own before the root (transformer
        blocks of a VLA); small policies shard as one unit and return []."""
        return []

    def predict_values(self, obs: Mapping[str, Any]) -> torch.Tensor:
        """State values (N,) of an observation batch (e.g. a truncated env's final
        observation, for GAE bootstrapping); no gradient.

        Raises:
            NotImplementedError: for a policy without a critic.
        """
        raise NotImplementedError(
            f"{type(self).__name__} has no critic; use a critic-free advantage (grpo, "
            "reinforce_pp) or enable the value head (policy.critic=true)."
        )


def check_mode(mode: str) -> bool:
    """True for greedy mode, False for sample mode.

    Raises:
        ValueError: for any other mode.
    """
    if mode not in (SAMPLE, GREEDY):
        raise ValueError(f"act mode must be {SAMPLE!r} or {GREEDY!r}; got {mode!r}.")
    return mode == GREEDY


def obs_tensor(
    obs: Mapping[str, Any],
    key: str,
    device: torch.device,
    dtype: torch.dtype,
    policy: str,
    trailing: Sequence[int] | None = None,
) -> torch.Tensor:
    """``obs[key]`` as a tensor on ``device`` with ``dtype``, shape-checked.

    Args:
        obs: observation dict.
        key: e.g. ``"states"``.
        device: target device.
        dtype: target dtype (uint8 images stay uint8).
        policy: policy type, for the error message.
        trailing: expected shape after the batch dim; None skips the check.

    Raises:
        ValueError: if the key is absent or the shape is wrong.
    """
    if key not in obs or obs[key] is None:
        raise ValueError(
            f"The {policy} policy needs obs[{key!r}] but the env does not provide it "
            f"(keys: {sorted(obs)}); pick an env obs mode that produces it or another "
            "policy.type."
        )
    x = torch.as_tensor(obs[key], device=device)
    if trailing is not None and tuple(x.shape[1:]) != tuple(trailing):
        raise ValueError(
            f"obs[{key!r}] has shape {tuple(x.shape)}, expected (N, {', '.join(map(str, trailing))}) "
            "from the policy's SpaceSpec; rebuild the policy for this env."
        )
    return x.to(dtype)


# --------------------------------------------------------------------------------------------
# Batch-invariant acting: every env's row on its own
# --------------------------------------------------------------------------------------------
def obs_rows(obs: Mapping[str, Any], rows: Sequence[int]) -> dict[str, Any]:
    """The observation batch of envs ``rows`` only (each entry keeps its batch dimension).

    Tensors and arrays are indexed along dim 0 and copied, lists and tuples (``task_descriptions``) are
    picked element by element; any other value (a scalar setting) is passed unchanged.
    """
    rows = [int(i) for i in rows]
    out: dict[str, Any] = {}
    for k, v in obs.items():
        if hasattr(v, "shape") and getattr(v, "ndim", 0) >= 1:  # tensor or array
            # A copy, not a view: a row then starts at an allocation boundary like any batch,
            # so no kernel sees another alignment than it would for a batch of its own.
            part = v[rows[0]:rows[0] + 1] if len(rows) == 1 else v[rows]
            out[k] = part.clone() if isinstance(part, torch.Tensor) else part.copy()
        elif isinstance(v, (list, tuple)):
            out[k] = type(v)(v[i] for i in rows)
        else:
            out[k] = v
    return out


def cat_rows(parts: Sequence[Any]) -> Any:
    """Row-wise outputs of :meth:`Policy.act` joined back into one batch (env axis 0).

    Each part is an :class:`ActionOutput` (actions, log-probs, values and every
    ``forward_inputs`` tensor are concatenated; values stay None when they are None), a tensor,
    or a numpy array (actions of a plain Policy-like object).
    """
    first = parts[0]
    if isinstance(first, ActionOutput):
        return ActionOutput(
            cat_rows([p.actions for p in parts]),
            cat_rows([p.logprobs for p in parts]),
            None if first.values is None else cat_rows([p.values for p in parts]),
            {k: cat_rows([p.forward_inputs[k] for p in parts]) for k in first.forward_inputs},
        )
    if isinstance(first, torch.Tensor):
        return torch.cat(list(parts), 0)
    import numpy as np

    return np.concatenate([np.asarray(p) for p in parts], 0)


def act_rows(policy: Any, obs: Mapping[str, Any], mode: str = GREEDY,
             seeds: Sequence[int] | None = None) -> Any:
    """Batch-invariant :meth:`Policy.act`: the policy runs on each env's row alone (a batch
    of 1) and the rows are concatenated (:func:`cat_rows`).

    A batched forward is deterministic for one batch size but not across batch sizes: CPU GEMM
    kernels (and cuBLAS) choose their blocking, hence the order of their float additions, by
    the number of rows, so row i's actions differ in the last bits between a batch of 1 and one
    of 8, and contact dynamics amplify that into different episodes. A batch of 1 has the same
    shapes whatever the batch was, so row i's output depends only on row i, the weights, the
    device and its kernels: evaluation results then do not depend on how many envs run
    together. The price is N forwards of one row instead of one of N (see
    benchmarks/bench_eval.py).

    Args:
        policy: an object with ``act(obs, mode)`` returning an :class:`ActionOutput` or actions.
        obs: the observation batch (N rows; see the module docstring).
        mode: ``greedy`` or ``sample``.
        seeds: one torch seed per row (``torch.manual_seed`` before the row's forward, which
            seeds the CUDA generators too), so sampled draws are the row's own; None leaves the
            generator as it is (greedy rows draw nothing).

    Returns:
        What ``policy.act`` returns, with N rows.

    Raises:
        ValueError: ``seeds`` does not give one seed per row.
    """
    n = _batch_size(obs)
    if seeds is not None and len(seeds) != n:
        raise ValueError(f"act_rows needs one seed per row: {len(seeds)} seeds for {n} rows.")
    parts = []
    for i in range(n):
        if seeds is not None:
            torch.manual_seed(int(seeds[i]))
        parts.append(policy.act(obs_rows(obs, [i]), mode=mode))
    return cat_rows(parts)


def _batch_size(obs: Mapping[str, Any]) -> int:
    """N: the length of the first batched entry of ``obs``.

    Raises:
        ValueError: ``obs`` has no batched entry.
    """
    for v in obs.values():
        if hasattr(v, "shape") and getattr(v, "ndim", 0) >= 1:
            return int(v.shape[0])
        if isinstance(v, (list, tuple)):
            return len(v)
    raise ValueError(f"The observation has no batched entry (keys: {sorted(obs)}).")
