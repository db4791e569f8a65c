"""Env families: how an evaluation request maps onto a simulator family's env.

A family (LIBERO, ManiSkill, gymnasium) lists the request's tasks, builds the EnvConfig from the
protocol, the request and its checked ``--env-override`` values (:func:`checked_env_config`),
and resets env slots to given (task, trial) pairs. :func:`resolve_protocol` and
:func:`auto_obs_mode` settle the two request choices that depend on the family.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from rlinf_embodied.eval.protocols import LIBERO_SUITES, POLICY_MODES, Protocol, get_protocol
from rlinf_embodied.eval.request import DEFAULT_PROTOCOLS, EvalError, EvalRequest, Pair, is_custom_env

__all__ = [
    "EnvFamily",
    "FAMILIES",
    "family_class",
    "resolve_protocol",
    "auto_obs_mode",
    "checked_env_config",
    "FLAG_ENV_SETTINGS",
]


# --------------------------------------------------------------------------------------------
# The families: which tasks exist, how to configure the env, how to start a given pair
# --------------------------------------------------------------------------------------------
class EnvFamily:
    """How one simulator family maps protocol + request onto an env and (task, trial) resets."""

    name = ""
    films_state_policies = False
    """Whether the env renders video frames beside state observations (so ``--video`` works
    with ``--obs-mode state``); the others film only what the policy sees."""

    def __init__(self, req: EvalRequest, protocol: Protocol):
        self.req, self.protocol = req, protocol

    def tasks(self) -> List[Any]:
        raise NotImplementedError

    def instruction(self, task: Any) -> str:
        return str(task)

    def max_steps(self) -> Optional[int]:
        raise NotImplementedError

    @staticmethod
    def config_class() -> type:
        """The family's EnvConfig class (its fields are the valid ``env_overrides``)."""
        raise NotImplementedError

    def env_config(self, num_envs: int, num_processes: int, obs_mode: str,
                   first: Sequence[Pair]) -> Any:
        """The EnvConfig; ``first`` are the pairs the N slots start with."""
        raise NotImplementedError

    def reset(self, env: Any, ids: List[int], pairs: List[Pair], first: bool) -> Dict[str, Any]:
        """Reset slots ``ids`` to start ``pairs``; returns the obs of all N envs."""
        raise NotImplementedError

    def header(self) -> Dict[str, Any]:
        return {}


class _LiberoFamily(EnvFamily):
    """LIBERO: task ids of a suite; trial i loads the task's stored initial state i."""

    name = "libero"

    @staticmethod
    def config_class() -> type:
        from rlinf_embodied.envs.configuration_libero import LiberoEnvConfig

        return LiberoEnvConfig

    def __init__(self, req: EvalRequest, protocol: Protocol):
        super().__init__(req, protocol)
        if req.suite not in LIBERO_SUITES:
            raise EvalError(
                ("--env libero needs --suite" if req.suite is None else f"Unknown LIBERO suite {req.suite!r}")
                + f"; valid suites: {', '.join(LIBERO_SUITES)} (e.g. --suite libero_spatial)."
            )
        if req.task is not None:
            raise EvalError(f"--env libero evaluates the tasks of --suite {req.suite}; select them "
                            f"by id with --tasks (e.g. --tasks 0,3; `rlinf-embodied envs list` "
                            f"lists them), not --task {req.task}.")
        from rlinf_embodied.envs.libero import libero_init_states, libero_tasks

        root = req.env_overrides.get("libero_root")
        names = [t.language for t in libero_tasks(req.suite, root)]
        n = len(names)
        self._names = names
        tasks = list(range(n)) if req.tasks is None else list(req.tasks)
        bad = [t for t in tasks if not (isinstance(t, int) and 0 <= t < n)]
        if bad or not tasks:
            listing = "; ".join(f"{i}: {s}" for i, s in enumerate(names))
            raise EvalError(
                f"Unknown task id(s) {bad or tasks} for {req.suite}; valid ids are 0..{n - 1} "
                f"(e.g. --tasks 0,3): {listing}."
            )
        trials = protocol.trials_per_task
        for t in tasks:
            stored = len(libero_init_states(req.suite, t, root))
            if trials > stored:
                raise EvalError(
                    f"{trials} trials per task requested but task {t} of {req.suite} has only "
                    f"{stored} stored initial states (trial i uses state i); pass "
                    f"--trials-per-task {stored} or fewer."
                )
        self._tasks = tasks

    def tasks(self) -> List[Any]:
        return self._tasks

    def instruction(self, task: Any) -> str:
        return self._names[task]

    def max_steps(self) -> Optional[int]:
        return self.protocol.max_steps_for(self.req.suite)

    def env_config(self, num_envs: int, num_processes: int, obs_mode: str,
                   first: Sequence[Pair]) -> Any:
        p = self.protocol
        values = dict(
            suite=self.req.suite,
            # Env g is built for the task of the pair it starts with (a task switch rebuilds
            # the env: 3-12 s).
            task_ids=[t for t, _ in first] or list(self._tasks),
            num_envs=num_envs,
            num_processes=num_processes,
            obs_mode=obs_mode,
            num_settle_steps=p.num_settle_steps,
            settle_action=list(p.settle_action),
            flip_images=p.rotate_180,
            max_episode_steps=self.max_steps(),
            ignore_terminations=p.ignore_terminations,
            # The adapter calls env.seed(0) once when it builds an env, as the OpenVLA script
            # does per task; None keeps the BatchedEnv from reseeding env i with seed + i.
            seed=None,
        )
        if p.image_size is not None:
            values["image_size"] = p.image_size
        values.update(self.req.env_overrides)
        return self.config_class()(**values)

    def reset(self, env: Any, ids: List[int], pairs: List[Pair], first: bool) -> Dict[str, Any]:
        options = {"task_ids": [t for t, _ in pairs], "init_state_ids": [i for _, i in pairs]}
        obs, _ = env.reset(env_ids=None if first else ids, options=options)
        return obs

    def header(self) -> Dict[str, Any]:
        return {"suite": self.req.suite,
                "task_names": {str(t): self._names[t] for t in self._tasks}}


