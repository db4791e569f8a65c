"""Typed configuration: one dataclass per component, YAML files plus Hydra-style overrides.

Every job is a YAML file whose top level matches :class:`JobConfig`. Sections that come in
variants (``env``, ``policy``) carry a ``type`` key that selects the dataclass through
:func:`register_config`; each variant subclasses the section's base class.

Parsing is strict: an unknown key is a :class:`ConfigError` naming the key and the closest valid
one, a value of the wrong type names key, expected type and value, a missing file names the path.
Overrides use the dotted ``key=value`` syntax users know from Hydra
(``env.num_envs=16 algorithm.gamma=0.9``); values are parsed as YAML scalars.

Nothing past the CLI sees a dict: :func:`load_config` returns dataclass instances.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import tempfile
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional

from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import ConfigKeyError, OmegaConfBaseException, ValidationError

__all__ = [
    "ConfigError",
    "register_config",
    "config_class",
    "config_types",
    "load_config",
    "to_yaml",
    "save_config",
    "RunConfig",
    "ClusterConfig",
    "EnvConfig",
    "ManiSkillEnvConfig",
    "LiberoEnvConfig",
    "GymEnvConfig",
    "PolicyConfig",
    "AlgorithmConfig",
    "TrainerConfig",
    "EvalConfig",
    "LoggingConfig",
    "JobConfig",
]


class ConfigError(ValueError):
    """A configuration file or override is invalid; the message says what and how to fix it."""


# --------------------------------------------------------------------------------------------
# Registry of variants: (section, type) -> dataclass
# --------------------------------------------------------------------------------------------
_VARIANTS: Dict[str, Dict[str, type]] = {}


def register_config(section: str, type_name: str):
    """Class decorator registering a dataclass as variant ``type_name`` of ``section``.

    Example::

        @register_config("env", "maniskill")
        @dataclass
        class ManiSkillEnvConfig(EnvConfig): ...

    Raises:
        ValueError: if the variant is already registered with a different class.
    """

    def deco(cls):
        known = _VARIANTS.setdefault(section, {})
        if type_name in known and known[type_name] is not cls:
            raise ValueError(f"{section} type {type_name!r} is already registered")
        known[type_name] = cls
        return cls

    return deco


def config_types(section: str) -> List[str]:
    """Names of the registered variants of ``section`` (e.g. ``config_types("env")``)."""
    return sorted(_VARIANTS.get(section, {}))


def config_class(section: str, type_name: str) -> type:
    """The dataclass of variant ``type_name`` of ``section``.

    Raises:
        ConfigError: for an unknown type, listing the valid ones.
    """
    known = _VARIANTS.get(section, {})
    if type_name not in known:
        raise ConfigError(
            f"Unknown {section}.type {type_name!r}. Valid types: {', '.join(sorted(known))}"
            + _suggest(type_name, known)
        )
    return known[type_name]


def _suggest(word: str, candidates) -> str:
    close = difflib.get_close_matches(str(word), list(candidates), n=1, cutoff=0.5)
    return f". Did you mean {close[0]!r}?" if close else ""


# --------------------------------------------------------------------------------------------
# Sections
# --------------------------------------------------------------------------------------------
@dataclass
class RunConfig:
    """Where and how a run is recorded."""

    name: str = "run"
    """Run name; the run directory is ``{output_dir}/{name}`` unless ``dir`` is set."""
    output_dir: str = "runs"
    """Parent directory of run directories (relative to the working directory)."""
    dir: Optional[str] = None
    """Explicit run directory; overrides ``output_dir``/``name``."""
    seed: int = 0
    """Global seed: torch, numpy and env seeds of every worker derive from it."""

    def run_dir(self) -> Path:
        """The run directory as a path (not created)."""
        return Path(self.dir) if self.dir else Path(self.output_dir) / self.name


@dataclass
class ClusterConfig:
    """The Ray cluster the runtime uses."""

    address: Optional[str] = None
    """Ray address to attach to (``auto`` or ``host:port``); None starts an embedded local Ray."""
    num_cpus: Optional[int] = None
    """CPUs for the embedded Ray; None uses the machine's CPU count."""
    num_cpu_devices: int = 1
    """Device slots per GPU-less node, so placement behaves the same on a laptop as on GPUs."""


