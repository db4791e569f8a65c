"""Resolve ``--policy SOURCE`` into something that maps observations to actions, plus its hash.

SOURCE is one of:

* ``random``: uniform actions over the env's bounds (a baseline and a throughput probe);
* a ``module:function`` factory: called with a :class:`PolicyContext` (or without arguments
  if it takes none), it returns a :class:`~rlinf_embodied.policies.base.Policy`-like object
  with ``act(obs, mode)`` or a plain ``obs -> actions`` function (actions (N, A) or (N, K, A));
* a published-format OpenVLA / OpenVLA-OFT directory (``config.json``; OFT adds
  ``action_head--*`` / ``proprio_projector--*`` files), built through the policy registry with
  the protocol's VLA conventions (un-normalisation key, gripper mapping);
* a policy checkpoint written by ``save_policy`` (``policy.yaml``), a checkpoint directory of a
  training run (``checkpoints/iter_*/``, policy files in it or in its ``policy/``), or a run
  directory: its latest complete checkpoint (``checkpoints/latest``), or with
  ``--checkpoint best`` ``checkpoints/best`` (the policy of the run's best evaluation).

A Policy-like source acts in the protocol's ``policy_mode``: ``greedy`` (the distribution's
mode) or ``sample`` (draws from the distribution, each env's query under its own seed from the
protocol's ``global_seed``, the task, the trial and the query index). It runs batch-invariant
unless the evaluation turns that off (:attr:`PolicyContext.batch_invariant`): once per env, on
that env's row alone, so an episode is the same for any ``num_envs``
(:func:`~rlinf_embodied.eval.acting.policy_act`). ``random`` ignores the mode and, batch-invariant,
draws each env's actions from a generator seeded per episode and query. A plain
``obs -> actions`` function sees the whole batch: the evaluation cannot make it invariant.

Every source is stamped with a sha256: of the checkpoint files (relative names and contents),
of the factory's module source, or of the word ``random``.

The SOURCE's files are found and hashed in :mod:`rlinf_embodied.eval.policy_files`; the act
function of a Policy-like source is built in :mod:`rlinf_embodied.eval.acting`.
"""

from __future__ import annotations

import hashlib
import importlib
import inspect
import json
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, Mapping, Optional

import numpy as np
from rlinf_embodied.eval.acting import as_chunk, policy_act
from rlinf_embodied.eval.policy_files import (
    PolicySourceError,
    choose_unnorm_key,
    find_checkpoint,
    hash_files,
    hash_policy,
    import_failure,
    importable_from_cwd,
    missing_source,
    names_callable,
)
from rlinf_embodied.eval.policy_fit import (
    check_source,
    mismatch_error,
    spec_problems,
    type_error,
    vla_kind,
)

__all__ = ["PolicyContext", "LoadedPolicy", "resolve_policy", "oft_layout"]


@dataclass
class PolicyContext:
    """What a policy factory may need to know about the evaluation.

    Attributes:
        action_low: (A,) lower action bounds in env units.
        action_high: (A,) upper action bounds.
        discrete: True for a Discrete action space (actions (N, 1) integers in [0, n)).
        num_envs: N, batch size of every ``act`` call.
        env: ``libero`` or ``maniskill``.
        suite: LIBERO suite, or None.
        env_id: ManiSkill env id, or None.
        protocol: the :class:`~rlinf_embodied.eval.protocols.Protocol` in use.
        device: torch device string for the policy (``cuda`` when available, else ``cpu``).
        obs_shapes: per-env observation shapes, e.g. ``{"states": (S,)}``.
        batch_invariant: run a Policy-like source row by row (``--batch-invariant``, the
            default), so per-episode results do not depend on ``num_envs``.
    """

    action_low: np.ndarray
    action_high: np.ndarray
    discrete: bool
    num_envs: int
    env: str
    suite: Optional[str]
    env_id: Optional[str]
    protocol: Any
    device: str = "cpu"
    obs_shapes: Mapping[str, tuple] = field(default_factory=dict)
    batch_invariant: bool = True