class _SeededFamily(EnvFamily):
    """ManiSkill / gymnasium: one env id; trial i resets with seed ``protocol.env_seed + i``."""

    def __init__(self, req: EvalRequest, protocol: Protocol):
        super().__init__(req, protocol)
        if not req.task:
            example = "PushCube-v1" if req.env == "maniskill" else "toy/PointReach-v0"
            raise EvalError(f"--env {req.env} needs --task <env id> (e.g. {example}), or --policy "
                            "a training run (its env.env_id is used).")
        if req.tasks is not None:
            raise EvalError(f"--tasks selects tasks of a --suite (LIBERO, ManiSkill); for "
                            f"--env {req.env} --task <env id> use --task alone.")
        if req.suite is not None:
            raise EvalError(f"--suite {req.suite} is not a suite of --env {req.env}; pass "
                            f"--task <env id> alone (suites: LIBERO, ManiSkill's maniskill_lang3).")

    def tasks(self) -> List[Any]:
        return [self.req.task]

    def max_steps(self) -> Optional[int]:
        return self.protocol.max_steps_for(self.req.task)

    def _task_options(self, tasks: List[Any]) -> Dict[str, Any]:
        """Reset options that put each reset env on its task (one entry per env); none here."""
        return {}

    def reset(self, env: Any, ids: List[int], pairs: List[Pair], first: bool) -> Dict[str, Any]:
        seeds = [self.protocol.env_seed + trial for _, trial in pairs]
        tasks = [t for t, _ in pairs]
        if first and len(ids) != env.num_envs:  # the first reset must reset every env
            env.reset(seed=self.protocol.env_seed,
                      options=self._task_options([tasks[0]] * env.num_envs))
        obs, _ = env.reset(seed=seeds, env_ids=ids, options=self._task_options(tasks))
        return obs

    def header(self) -> Dict[str, Any]:
        return {"env_id": self.req.task}

    def config_seed(self) -> Optional[int]:
        """``seed`` of the EnvConfig: the protocol's ``env_seed``, or None past the range env
        configs accept for training seeds (< 10**9: a run's in-training evaluation trials,
        ``--run-trials``). Every reset of an evaluation passes its seed, so this only
        records the seed where it can."""
        return self.protocol.env_seed if self.protocol.env_seed < 10**9 else None