@dataclass
class EnvConfig:
    """Common fields of every environment variant (select one with ``type``)."""

    type: str = "maniskill"
    """Adapter: ``maniskill``, ``libero`` or ``gym`` (``rlinf-embodied envs list``)."""
    num_envs: int = 8
    """N, parallel environments per env worker group (split across its ranks)."""
    max_episode_steps: Optional[int] = None
    """Truncate episodes after this many env steps; None keeps the env's own limit."""
    ignore_terminations: bool = False
    """Run fixed-length episodes (GRPO and fair evaluation): terminations do not end them."""
    seed: Optional[int] = None
    """Base seed of env resets; None derives it from ``run.seed``."""
    num_processes: int = 1
    """Subprocesses of the env pool per env worker (CPU simulators); 0 runs in-process."""
    step_timeout_s: float = 60.0
    """A reset or step that takes longer ends the episode as truncated with ``env_error``."""
    video: bool = False
    """Write one MP4 per episode (off in training, on in evaluation)."""

    def __post_init__(self):
        if self.num_envs < 1:
            raise ConfigError(f"env.num_envs must be >= 1 (got {self.num_envs}).")
        if self.num_processes < 0:
            raise ConfigError(f"env.num_processes must be >= 0 (got {self.num_processes}).")


@register_config("env", "maniskill")
@dataclass
class ManiSkillEnvConfig(EnvConfig):
    """ManiSkill3 task (SAPIEN). GPU physics on CUDA machines, physx_cpu processes otherwise."""

    type: str = "maniskill"
    env_id: str = "PushCube-v1"
    """Any registered ManiSkill3 env id."""
    obs_mode: str = "state"
    """``state`` or ``rgb``."""
    control_mode: str = "pd_joint_delta_pos"
    """ManiSkill controller (the ManiSkill PPO baseline uses pd_joint_delta_pos)."""
    reward_mode: str = "normalized_dense"
    """``sparse``, ``dense`` or ``normalized_dense``."""
    sensor_size: int = 128
    """Camera width and height in pixels for ``obs_mode=rgb``."""
    sim_backend: str = "auto"
    """``auto`` (GPU when CUDA is available), ``physx_cpu`` or ``physx_cuda``."""
    task_description: Optional[str] = None
    """Language instruction; None uses the per-task table."""


@register_config("env", "libero")
@dataclass
class LiberoEnvConfig(EnvConfig):
    """LIBERO suite task (robosuite + MuJoCo, CPU physics)."""

    type: str = "libero"
    suite: str = "libero_spatial"
    """libero_spatial, libero_object, libero_goal, libero_10 or libero_90."""
    task_ids: List[int] = field(default_factory=lambda: [0])
    """Tasks of the suite (in the suite's order) that the envs cycle through."""
    image_size: int = 256
    """Agentview and wrist camera size in pixels."""
    obs_mode: str = "rgb"
    """``rgb`` renders both cameras; ``state`` renders none (fast, for tests and profiling)."""
    num_settle_steps: int = 10
    """Steps with the settle action after reset, not counted (openvla_v1 protocol)."""
    libero_root: Optional[str] = None
    """Path of a user's own LIBERO checkout (bddl files, init states, assets); None uses the
    installed package."""


@register_config("env", "gym")
@dataclass
class GymEnvConfig(EnvConfig):
    """Any gymnasium env: a registered id or a ``module:Class`` entry point."""

    type: str = "gym"
    env_id: str = "CartPole-v1"
    """Gymnasium id or ``module:Class``."""
    kwargs: Dict[str, Any] = field(default_factory=dict)
    """Keyword arguments for the env constructor."""
    vectorization: str = "sync"
    """``sync`` (cheap envs, in-process) or ``async`` (subprocesses)."""
    image_keys: Dict[str, str] = field(default_factory=dict)
    """For Dict observations: env key -> ``main_images`` / ``wrist_images``."""
    state_keys: List[str] = field(default_factory=list)
    """For Dict observations: keys concatenated into ``states``."""
    task_description: str = ""
    """Language instruction reported in ``task_descriptions``."""


@dataclass
class PolicyConfig:
    """Common fields of every policy variant (select one with ``type``)."""

    type: str = "mlp"
    """``mlp``, ``cnn``, ``openvla``, ``openvla_oft`` (see policies/)."""
    checkpoint: Optional[str] = None
    """Directory to load weights from; None initialises from config."""
    action_chunk: int = 1
    """K, actions per query executed open loop."""
    logprob_granularity: str = "action"
    """Log-probs per ``token`` (N, K, A), ``action`` (N, K) or ``chunk`` (N,)."""