@dataclass
class LoadedPolicy:
    """A resolved ``--policy``.

    Attributes:
        act: ``act(obs) -> actions`` (N, K, A) numpy or torch, in env units: the policy's
            greedy actions, or actions drawn from its distribution when the protocol's
            ``policy_mode`` is ``sample`` (seeded per episode, see
            :func:`~rlinf_embodied.eval.acting.episode_seed`).
        source: the SOURCE string as given.
        kind: ``random``, ``callable``, ``checkpoint``, ``openvla`` or ``openvla_oft``.
        sha256: hash of the checkpoint files and the directories its config reads (``pretrained``,
            ``tokenizer``; :func:`~rlinf_embodied.eval.policy_files.hash_policy`) / factory source (hex).
        path: resolved checkpoint directory, if any.
        needs_images: whether the policy reads ``main_images`` (False only when known).
        execution: what one query executes when known before running: ``head`` type,
            ``action_chunk`` K, ``open_loop_steps``, ``unnorm_key``, ``preprocessing`` (VLA
            policies); the evaluation adds the chunk length it observes.
        checkpoint: ``latest`` or ``best`` when the source is a training run directory (which
            of its checkpoints ``--checkpoint`` chose), else None.
        iteration: training iteration of that checkpoint (its ``runner_state.json``), if known.
        batch_invariant: whether ``act`` computes each env's actions from that env's row
            alone (row by row, per-episode seeds), so that they do not depend on the batch;
            False for a batched forward and for a plain ``obs -> actions`` function.
    """

    act: Callable[[Mapping[str, Any]], Any]
    source: str
    kind: str
    sha256: str
    path: Optional[str] = None
    needs_images: bool = True
    execution: Dict[str, Any] = field(default_factory=dict)
    checkpoint: Optional[str] = None
    iteration: Optional[int] = None
    batch_invariant: bool = False

    def header(self) -> Dict[str, Any]:
        """The results-header entry of the policy (``execution`` goes in the header beside it)."""
        h = {"source": self.source, "kind": self.kind, "sha256": self.sha256, "path": self.path}
        if self.checkpoint is not None:
            h.update(checkpoint=self.checkpoint, iteration=self.iteration)
        return h


def _results_policy(path: Path) -> Optional[str]:
    """The ``--policy`` an eval results file at ``path`` records ("" if none), or None if it
    is not a results file."""
    from rlinf_embodied.eval.results import ResultsError, ResultsFile

    if path.suffix != ".json":
        return None
    try:
        header = ResultsFile.load(path).header
    except ResultsError:
        return None
    return str((header.get("policy") or {}).get("source") or "")


def _random_policy(ctx: PolicyContext) -> Callable[..., np.ndarray]:
    """Uniform actions (N, 1, A) over the env's bounds (infinite bounds read as +-1).

    Batch-invariant (``ctx.batch_invariant``), each env's actions come from a generator seeded
    by :func:`~rlinf_embodied.eval.acting.episode_seed` of its (task, trial, query); otherwise
    the batch is drawn from one generator seeded by the protocol's ``global_seed``.
    """
    from rlinf_embodied.eval.acting import episode_seed

    seed = int(ctx.protocol.global_seed)
    stream = np.random.default_rng(seed)
    low = np.where(np.isfinite(ctx.action_low), ctx.action_low, -1.0).astype(np.float32)
    high = np.where(np.isfinite(ctx.action_high), ctx.action_high, 1.0).astype(np.float32)

    def draw(rng: np.random.Generator, n: int) -> np.ndarray:
        if ctx.discrete:
            return rng.integers(int(low[0]), int(high[0]) + 1, size=(n, 1, 1))
        return rng.uniform(low, high, size=(n, 1, low.shape[0])).astype(np.float32)

    def act(obs: Mapping[str, Any], episodes: Optional[list] = None) -> np.ndarray:
        if episodes is None:
            return draw(stream, ctx.num_envs)
        rows = [draw(np.random.default_rng(episode_seed(seed, *key)), 1) if key is not None
                else None for key in episodes]
        like = next((r for r in rows if r is not None), None)
        if like is None:  # every slot idle: the loop ignores the actions
            return draw(stream, len(episodes))
        return np.concatenate([like * 0 if r is None else r for r in rows], 0)

    act.per_episode = ctx.batch_invariant
    return act


