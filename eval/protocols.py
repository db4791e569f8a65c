"""Named, versioned evaluation protocols: how a success rate was obtained, as code.

Published LIBERO numbers disagree largely because projects evaluate differently (max steps,
settle steps, trials, image orientation, simulator versions). A :class:`Protocol` fixes every
one of those choices under a name (``openvla_v1``); a results file records the protocol's id,
version and :meth:`Protocol.fingerprint`, and ``eval compare`` refuses to compare results of
different protocols.

Sources (see REFERENCE.md "LIBERO evaluation protocols in use"):

* ``openvla_v1``: the OpenVLA / OpenVLA-OFT LIBERO eval script (``run_libero_eval.py``).
* ``libero_native``: LIBERO's own lifelong-learning evaluation.
* ``simplevla_512``: SimpleVLA-RL's LIBERO rollout (512 steps for every suite; its env code
  comes from the OpenVLA-OFT eval script, whose settle action it keeps).
* ``rlinf_512``: the RLinf LIBERO YAMLs (512 steps, 15 zero-action settle steps).
* ``seeded_v1``: any gymnasium env (trial i resets with seed ``env_seed + i``), for
  toy envs and users' own tasks.
* ``maniskill_fair_v1``: ManiSkill3's fair evaluation (terminations ignored; success_once and
  success_at_end reported; ManiSkill PPO baseline eval).
* ``maniskill_lang3_v1``: the language-conditioned ManiSkill suite ``maniskill_lang3``, 50
  held-out seeds per task, episodes end at their first success.
* ``maniskill_lang3_peg_v1``: the same for ``maniskill_lang3_peg`` (StackCube replaced by
  LiftPegUpright, 100-step horizon).

Simulator versions (ENVIRONMENT.md "Version facts that change results"): MuJoCo >= 3.4 changes
how LIBERO initial states settle and >= 3.3.3 renders LIBERO-Object floors darker; robosuite 1.5
removed classes LIBERO imports. Every LIBERO protocol therefore requires mujoco 3.3.2 and
robosuite 1.4.x. :func:`check_versions` compares them with what is installed.

Importing this module is cheap: no simulator, no torch.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import sys
import warnings
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any, Dict, List, Mapping, Optional, Tuple

__all__ = [
    "Protocol",
    "ProtocolError",
    "SimulatorVersionWarning",
    "register_protocol",
    "get_protocol",
    "protocol_names",
    "check_versions",
    "warn_versions",
    "LIBERO_SUITES",
    "OPENVLA_SETTLE_ACTION",
    "ZERO_ACTION",
    "POLICY_MODES",
]


class ProtocolError(ValueError):
    """An unknown protocol, suite or override; the message lists the valid choices."""


class SimulatorVersionWarning(UserWarning):
    """The installed simulator stack differs from what the protocol requires."""


LIBERO_SUITES = ("libero_spatial", "libero_object", "libero_goal", "libero_10", "libero_90")
"""The official LIBERO suites (10 tasks each, libero_90 has 90)."""

OPENVLA_SETTLE_ACTION = (0.0, 0.0, 0.0, 0.0, 0.0, 0.0, -1.0)
"""Settle action of the OpenVLA LIBERO eval script: no motion, gripper open (-1 = open)."""

ZERO_ACTION = (0.0,) * 7
"""All-zero settle action (LIBERO's own eval, RLinf)."""

POLICY_MODES = ("greedy", "sample")
"""Values of :attr:`Protocol.policy_mode`: the distribution's mode, or draws from it."""

_LIBERO_STACK = {"mujoco": "==3.3.2", "robosuite": ">=1.4,<1.5"}

# OpenVLA / OFT LIBERO eval scripts: un-normalise with the "<suite>" statistics, or, when the
# checkpoint has none, those of the "<suite>_no_noops" dataset the published LIBERO checkpoints
# were fine-tuned on; gripper [0, 1] -> [-1, 1], sign, then inverted (env: -1 open).
_OPENVLA_CONVENTIONS = {
    "unnorm_key": ("{suite}", "{suite}_no_noops"),
    "gripper_to_signed": True,
    "gripper_binarize": True,
    "gripper_invert": True,
    "center_crop": True,
}
_MANISKILL_STACK = {"mani-skill": "==3.0.1", "sapien": "==3.0.3"}

# Fields that select *which* episodes run, not *how* they run; excluded from the fingerprint
# so that an evaluation of tasks 0,3 with 5 trials compares with a full one on shared pairs.
_SELECTION_FIELDS = ("trials_per_task",)
_NON_DYNAMIC_FIELDS = ("description", "source", "overrides") + _SELECTION_FIELDS


@dataclass(frozen=True)
class Protocol:
    """Everything that decides how an evaluation episode runs and is scored.

    Attributes:
        name: registry name, e.g. ``openvla_v1``.
        version: bumped whenever a field of a named protocol changes.
        env: simulator family, ``libero`` or ``maniskill``.
        max_steps: suite (LIBERO) or env id (ManiSkill) -> max policy steps (env steps after
            settling; an action chunk of K counts K). Key ``"*"`` is the default; an empty
            mapping uses the env's registered time limit.
        num_settle_steps: steps after reset with ``settle_action`` that are not counted and
            not given to the policy (objects settle after the stored state is loaded).
        settle_action: (A,) action during settling, in env units; None for envs without one.
        trials_per_task: episodes per task; trial i uses stored initial state i (LIBERO) or
            reset seed ``env_seed + i`` (ManiSkill).
        image_size: camera height = width in pixels given to the policy; None = env default.
        rotate_180: rotate camera images by 180 degrees (``img[::-1, ::-1]``) before the policy.
            The OpenVLA scripts do this because MuJoCo renders LIBERO upside down and their
            training data was flipped.
        env_seed: simulator seed before each reset (OpenVLA: ``env.seed(0)``); ManiSkill
            adds the trial index.
        global_seed: seed of Python, numpy and torch before the evaluation (OpenVLA: 7).
        ignore_terminations: run every episode to ``max_steps`` and score success_once and
            success_at_end (ManiSkill fair evaluation); False ends an episode at its first
            done, which for LIBERO is success.
        policy_mode: ``greedy`` (the distribution's mode) or ``sample`` (actions drawn from the
            policy's distribution, as RL rollouts take them, with a torch random stream seeded
            by ``global_seed``; see :mod:`rlinf_embodied.eval.acting`).
        vla_conventions: policy config fields applied when a published OpenVLA/OFT checkpoint
            is evaluated (``unnorm_key``: templates with ``{suite}`` tried in order); empty for none.
        requires: distribution name -> PEP 440 specifier of the simulator stack.
        description: one line for ``--help`` and reports.
        source: where the numbers come from.
        overrides: field -> value changed from the named protocol (empty for the canonical
            one); kept so that a results file says it is not canonical.
    """

    name: str
    version: int
    env: str
    max_steps: Mapping[str, int]
    num_settle_steps: int
    settle_action: Optional[Tuple[float, ...]]
    trials_per_task: int
    image_size: Optional[int]
    rotate_180: bool
    env_seed: int
    global_seed: int
    ignore_terminations: bool
    requires: Mapping[str, str]
    description: str = ""
    source: str = ""
    policy_mode: str = "greedy"
    vla_conventions: Mapping[str, Any] = field(default_factory=dict)
    overrides: Mapping[str, Any] = field(default_factory=dict)

    @property
    def id(self) -> str:
        """``name@vVERSION``, plus ``+overridden`` when fields were overridden."""
        base = f"{self.name}@v{self.version}"
        dynamic = [k for k in self.overrides if k not in _SELECTION_FIELDS]
        return base + ("+" + ",".join(sorted(dynamic)) if dynamic else "")

    def max_steps_for(self, key: str) -> Optional[int]:
        """Max policy steps for a suite (LIBERO) or env id (ManiSkill).

        Returns:
            The step limit, or None when :attr:`max_steps` is empty (use the env's registered
            time limit).

        Raises:
            ProtocolError: if the protocol has entries, none for ``key``, and no ``"*"``.
        """
        if key in self.max_steps:
            return int(self.max_steps[key])
        if "*" in self.max_steps:
            return int(self.max_steps["*"])
        if not self.max_steps:
            return None
        raise ProtocolError(
            f"Protocol {self.name} defines max steps for {', '.join(sorted(self.max_steps))}, "
            f"not for {key!r}; pick one of those or pass --max-steps."
        )

    def with_overrides(self, **changes: Any) -> "Protocol":
        """A copy with some fields changed; the changes are recorded in :attr:`overrides`.

        ``max_steps`` may be given as an int (applies to every suite/task).

        Raises:
            ProtocolError: for a field that is not a protocol field or cannot be overridden.
        """
        changes = {k: v for k, v in changes.items() if v is not None}
        fixed = {"name", "version", "env", "requires", "overrides", "description", "source",
                 "vla_conventions"}
        valid = sorted(f.name for f in dataclasses.fields(self) if f.name not in fixed)
        bad = [k for k in changes if k not in valid]
        if bad:
            raise ProtocolError(
                f"Cannot override {', '.join(bad)} of protocol {self.name}; valid fields: "
                f"{', '.join(valid)}."
            )
        if "max_steps" in changes and isinstance(changes["max_steps"], int):
            changes["max_steps"] = {"*": changes["max_steps"]}
        if "settle_action" in changes and changes["settle_action"] is not None:
            changes["settle_action"] = tuple(float(a) for a in changes["settle_action"])
        if "policy_mode" in changes and changes["policy_mode"] not in POLICY_MODES:
            raise ProtocolError(f"policy_mode must be one of {', '.join(POLICY_MODES)} "
                                f"(got {changes['policy_mode']!r}).")
        for k in ("trials_per_task", "num_settle_steps"):
            if k in changes and int(changes[k]) < (1 if k == "trials_per_task" else 0):
                raise ProtocolError(f"{k} must be >= {1 if k == 'trials_per_task' else 0} "
                                    f"(got {changes[k]}).")
        real = {k: v for k, v in changes.items() if getattr(self, k) != v}
        if not real:
            return self
        merged = {**dict(self.overrides), **real}
        return dataclasses.replace(self, overrides=merged, **real)

    def to_dict(self) -> Dict[str, Any]:
        """Plain-data view (JSON-ready) of every field, plus ``id`` and ``fingerprint``."""
        d = {f.name: _plain(getattr(self, f.name)) for f in dataclasses.fields(self)}
        d["id"] = self.id
        d["fingerprint"] = self.fingerprint()
        return d

    def fingerprint(self) -> str:
        """sha256 (first 16 hex digits) of every field that changes how an episode runs.

        Two results with the same fingerprint ran their episodes identically; trial selection
        (``trials_per_task``) and descriptive fields are excluded.
        """
        d = {
            f.name: _plain(getattr(self, f.name))
            for f in dataclasses.fields(self)
            if f.name not in _NON_DYNAMIC_FIELDS
        }
        text = json.dumps(d, sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]


def _plain(v: Any) -> Any:
    if isinstance(v, Mapping):
        return {str(k): _plain(x) for k, x in v.items()}
    if isinstance(v, (tuple, list)):
        return [_plain(x) for x in v]
    return v


# --------------------------------------------------------------------------------------------
# Registry
# --------------------------------------------------------------------------------------------
_PROTOCOLS: Dict[str, Protocol] = {}


def register_protocol(protocol: Protocol) -> Protocol:
    """Add ``protocol`` to the registry under its name.

    Raises:
        ProtocolError: if a different protocol of that name is registered (bump the name or
            the version instead of redefining a published protocol).
    """
    old = _PROTOCOLS.get(protocol.name)
    if old is not None and old != protocol:
        raise ProtocolError(
            f"Protocol {protocol.name!r} is already registered with other values; register "
            "the change under a new name or version."
        )
    _PROTOCOLS[protocol.name] = protocol
    return protocol


def protocol_names(env: Optional[str] = None) -> List[str]:
    """Sorted names of registered protocols, optionally only those of ``env``."""
    return sorted(n for n, p in _PROTOCOLS.items() if env is None or p.env == env)


def get_protocol(name: str, env: Optional[str] = None) -> Protocol:
    """The registered protocol ``name`` (``openvla_v1`` or ``openvla_v1@v1``).

    Args:
        name: protocol name, optionally with ``@vN`` to pin the version.
        env: when given, the protocol must be for this simulator family.

    Raises:
        ProtocolError: unknown name, version mismatch, or a protocol for another env; the
            message lists the valid names.
    """
    base, _, ver = name.partition("@")
    if base not in _PROTOCOLS:
        raise ProtocolError(
            f"Unknown protocol {name!r}. Valid protocols: {', '.join(protocol_names(env))}."
        )
    p = _PROTOCOLS[base]
    if ver and ver.lstrip("v") != str(p.version):
        raise ProtocolError(
            f"Protocol {base} is at version {p.version}, not {ver}; use {base}@v{p.version} "
            "or an older release of rlinf-embodied."
        )
    if env is not None and p.env != env:
        raise ProtocolError(
            f"Protocol {base} is for {p.env}, not {env}. Protocols for {env}: "
            f"{', '.join(protocol_names(env))}."
        )
    return p


# --------------------------------------------------------------------------------------------
# Simulator versions
# --------------------------------------------------------------------------------------------
def installed_version(dist: str) -> Optional[str]:
    """Installed version of distribution ``dist``, or None when it is not installed."""
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def check_versions(protocol: Protocol) -> List[str]:
    """Differences between the installed simulator stack and ``protocol.requires``.

    Returns:
        One sentence per mismatch, e.g. ``"mujoco 3.4.0 does not satisfy ==3.3.2"``; empty
        when everything matches.
    """
    from packaging.specifiers import SpecifierSet

    problems = []
    for dist, spec in protocol.requires.items():
        have = installed_version(dist)
        if have is None:
            problems.append(f"{dist} is not installed (protocol needs {dist}{spec})")
        elif have not in SpecifierSet(spec):
            problems.append(f"{dist} {have} does not satisfy {spec}")
    return problems


def warn_versions(protocol: Protocol) -> List[str]:
    """:func:`check_versions`, with a loud warning (stderr banner + warning) on mismatch.

    Returns:
        The mismatches (recorded in the results header by the caller).
    """
    problems = check_versions(protocol)
    if problems:
        msg = (
            f"Protocol {protocol.id} requires {dict(protocol.requires)} but: "
            + "; ".join(problems)
            + ". Success rates may not be comparable with published numbers (ENVIRONMENT.md "
            "'Version facts that change results'); install the pinned versions "
            "(pip install -e '.[libero]' / '.[maniskill]'). This is recorded in the results "
            "header."
        )
        bar = "!" * 78
        print(f"{bar}\nWARNING: {msg}\n{bar}", file=sys.stderr)
        warnings.warn(msg, SimulatorVersionWarning, stacklevel=2)
    return problems


# --------------------------------------------------------------------------------------------
# The protocols
# --------------------------------------------------------------------------------------------
def _libero(**fields: Any) -> Protocol:
    """Register a LIBERO protocol: the OpenVLA script's settings unless ``fields`` say otherwise."""
    values: Dict[str, Any] = dict(
        version=1, env="libero", num_settle_steps=10, settle_action=OPENVLA_SETTLE_ACTION,
        trials_per_task=50, image_size=256, rotate_180=True, env_seed=0, global_seed=7,
        ignore_terminations=False, requires=_LIBERO_STACK, vla_conventions=_OPENVLA_CONVENTIONS,
    )
    values.update(fields)
    return register_protocol(Protocol(**values))


OPENVLA_V1 = _libero(
    name="openvla_v1",
    description="Canonical OpenVLA / OpenVLA-OFT LIBERO evaluation.",
    source="OpenVLA LIBERO eval script (run_libero_eval.py)",
    max_steps={"libero_spatial": 220, "libero_object": 280, "libero_goal": 300,
               "libero_10": 520, "libero_90": 400},
)

LIBERO_NATIVE = _libero(
    name="libero_native",
    description="LIBERO's own lifelong-learning evaluation (600 steps, 20 trials, 128 px).",
    source="LIBERO lifelong eval (libero/lifelong)",
    max_steps={"*": 600},
    num_settle_steps=5,
    settle_action=ZERO_ACTION,
    trials_per_task=20,
    image_size=128,
    # LIBERO's own policies are trained on the renderer's raw (upside-down) images.
    rotate_180=False,
    global_seed=0,
    vla_conventions={},
)

SIMPLEVLA_512 = _libero(
    name="simplevla_512",
    description="SimpleVLA-RL / TorchRL vla_grpo: 512 max steps for every suite.",
    source="SimpleVLA-RL LIBERO rollout (OpenVLA-OFT env utilities)",
    max_steps={"*": 512},
)

RLINF_512 = _libero(
    name="rlinf_512",
    description="RLinf LIBERO YAMLs: 512 max steps, 15 zero-action settle steps.",
    source="RLinf LIBERO configs",
    max_steps={"*": 512},
    num_settle_steps=15,
    settle_action=ZERO_ACTION,
)

def _maniskill(**fields: Any) -> Protocol:
    """Register a ManiSkill protocol: no settling, unrotated images, global seed 0 and the
    pinned ManiSkill stack unless ``fields`` say otherwise."""
    values: Dict[str, Any] = dict(
        version=1, env="maniskill", num_settle_steps=0, settle_action=None, image_size=None,
        rotate_180=False, global_seed=0, requires=_MANISKILL_STACK,
    )
    values.update(fields)
    return register_protocol(Protocol(**values))


MANISKILL_FAIR_V1 = _maniskill(
    name="maniskill_fair_v1",
    description="ManiSkill3 fair evaluation: terminations ignored, success_once and "
                "success_at_end; trial i resets with seed env_seed + i.",
    source="ManiSkill3 PPO baseline evaluation",
    # Empty: each env's registered time limit (PushCube-v1 / PickCube-v1: 50 steps), the
    # horizon ManiSkill's own evaluation uses.
    max_steps={},
    trials_per_task=100,
    env_seed=1_000_000,
    ignore_terminations=True,
)

MANISKILL_LANG3_V1 = _maniskill(
    name="maniskill_lang3_v1",
    description="The maniskill_lang3 suite (PushCube, PullCube, StackCube with instructions, "
                "envs/maniskill_suites.py): 50 held-out trials per task, trial i of every task "
                "resets with seed env_seed + i; an episode ends at its first success or after "
                "80 steps.",
    source="rlinf-embodied (language-conditioned ManiSkill suite)",
    max_steps={"maniskill_lang3": 80},
    trials_per_task=50,
    # Held out: demonstrations use seeds < 1_000_000, training resets run.seed x 1_000_000 +
    # phase x 500_000 + iteration x 1_000 + env (below this for run seeds under 990), in-training
    # evaluation eval.seed_offset (2e9) and up; env seeds must stay below 1e9.
    env_seed=990_000_000,
    ignore_terminations=False,
)

MANISKILL_LANG3_PEG_V1 = _maniskill(
    name="maniskill_lang3_peg_v1",
    description="The maniskill_lang3_peg suite (PushCube, PullCube, LiftPegUpright with "
                "instructions, envs/maniskill_suites.py): 50 held-out trials per task, trial i "
                "of every task resets with seed env_seed + i; an episode ends at its first "
                "success or after 100 steps.",
    source="rlinf-embodied (language-conditioned ManiSkill suite)",
    max_steps={"maniskill_lang3_peg": 100},
    trials_per_task=50,
    env_seed=990_000_000,  # held out as maniskill_lang3_v1's
    ignore_terminations=False,
)

SEEDED_V1 = register_protocol(Protocol(
    name="seeded_v1",
    version=1,
    env="gym",
    description="Any gymnasium env: trial i resets with seed env_seed + i; an episode ends at "
                "its first done; success is the env's info['success'] at any step.",
    source="rlinf-embodied",
    max_steps={},
    num_settle_steps=0,
    settle_action=None,
    trials_per_task=20,
    image_size=None,
    rotate_180=False,
    env_seed=1_000_000,
    global_seed=0,
    ignore_terminations=False,
    requires={"gymnasium": ">=1.0"},
))