@dataclass
class AlgorithmConfig:
    """RL algorithm: advantage estimator and losses (names from the algorithm registry)."""

    advantage: str = "gae"
    """``gae``, ``grpo`` or ``reinforce_pp``."""
    loss: str = "ppo"
    """Policy loss name."""
    gamma: float = 0.8
    """Discount (ManiSkill PPO baseline: 0.8)."""
    gae_lambda: float = 0.9
    """GAE lambda (ManiSkill PPO baseline: 0.9)."""
    clip_ratio_low: float = 0.2
    clip_ratio_high: float = 0.2
    """Clip-higher (DAPO / SimpleVLA-RL use 0.28)."""
    dual_clip: Optional[float] = None
    """Dual-clip constant c > 1 for negative advantages; None disables."""
    value_clip: Optional[float] = None
    entropy_coef: float = 0.0
    value_coef: float = 0.5
    kl_coef: float = 0.0
    """Coefficient of the KL penalty to the reference policy."""
    target_kl: Optional[float] = None
    """Stop the update epochs early when the approximate KL exceeds this."""
    normalize_advantages: bool = True
    group_size: int = 1
    """G, rollouts per initial state (GRPO)."""
    grpo_std_normalize: bool = True
    filter_low: Optional[float] = None
    filter_high: Optional[float] = None
    """GRPO dynamic sampling: drop groups whose success rate is outside [low, high]."""


@dataclass
class TrainerConfig:
    """The training loop."""

    iterations: int = 100
    rollout_steps: int = 50
    """T, env steps (policy queries) per env per iteration."""
    update_epochs: int = 4
    num_minibatches: int = 4
    micro_batch_size: Optional[int] = None
    """Gradient accumulation micro-batch; None = whole minibatch."""
    lr: float = 3e-4
    lr_schedule: str = "constant"
    """``constant``, ``linear`` or ``cosine``."""
    max_grad_norm: float = 0.5
    pipeline_stages: int = 1
    """Env micro-batches pipelined against generation (paper section 3.3)."""
    eval_every: int = 10
    save_every: int = 10
    offload: bool = False
    """FSDP CPU offload of parameters, gradients and optimizer state."""
    max_time_s: Optional[float] = None
    """Stop (and checkpoint) after this wall time."""

    def __post_init__(self):
        if self.pipeline_stages < 1:
            raise ConfigError(f"trainer.pipeline_stages must be >= 1 (got {self.pipeline_stages}).")


@dataclass
class EvalConfig:
    """Evaluation during training and from the CLI."""

    num_episodes: int = 16
    seed_offset: int = 1_000_000
    """Eval seeds start here so they are disjoint from training seeds."""
    num_videos: int = 2
    greedy: bool = True


@dataclass
class LoggingConfig:
    """Metrics and progress output."""

    tensorboard: bool = True
    wandb: bool = False
    wandb_project: str = "rlinf-embodied"
    console: bool = True


@dataclass
class JobConfig:
    """A whole job: the top level of every YAML in ``configs/``."""

    run: RunConfig = field(default_factory=RunConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    placement: str = "collocated"
    """Name of a file in ``configs/placement/`` (``collocated``, ``disaggregated``, ``hybrid``),
    a path to a placement YAML, or ``auto`` (profile and plan)."""
    env: EnvConfig = field(default_factory=ManiSkillEnvConfig)
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)


# Sections whose dataclass is chosen by their ``type`` key.
_POLYMORPHIC = {"env", "policy"}


# --------------------------------------------------------------------------------------------
# Loading
# --------------------------------------------------------------------------------------------
def _read_yaml(path: str | os.PathLike) -> DictConfig:
    p = Path(path)
    if not p.exists():
        raise ConfigError(f"Config file not found: {p} (absolute: {p.resolve()}).")
    if p.is_dir():
        raise ConfigError(f"Config path {p} is a directory; pass a YAML file.")
    try:
        cfg = OmegaConf.load(p)
    except Exception as e:  # yaml.YAMLError and friends
        raise ConfigError(f"Config file {p} is not valid YAML: {e}") from e
    if not isinstance(cfg, DictConfig):
        raise ConfigError(f"Config file {p} must hold a mapping at the top level.")
    return cfg


def _parse_overrides(overrides: List[str]) -> DictConfig:
    for o in overrides:
        if "=" not in o or o.startswith("="):
            raise ConfigError(f"Override {o!r} is not of the form key=value (e.g. env.num_envs=16).")
    try:
        return OmegaConf.from_dotlist(list(overrides))
    except OmegaConfBaseException as e:
        raise ConfigError(f"Cannot parse overrides {overrides}: {e}") from e


def _schema_for(schema_cls: type, raw: DictConfig | None) -> Any:
    """Structured schema of ``schema_cls`` with polymorphic sections resolved by their type."""
    base = OmegaConf.structured(schema_cls)
    if not dataclasses.is_dataclass(schema_cls):
        return base
    for f in dataclasses.fields(schema_cls):
        if f.name not in _POLYMORPHIC:
            continue
        node = raw.get(f.name) if raw is not None else None
        explicit = isinstance(node, DictConfig) and "type" in node
        type_name = str(node["type"]) if explicit else OmegaConf.select(base, f"{f.name}.type")
        default_type = OmegaConf.select(base, f"{f.name}.type")
        if type_name == default_type and type_name not in _VARIANTS.get(f.name, {}):
            continue  # the base dataclass's default type has no variant class
        cls = config_class(f.name, type_name)
        OmegaConf.set_struct(base, False)
        base[f.name] = OmegaConf.structured(cls)
        OmegaConf.set_struct(base, True)
    return base