def _mode_of(ctx: PolicyContext) -> tuple:
    """``(policy_mode, seed, batch_invariant)``: :func:`policy_act`'s arguments from the
    evaluation's protocol (``greedy`` when it has none) and context."""
    p = ctx.protocol
    return (getattr(p, "policy_mode", "greedy"), int(getattr(p, "global_seed", 0)),
            bool(ctx.batch_invariant))


def _load_callable(source: str, ctx: PolicyContext) -> LoadedPolicy:
    module_name, _, attr = source.partition(":")
    importable_from_cwd()
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise PolicySourceError(import_failure(source, str(e))) from None
    fn = getattr(module, attr, None)
    if not callable(fn):
        names = sorted(n for n, v in vars(module).items() if callable(v) and not n.startswith("_"))
        raise PolicySourceError(
            f"Module {module_name} has no callable {attr!r}; its callables: {', '.join(names)}."
        )
    try:
        text = inspect.getsource(module)
    except (OSError, TypeError):
        text = inspect.getsource(fn)
    # The module's source and the factory's name: two factories of one module differ.
    sha = hashlib.sha256(f"{text}\n{module_name}:{attr}".encode()).hexdigest()
    takes_ctx = any(
        p.default is inspect.Parameter.empty
        and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
        for p in inspect.signature(fn).parameters.values()
    )
    try:
        made = fn(ctx) if takes_ctx else fn()
    except Exception as e:  # noqa: BLE001 - the user's code: one line naming it, not a traceback
        where = traceback.extract_tb(e.__traceback__)[-1]
        raise PolicySourceError(
            f"--policy {source}: the factory raised {type(e).__name__}: {e} (at "
            f"{where.filename}:{where.lineno}); a factory takes the PolicyContext (or nothing) and "
            "returns an object with act(obs, mode) or a function obs -> actions "
            "(docs/evaluation.md, 'Your own policy')."
        ) from None
    mode, seed, invariant = _mode_of(ctx)
    if hasattr(made, "act"):
        act = policy_act(made, mode, seed, invariant)
    elif mode != "greedy":
        raise PolicySourceError(
            f"Protocol policy_mode {mode} draws actions from the policy's distribution, but "
            f"{source} returned a plain obs -> actions function, which has none; return an "
            "object with act(obs, mode) or evaluate with --policy-mode greedy."
        )
    elif callable(made):
        act = lambda obs: as_chunk(made(obs))  # noqa: E731
    else:
        raise PolicySourceError(
            f"{source} returned {type(made).__name__}; a policy factory must return an object "
            "with act(obs, mode) or a function obs -> actions (--policy module:function names "
            "the factory, not the act function: docs/evaluation.md, 'Your own policy')."
        )
    return LoadedPolicy(act, source, "callable", sha,
                        batch_invariant=hasattr(made, "act") and invariant)


def _spec_of(ctx: PolicyContext) -> Any:
    from rlinf_embodied.policies.base import SpaceSpec

    shapes = ctx.obs_shapes
    if ctx.discrete:
        space = dict(action_n=int(ctx.action_high[0]) + 1)
    else:
        space = dict(action_low=list(map(float, ctx.action_low)),
                     action_high=list(map(float, ctx.action_high)))
    return SpaceSpec(
        state_dim=int(shapes["states"][0]) if "states" in shapes else 0,
        image_shape=tuple(shapes["main_images"]) if "main_images" in shapes else None,
        wrist_image_shape=tuple(shapes["wrist_images"]) if "wrist_images" in shapes else None,
        **space,
    )


def _execution(policy: Any) -> Dict[str, Any]:
    """``policy.execution()`` when it has one, else its type and action chunk."""
    if hasattr(policy, "execution"):
        return dict(policy.execution())
    k = int(getattr(policy, "action_chunk", 1))
    return {"head": getattr(getattr(policy, "config", None), "type", type(policy).__name__),
            "action_chunk": k, "open_loop_steps": k}