class _ManiSkillFamily(_SeededFamily):
    """ManiSkill: one env id (``--task``), or the tasks of a language-conditioned suite
    (``--suite maniskill_lang3 [--tasks 0,2]``, envs/maniskill_suites.py): trial i of every task
    resets with seed ``protocol.env_seed + i``."""

    name = "maniskill"
    films_state_policies = True  # its human camera (env render_images)

    def __init__(self, req: EvalRequest, protocol: Protocol):
        self.suite = None
        if req.suite is None:
            super().__init__(req, protocol)
            return
        EnvFamily.__init__(self, req, protocol)
        from rlinf_embodied.envs.maniskill_suites import get_suite

        try:
            self.suite = get_suite(req.suite)
        except ValueError as e:
            raise EvalError(f"--suite: {e}") from None
        if req.task is not None:
            raise EvalError(f"--suite {req.suite} evaluates its own tasks; select them with "
                            f"--tasks ({self.suite.listing()}), not --task.")
        n = len(self.suite.tasks)
        tasks = list(range(n)) if req.tasks is None else list(req.tasks)
        bad = [t for t in tasks if not (isinstance(t, int) and 0 <= t < n)]
        if bad or not tasks:
            raise EvalError(f"Unknown task id(s) {bad or tasks} for {req.suite}; valid ids are "
                            f"0..{n - 1} (e.g. --tasks 0,2): {self.suite.listing()}.")
        self._tasks = tasks

    @staticmethod
    def config_class() -> type:
        from rlinf_embodied.envs.configuration_maniskill import ManiSkillEnvConfig

        return ManiSkillEnvConfig

    def tasks(self) -> List[Any]:
        return self._tasks if self.suite is not None else super().tasks()

    def instruction(self, task: Any) -> str:
        return self.suite.tasks[task].instruction if self.suite is not None else str(task)

    def max_steps(self) -> Optional[int]:
        if self.suite is None:
            return super().max_steps()
        return self.protocol.max_steps_for(self.suite.name)

    def env_config(self, num_envs: int, num_processes: int, obs_mode: str,
                   first: Sequence[Pair]) -> Any:
        values = dict(num_envs=num_envs, num_processes=num_processes,
                      obs_mode=obs_mode, ignore_terminations=self.protocol.ignore_terminations,
                      max_episode_steps=self.max_steps(), seed=self.config_seed())
        if self.suite is not None:
            values.update(suite=self.suite.name, task_ids=list(self._tasks))
        else:
            values["env_id"] = self.req.task
        if obs_mode == "state" and self.req.video != "none":
            values["render_images"] = True  # frames of the human camera for the MP4s
        if self.protocol.image_size is not None:
            values["sensor_size"] = self.protocol.image_size
        values.update(self.req.env_overrides)
        return self.config_class()(**values)

    def _task_options(self, tasks: List[Any]) -> Dict[str, Any]:
        return {"task_ids": tasks} if self.suite is not None else {}

    def header(self) -> Dict[str, Any]:
        if self.suite is None:
            return super().header()
        return {"suite": self.suite.name,
                "task_names": {str(t): f"{self.suite.tasks[t].env_id}: {self.suite.tasks[t].instruction}"
                               for t in self._tasks}}


class _GymFamily(_SeededFamily):
    name = "gym"

    @staticmethod
    def config_class() -> type:
        from rlinf_embodied.envs.configuration_gym import GymEnvConfig

        return GymEnvConfig

    def env_config(self, num_envs: int, num_processes: int, obs_mode: str,
                   first: Sequence[Pair]) -> Any:
        values = dict(env_id=self.req.task, num_envs=num_envs, num_processes=num_processes,
                      vectorization="async" if num_processes > 0 else "sync",
                      ignore_terminations=self.protocol.ignore_terminations,
                      max_episode_steps=self.max_steps(), seed=self.config_seed())
        values.update(self.req.env_overrides)
        return self._make_config(values)

    def _make_config(self, values: Dict[str, Any]) -> Any:
        return self.config_class()(**values)