def _valid_keys(schema: DictConfig, full_key: str) -> List[str]:
    parent = full_key.rsplit(".", 1)[0] if "." in full_key else ""
    node = OmegaConf.select(schema, parent) if parent else schema
    return list(node.keys()) if isinstance(node, DictConfig) else []


def _translate(e: OmegaConfBaseException, schema: DictConfig, source: str) -> ConfigError:
    key = getattr(e, "full_key", None) or ""
    if isinstance(e, ConfigKeyError) and key:
        valid = _valid_keys(schema, key)
        leaf = key.rsplit(".", 1)[-1]
        section = key.rsplit(".", 1)[0] if "." in key else "top level"
        hint = _suggest(leaf, valid)
        return ConfigError(
            f"Unknown config key {key!r} in {source}{hint or '.'} Valid keys of {section}: "
            f"{', '.join(sorted(valid))}."
        )
    if isinstance(e, ValidationError) and key:
        expected = _field_type_name(getattr(e, "object_type", None), getattr(e, "key", None))
        value = getattr(e, "value", None)
        return ConfigError(
            f"Wrong type for config key {key!r} in {source}: expected {expected}, "
            f"got {value!r} ({type(value).__name__})."
        )
    return ConfigError(f"Invalid config in {source}: {e}")


def _field_type_name(cls: Optional[type], key: Optional[str]) -> str:
    """Readable annotation of dataclass field ``key`` of ``cls`` (e.g. ``int``, ``Optional[int]``)."""
    if cls is None or key is None or not dataclasses.is_dataclass(cls):
        return "a value of the field's type"
    try:
        hint = typing.get_type_hints(cls).get(str(key))
    except Exception:  # noqa: BLE001 - unresolvable annotations
        hint = None
    if hint is None:
        return "a value of the field's type"
    if typing.get_args(hint):
        return str(hint).replace("typing.", "")
    return getattr(hint, "__name__", str(hint))


def load_config(
    path: str | os.PathLike | None = None,
    overrides: Optional[List[str]] = None,
    schema: type = JobConfig,
) -> Any:
    """Load a YAML job file, apply ``key=value`` overrides, validate, return dataclasses.

    Args:
        path: YAML file; None starts from the schema's defaults.
        overrides: dotted overrides, e.g. ``["env.num_envs=16", "trainer.lr=1e-4"]``.
        schema: top-level dataclass (default :class:`JobConfig`).

    Returns:
        An instance of ``schema`` (nested dataclasses, variants resolved by ``type``).

    Raises:
        ConfigError: missing file, invalid YAML, unknown key (with the closest valid key),
            wrong type (with key, expected type and value), unknown variant type, or a
            cross-field check of a section's ``__post_init__``.
    """
    overrides = list(overrides or [])
    raw = _read_yaml(path) if path is not None else OmegaConf.create({})
    ov = _parse_overrides(overrides)
    merged_raw = OmegaConf.merge(raw, ov)
    source = str(path) if path is not None else "defaults"
    if overrides:
        source += f" + overrides {overrides}"
    structured = _schema_for(schema, merged_raw)
    try:
        cfg = OmegaConf.merge(structured, merged_raw)
        obj = OmegaConf.to_object(cfg)
    except OmegaConfBaseException as e:
        cause = e
        # to_object wraps __post_init__ errors; surface ours unchanged.
        inner = e.__cause__ or e.__context__
        if isinstance(inner, ConfigError):
            raise inner from None
        raise _translate(cause, structured, source) from None
    except ConfigError:
        raise
    return obj


def to_yaml(cfg: Any) -> str:
    """Resolved YAML text of a config dataclass (what ``config show`` prints)."""
    return OmegaConf.to_yaml(OmegaConf.structured(cfg))


def save_config(cfg: Any, run_dir: str | os.PathLike, name: str = "config.yaml") -> Path:
    """Write the resolved config into ``run_dir`` atomically (temp file, then rename)."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    target = run_dir / name
    fd, tmp = tempfile.mkstemp(dir=run_dir, prefix=f".{name}.", suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        f.write(to_yaml(cfg))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, target)
    return target


def as_dict(cfg: Any) -> Dict[str, Any]:
    """Plain-dict view of a config dataclass (for logging and hashing only)."""
    out = OmegaConf.to_container(OmegaConf.structured(cfg), resolve=True)
    assert isinstance(out, dict)
    return out


_ = ListConfig  # re-exported type for annotations elsewhere