def _load_checkpoint(path: Path, source: str, ctx: PolicyContext,
                     expected_type: Optional[str], which: str = "latest") -> LoadedPolicy:
    from rlinf_embodied.policies.registry import PolicyCheckpointError, PolicyTypeError, load_policy

    ckpt = find_checkpoint(path, which)
    try:
        policy = load_policy(ckpt, expected_type=expected_type, map_location=ctx.device)
    except PolicyTypeError as e:  # named as the eval flag, not the training config key
        raise type_error(ckpt, e) from None
    except PolicyCheckpointError as e:
        raise PolicySourceError(str(e)) from None
    want = _spec_of(ctx)
    have = policy.spec
    problems = spec_problems(have, {"action_dim": want.action_dim, "discrete": want.discrete,
                                    "states": (want.state_dim,), "main_images": want.image_shape})
    if problems:
        raise mismatch_error(ckpt, policy.config.type, problems, ctx.env,
                             {"suite": ctx.suite, "env_id": ctx.env_id})
    which_run, iteration = None, None
    if (path / "checkpoints").is_dir():  # a run directory: say which of its checkpoints
        which_run = which
        state = next((d / "runner_state.json" for d in (ckpt, ckpt.parent)
                      if (d / "runner_state.json").is_file()), None)
        if state is not None:
            iteration = json.loads(state.read_text()).get("iteration")
    return LoadedPolicy(policy_act(policy, *_mode_of(ctx)), source, "checkpoint",
                        hash_policy(ckpt, policy.config), str(ckpt),
                        needs_images=have.image_shape is not None, execution=_execution(policy),
                        checkpoint=which_run, iteration=iteration,
                        batch_invariant=ctx.batch_invariant)


def _head_file(path: Path, prefix: str) -> Optional[Path]:
    files = sorted(p for p in path.glob(f"{prefix}--*") if p.suffix == ".pt" and "checkpoint" in p.name)
    return files[0] if files else None


def oft_layout(path: Path, ctx: PolicyContext) -> Dict[str, Any]:
    """Policy config fields implied by the head files of a published OpenVLA-OFT directory.

    * ``action_head--*checkpoint.pt``: the L1-regression head (``action_head=continuous``),
      with the agentview + wrist images the published LIBERO models take when the env has a
      wrist camera (OFT checkpoints do not record their image count);
    * ``proprio_projector--*checkpoint.pt``: ``use_proprio`` with ``proprio_dim`` read from
      the projector's ``fc1`` weight;
    * no head file: the discrete-token model RL systems start from (one image, no proprio);
      such a directory looks like OpenVLA's, so it is OFT only with ``--policy-type openvla_oft``.

    Raises:
        PolicySourceError: a diffusion head (``noisy_action_projector--*``) or a FiLM vision
            backbone (``vision_backbone--*``), which this framework does not implement.
    """
    import torch

    for marker, what in (("noisy_action_projector", "a diffusion action head"),
                         ("vision_backbone", "a FiLM-conditioned vision backbone")):
        f = _head_file(path, marker)
        if f is not None:
            raise PolicySourceError(
                f"{path} holds {what} ({f.name}), which rlinf-embodied does not implement; "
                "evaluate an L1-regression or discrete-token OpenVLA-OFT checkpoint instead."
            )
    head, proprio = _head_file(path, "action_head"), _head_file(path, "proprio_projector")
    fields: Dict[str, Any] = {"action_head": "continuous" if head is not None else "discrete",
                              "use_proprio": proprio is not None}
    if proprio is not None:
        sd = torch.load(proprio, map_location="cpu", weights_only=True)
        w = sd.get("module.fc1.weight", sd.get("fc1.weight"))
        if w is None or w.ndim != 2:
            raise PolicySourceError(
                f"{proprio} has no fc1.weight (keys: {sorted(sd)[:4]}); it is not an OFT proprio "
                "projector."
            )
        fields["proprio_dim"] = int(w.shape[1])
    fields["use_wrist_image"] = head is not None and "wrist_images" in ctx.obs_shapes
    return fields