class _CustomFamily(_GymFamily):
    """A user's env type (``--env package.module:Class``, a run's ``env.type``): seeded like
    gymnasium (trial i resets with seed ``protocol.env_seed + i``; the ``gym`` protocols), its
    EnvConfig the class's own ``config_class``; ``--task`` is its ``env_id`` where the config
    has one, else only a name for the results."""

    name = "custom"

    def __init__(self, req: EvalRequest, protocol: Protocol):
        self.req = req
        if not req.task:  # the class's own default env_id, else only a name
            default = {f.name: f.default for f in dataclasses.fields(self.config_class())}.get("env_id")
            req = dataclasses.replace(req, task=default if isinstance(default, str) and default else req.env)
        super().__init__(req, protocol)

    def config_class(self) -> type:
        from rlinf_embodied.config import ConfigError, config_class
        from rlinf_embodied.config.components import impl_class
        from rlinf_embodied.envs.base import BatchedEnv

        try:
            cls = impl_class("env", self.req.env)
            if not (isinstance(cls, type) and issubclass(cls, BatchedEnv)):
                raise EvalError(f"--env {self.req.env} is not an env class (a BatchedEnv "
                                "subclass such as a GymnasiumEnv); pass libero, maniskill, gym "
                                "or your env's package.module:Class.")
            return config_class("env", self.req.env)
        except ConfigError as e:
            raise EvalError(f"--env {self.req.env}: {e}") from None

    def _make_config(self, values: Dict[str, Any]) -> Any:
        """gym's settings, for the fields the class's config has (``env_id`` only where the
        task is one, not the class's name)."""
        cls = self.config_class()
        names = {f.name for f in dataclasses.fields(cls)}
        if self.req.task == self.req.env and "env_id" not in self.req.env_overrides:
            values.pop("env_id")
        values["type"] = self.req.env
        return cls(**{k: v for k, v in values.items() if k in names})


FAMILIES = {"libero": _LiberoFamily, "maniskill": _ManiSkillFamily, "gym": _GymFamily}
"""The :class:`EnvFamily` of each named ``--env`` value; a ``module:Class`` env type is a
:class:`_CustomFamily` (:func:`family_class`)."""


def family_class(env: str) -> type:
    """The :class:`EnvFamily` class of an ``--env`` value.

    Raises:
        EvalError: neither a family name nor a ``module:Class`` env type (lists the valid ones).
    """
    if env in FAMILIES:
        return FAMILIES[env]
    if is_custom_env(env):
        return _CustomFamily
    raise EvalError(f"Unknown --env {env!r}; valid: {', '.join(sorted(FAMILIES))}, or a "
                    "package.module:Class env type.")


def protocol_env(env: str) -> str:
    """The family whose protocols an ``--env`` value uses (a custom env type: ``gym``'s)."""
    return "gym" if is_custom_env(env) else env


# --------------------------------------------------------------------------------------------
# Request choices that depend on the family
# --------------------------------------------------------------------------------------------


def resolve_protocol(req: EvalRequest) -> Protocol:
    """The request's protocol with its overrides applied.

    Raises:
        EvalError: unknown env family or ``policy_mode`` (named by its CLI flag).
        ProtocolError: unknown protocol (lists valid ones) or invalid override.
    """
    family_class(req.env)  # raises on an unknown --env
    if req.policy_mode is not None and req.policy_mode not in POLICY_MODES:
        raise EvalError(f"--policy-mode must be one of {', '.join(POLICY_MODES)} "
                        f"(got {req.policy_mode!r}).")
    default = DEFAULT_PROTOCOLS[protocol_env(req.env)]
    if req.env == "maniskill" and req.suite is not None and req.protocol is None:
        from rlinf_embodied.envs.maniskill_suites import get_suite

        try:
            default = get_suite(req.suite).protocol
        except ValueError as e:
            raise EvalError(f"--suite: {e}") from None
    protocol = get_protocol(req.protocol or default, env=protocol_env(req.env))
    return protocol.with_overrides(
        trials_per_task=req.trials_per_task, max_steps=req.max_steps,
        num_settle_steps=req.num_settle_steps, image_size=req.image_size,
        policy_mode=req.policy_mode,
    )


def auto_obs_mode(req: EvalRequest) -> str:
    """The evaluation's observation mode, ``rgb`` or ``state``.

    ``req.obs_mode`` when it is ``rgb`` or ``state`` (checked against the video request and the
    policy's saved spec); for ``auto``: ``rgb`` when a video needs images the family films only
    from the policy's view or for a ManiSkill suite, ``state`` for ``random`` or a checkpoint
    saved without images, else ``rgb``.

    Raises:
        EvalError: an unknown mode, ``state`` with a video the family cannot film, or ``rgb``
            for a checkpoint trained without images.
    """
    state_video = family_class(req.env).films_state_policies
    if req.obs_mode != "auto":
        if req.obs_mode not in ("rgb", "state"):
            raise EvalError(f"--obs-mode must be rgb, state or auto (got {req.obs_mode!r}).")
        if req.obs_mode == "state" and req.video != "none" and not state_video:
            raise EvalError(f"--video needs image observations for --env {req.env}; use "
                            "--video none, or --obs-mode rgb with an env that gives images.")
        spec = _checkpoint_spec(req) if req.obs_mode == "rgb" else {}
        if spec and not spec.get("image_shape"):
            raise EvalError(f"--obs-mode rgb: {req.policy} reads state observations only (it "
                            "was trained without images); use --obs-mode state or auto.")
        return req.obs_mode
    if req.video != "none" and not state_video:
        return "rgb"
    if req.env == "maniskill" and req.suite:
        return "rgb"  # a language-conditioned ManiSkill suite gives camera images only
    if req.policy == "random":
        return "state"
    spec = _checkpoint_spec(req)
    if spec:
        return "rgb" if spec.get("image_shape") else "state"
    return "rgb"