def _load_vla(path: Path, source: str, ctx: PolicyContext,
              expected_type: Optional[str]) -> LoadedPolicy:
    from rlinf_embodied.policies.registry import build_policy, policy_types

    from rlinf_embodied.config import config_class

    kind = vla_kind(path, expected_type)
    if kind not in policy_types():
        raise PolicySourceError(
            f"{path} is a published {kind} checkpoint but the {kind} policy is not available "
            f"in this installation (registered: {', '.join(policy_types())}); install "
            "rlinf-embodied[vla]."
        )
    conventions = dict(getattr(ctx.protocol, "vla_conventions", {}) or {})
    unnorm = choose_unnorm_key(path, conventions.pop("unnorm_key", None), ctx.suite)
    cls = config_class("policy", kind)
    fields = set(getattr(cls, "__dataclass_fields__", {}))
    kwargs = {k: v for k, v in conventions.items() if k in fields}
    if kind == "openvla_oft":
        kwargs.update(oft_layout(path, ctx))
    if unnorm is not None:
        kwargs["unnorm_key"] = unnorm
    cfg = cls(type=kind, pretrained=str(path), **kwargs)
    try:
        policy = build_policy(cfg, _spec_of(ctx)).to(ctx.device)
    except (ValueError, FileNotFoundError) as e:
        raise PolicySourceError(f"Cannot build the {kind} policy from {path}: {e}") from None
    execution = dict(policy.execution())
    execution.update({k: getattr(cfg, k) for k in ("use_wrist_image", "use_proprio") if k in fields})
    return LoadedPolicy(policy_act(policy, *_mode_of(ctx)), source, kind, hash_files(path), str(path),
                        execution=execution, batch_invariant=ctx.batch_invariant)


def resolve_policy(source: str, ctx: PolicyContext,
                   expected_type: Optional[str] = None, checkpoint: str = "latest") -> LoadedPolicy:
    """Turn ``--policy SOURCE`` into a :class:`LoadedPolicy` (see the module docstring).

    Args:
        source: ``random``, ``module:function``, or a directory.
        ctx: the evaluation's :class:`PolicyContext`.
        expected_type: ``--policy-type``: the policy type the checkpoint must hold, or None.
        checkpoint: ``--checkpoint``: which checkpoint of a training run directory,
            ``latest`` or ``best`` (:func:`find_checkpoint`); ``best`` needs a run directory.

    Raises:
        PolicySourceError: a missing path, a directory that is no checkpoint, a checkpoint of
            another type than ``expected_type`` or for another env, an unimportable factory,
            ``checkpoint="best"`` for a source that is no run directory.
    """
    path = Path(source).expanduser()
    check_source(source, expected_type, checkpoint)
    if source == "random":
        sha = hashlib.sha256(b"random").hexdigest()
        return LoadedPolicy(_random_policy(ctx), source, "random", sha, needs_images=False,
                            execution={"head": "random", "action_chunk": 1, "open_loop_steps": 1},
                            batch_invariant=ctx.batch_invariant)
    if path.exists():
        if not path.is_dir():
            evaluated = _results_policy(path)
            if evaluated is not None:
                raise PolicySourceError(
                    f"--policy {source} is an eval results file, not a policy; pass the policy "
                    f"it evaluated{f' (--policy {evaluated})' if evaluated else ''} or compare "
                    "results with `rlinf-embodied eval compare`.")
            raise PolicySourceError(
                f"--policy {source} is a file; pass its directory (a checkpoint directory, a "
                "training run directory or a published OpenVLA/OFT directory)."
            )
        if (path / "config.json").is_file():
            return _load_vla(path, source, ctx, expected_type)
        return _load_checkpoint(path, source, ctx, expected_type, checkpoint)
    if names_callable(source):
        return _load_callable(source, ctx)
    raise PolicySourceError(missing_source(source))