def _checkpoint_spec(req: EvalRequest) -> Dict[str, Any]:
    """The saved SpaceSpec of a training run / checkpoint ``--policy``; {} for anything else
    (a published VLA directory, ``random``, a callable) or an unreadable one."""
    path = Path(req.policy)
    if not path.is_dir() or (path / "config.json").is_file():
        return {}
    import yaml
    from rlinf_embodied.eval.policy_files import find_checkpoint
    from rlinf_embodied.policies.registry import SPEC_FILE

    try:
        return yaml.safe_load((find_checkpoint(path, req.checkpoint) / SPEC_FILE)
                              .read_text()) or {}
    except (OSError, ValueError):
        return {}


# --------------------------------------------------------------------------------------------
# --env-override values, checked against the family's EnvConfig
# --------------------------------------------------------------------------------------------
def _typed_overrides(family: EnvFamily, req: EvalRequest) -> Dict[str, Any]:
    """Each ``--env-override`` value checked against its EnvConfig field's type through
    OmegaConf, as ``train`` checks its overrides (``"8"`` becomes 8 for an int setting).

    Raises:
        EvalError: naming the setting, the value and the type it needs.
    """
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    from rlinf_embodied.config import field_type_name

    schema = OmegaConf.structured(family.config_class())
    typed = {}
    for key, value in req.env_overrides.items():
        try:
            typed[key] = OmegaConf.to_container(OmegaConf.merge(schema, {key: value}))[key]
        except OmegaConfBaseException:
            kind = field_type_name(family.config_class(), key)
            raise EvalError(f"--env-override {key}={value!r}: {key} must be {kind} "
                            f"(e.g. --env-override {key}={_example(schema[key])}).") from None
    return typed


def _example(default: Any) -> str:
    """A ``--env-override`` value in YAML shaped like a setting's default."""
    import yaml
    from omegaconf import OmegaConf

    if OmegaConf.is_config(default):
        default = OmegaConf.to_container(default)
    if default == {}:
        return "'{NAME: VALUE}'"
    if default == []:
        return "'[A, B]'"
    text = yaml.safe_dump(default, default_flow_style=True).strip()
    return text[:-4].strip() if text.endswith("...") else text


FLAG_ENV_SETTINGS = {"num_envs": "--num-envs", "num_processes": "--num-processes", "video": "--video"}
"""Env settings that eval sets from its own flags, so ``--env-override`` refuses them."""


def checked_env_config(family: EnvFamily, req: EvalRequest, *args) -> Any:
    """``family.env_config(*args)``, with ``req.env_overrides`` checked first: unknown names
    and what the env config's own check refuses (``check_available``: e.g. a gym id or
    ``kwargs`` its constructor does not take).

    Raises:
        EvalError: naming the setting and the valid ones.
    """
    from rlinf_embodied.config import ConfigError

    flagged = sorted(set(req.env_overrides) & set(FLAG_ENV_SETTINGS))
    if flagged:
        raise EvalError(f"--env-override {flagged[0]}: set it with {FLAG_ENV_SETTINGS[flagged[0]]} "
                        "instead (an override would silently win over the flag).")
    names = {f.name for f in dataclasses.fields(family.config_class())}
    bad = sorted(set(req.env_overrides) - names)
    if bad:
        raise EvalError(f"--env-override {', '.join(bad)}: not a {req.env} env setting; valid: "
                        f"{', '.join(sorted(names - {'type'}))}.")
    req = family.req = dataclasses.replace(req, env_overrides=_typed_overrides(family, req))
    try:
        cfg = family.env_config(*args)
        if req.env_factory is None and hasattr(cfg, "check_available"):
            cfg.check_available()
    except ConfigError as e:
        raise EvalError(str(e)) from None
    except ImportError:  # the simulator is not installed: building the env says how to install it
        pass
    return cfg
