"""Whether ``--policy`` fits the evaluation, decided from its files and the request alone.

:func:`check_source` refuses what the SOURCE and the policy flags say by themselves (a
``--checkpoint`` for a source that is no run, an unknown ``--policy-type``, a published VLA or
a checkpoint of another type); :func:`check_policy_fits` compares a checkpoint's saved
SpaceSpec with what the EnvConfig alone fixes of the env's spaces
(:func:`predicted_env_shapes`: LIBERO's 7-dim actions and 8-dim states, the image size of
either simulator, no images in ``state`` mode). :func:`~rlinf_embodied.eval.run.evaluate` runs
both before it builds an env (a LIBERO env takes most of a minute to come up), so a policy
trained for another env type, control mode or image size is refused in one line naming the fix.
What only the built env knows (a ManiSkill controller's action dim, a gym env's spaces) is
checked again when the policy is loaded (:mod:`rlinf_embodied.eval.sources`), with the same
words (:func:`spec_problems`, :func:`mismatch_error`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional

from rlinf_embodied.eval.policy_files import (
    PolicySourceError,
    check_checkpoint_choice,
    find_checkpoint,
    vla_type,
)

__all__ = ["check_source", "vla_kind", "predicted_env_shapes", "spec_problems", "mismatch_error",
           "training_env_hint", "check_policy_fits", "type_error"]


def _is_checkpoint_source(path: Path) -> bool:
    """A directory that is no published VLA (``config.json``): a checkpoint or a run."""
    return path.is_dir() and not (path / "config.json").is_file()


def check_source(source: str, expected_type: Optional[str], checkpoint: str = "latest") -> None:
    """What ``--policy SOURCE``, ``--policy-type`` and ``--checkpoint`` refuse by themselves.

    Raises:
        PolicySourceError: ``checkpoint`` other than ``latest`` for a source that is no run
            directory (or not one of :data:`RUN_CHECKPOINTS`), an ``expected_type`` that is no
            policy type, or one given with ``random``.
    """
    path = Path(source).expanduser()
    if checkpoint != "latest" and not _is_checkpoint_source(path):
        check_checkpoint_choice(checkpoint)
        raise PolicySourceError(
            f"--checkpoint {checkpoint} selects a checkpoint of a training run directory; "
            f"--policy {source} is none. Pass a run directory or drop --checkpoint."
        )
    if expected_type is not None:
        from rlinf_embodied.policies.registry import policy_types

        if expected_type not in (*policy_types(), "random"):
            raise PolicySourceError(f"--policy-type {expected_type!r} is no policy type; valid: "
                                    f"{', '.join(sorted(policy_types()))}, random.")
    if source == "random" and expected_type not in (None, "random"):
        raise PolicySourceError(f"--policy random acts at random; it has no policy type "
                                f"({expected_type}): leave out --policy-type.")


def vla_kind(path: Path, expected_type: Optional[str]) -> str:
    """The policy type of the published VLA directory ``path`` under ``--policy-type``.

    Raises:
        PolicySourceError: ``expected_type`` is another type than the directory holds.
    """
    kind = vla_type(path)
    if expected_type == "openvla_oft" and kind == "openvla":
        # No head files: a discrete-token OFT model (the SFT checkpoints RL systems start from)
        # is laid out like OpenVLA; --policy-type says which it is.
        kind = "openvla_oft"
    if expected_type is not None and expected_type != kind:
        raise PolicySourceError(
            f"{path} is a published {kind} checkpoint but --policy-type is {expected_type}; "
            f"pass --policy-type {kind} or the matching checkpoint."
        )
    return kind


def predicted_env_shapes(env_cfg: Any) -> Dict[str, Any]:
    """What the env built from ``env_cfg`` will report, where its config alone fixes it.

    Keys, each present only when known: ``action_dim`` with ``discrete``; ``states`` (its
    shape); ``main_images`` ((H, W, 3), or None for none). LIBERO: 7-dim Box actions, 8-dim
    states, ``image_size`` images in ``rgb`` mode (``envs/libero.py``). ManiSkill: images of
    ``sensor_size`` in ``rgb`` mode, none in ``state`` mode without ``render_images``, a
    suite's 8-dim states; its action dim depends on the robot's controller. Other env types:
    nothing.
    """
    kind = getattr(env_cfg, "type", None)
    rgb = getattr(env_cfg, "obs_mode", None) == "rgb"
    out: Dict[str, Any] = {}
    if kind == "libero":
        size = int(env_cfg.image_size)
        out.update(action_dim=7, discrete=False, states=(8,),
                   main_images=(size, size, 3) if rgb else None)
    elif kind == "maniskill":
        size = int(env_cfg.sensor_size)
        if rgb:
            out["main_images"] = (size, size, 3)
        elif not getattr(env_cfg, "render_images", False):
            out["main_images"] = None
        if getattr(env_cfg, "suite", None) is not None:
            out["states"] = (8,)
    return out


def spec_problems(have: Any, env: Mapping[str, Any]) -> List[str]:
    """How the policy's SpaceSpec ``have`` differs from the env's spaces ``env`` (keys as
    :func:`predicted_env_shapes`; a missing key is not compared): ``"action dim 8 (env: 7)"``,
    ``"state dim ..."``, ``"image shape ..."``; empty when nothing differs."""
    problems = []
    if "action_dim" in env and (have.action_dim != env["action_dim"]
                                or have.discrete != env["discrete"]):
        problems.append(f"action dim {have.action_dim} (env: {env['action_dim']})")
    if "states" in env:
        state_dim = int(env["states"][0]) if env["states"] else 0
        if have.state_dim and have.state_dim != state_dim:
            problems.append(f"state dim {have.state_dim} (env: {state_dim})")
    if "main_images" in env and have.image_shape:
        shape = tuple(env["main_images"]) if env["main_images"] is not None else None
        if have.image_shape != shape:
            problems.append(f"image shape {have.image_shape} (env: {shape})")
    return problems


def _task_flag(env: Mapping[str, Any]) -> str:
    """``--suite SUITE`` or ``--task ENV_ID`` of a run's env settings ("" with neither)."""
    for key, flag in (("suite", "--suite"), ("env_id", "--task")):
        if env.get(key):
            return f"{flag} {env[key]}"
    return ""


def training_env_hint(ckpt: Path, env_type: Optional[str] = None,
                      evaluated: Optional[Mapping[str, Any]] = None) -> str:
    """``": --env-override control_mode=... --env-override sensor_size=... --obs-mode ..."``
    (LIBERO: ``--image-size N``) from the env settings saved beside a checkpoint
    (:func:`~rlinf_embodied.eval.request.run_env_config`); "" without any. When the run's env
    type is not ``env_type`` (the one evaluated), ``": --env TYPE --task ENV_ID"`` (or
    ``--suite``) instead: the other settings belong to that env type. When the type is the same
    but the run's suite / task is not the evaluated one (``evaluated``: its ``suite`` and
    ``env_id``), that flag comes first: the other settings are applied already."""
    from rlinf_embodied.eval.request import run_env_config

    env, _ = run_env_config(str(ckpt))
    trained = env.get("type")
    if trained and env_type and trained != env_type:
        return ": " + " ".join(f for f in (f"--env {trained}", _task_flag(env)) if f)
    flags = []
    if evaluated is not None and _task_flag(env) and _task_flag(env) != _task_flag(evaluated):
        flags.append(_task_flag(env) + (" (without --suite)" if env.get("env_id") and
                                        evaluated.get("suite") else ""))
    flags += [f"--env-override {k}={env[k]}" for k in ("control_mode", "sensor_size")
              if env.get(k) is not None]
    if env.get("image_size") is not None:  # LIBERO: the protocol's size unless --image-size
        flags.append(f"--image-size {env['image_size']}")
    if env.get("obs_mode"):
        flags.append(f"--obs-mode {env['obs_mode']}")
    return (": " + " ".join(flags)) if flags else ""


def mismatch_error(ckpt: Path, policy_type: Any, problems: List[str],
                   env_type: Optional[str], evaluated: Optional[Mapping[str, Any]] = None
                   ) -> PolicySourceError:
    """The one-line refusal of a checkpoint that does not match the env: what differs and the
    flags of the env it was trained on (:func:`training_env_hint`; ``evaluated``: the suite
    and env id evaluated)."""
    return PolicySourceError(
        f"Checkpoint {ckpt} ({policy_type} policy) does not match this env: it was built for "
        f"{', '.join(problems)}. Evaluate it on the env and obs mode it was trained on"
        f"{training_env_hint(ckpt, env_type, evaluated)}."
    )


def check_policy_fits(source: str, env_cfg: Any, env_type: Optional[str],
                      expected_type: Optional[str] = None, checkpoint: str = "latest") -> None:
    """Refuse, before any env is built, a ``--policy`` that cannot run on the env of
    ``env_cfg``: :func:`check_source`; a published VLA of another type (:func:`vla_kind`); a
    checkpoint that is incomplete, of another type than ``expected_type``, or whose saved spaces
    differ from :func:`predicted_env_shapes` (:func:`spec_problems`). ``random`` and
    ``module:function`` sources pass (they adapt to the env).

    Raises:
        PolicySourceError: one line naming the fix (the flags of the env the checkpoint was
            trained on, the ``--policy-type`` it holds).
    """
    check_source(source, expected_type, checkpoint)
    path = Path(source).expanduser()
    if not path.is_dir():
        return
    if (path / "config.json").is_file():
        vla_kind(path, expected_type)
        return
    import yaml

    from rlinf_embodied.policies.base import SpaceSpec
    from rlinf_embodied.policies.registry import (
        CONFIG_FILE,
        SPEC_FILE,
        PolicyCheckpointError,
        PolicyTypeError,
        check_checkpoint,
    )

    ckpt = find_checkpoint(path, checkpoint)
    try:
        check_checkpoint(ckpt, expected_type)
        have = SpaceSpec.from_dict(yaml.safe_load((ckpt / SPEC_FILE).read_text()) or {})
        saved_type = (yaml.safe_load((ckpt / CONFIG_FILE).read_text()) or {}).get("type")
    except PolicyTypeError as e:  # named as the eval flag, not the training config key
        raise type_error(ckpt, e) from None
    except PolicyCheckpointError as e:
        raise PolicySourceError(str(e)) from None
    except (OSError, ValueError, yaml.YAMLError):
        return  # an unreadable spec: loading the policy says what is wrong with it
    problems = spec_problems(have, predicted_env_shapes(env_cfg))
    if problems:
        raise mismatch_error(ckpt, saved_type, problems, env_type,
                             {k: getattr(env_cfg, k, None) for k in ("suite", "env_id")})


def type_error(ckpt: Path, e: Any) -> PolicySourceError:
    """A checkpoint of another type than ``--policy-type`` (``e``: the registry's
    PolicyTypeError), named with the eval flag."""
    return PolicySourceError(f"Checkpoint {ckpt} holds a {e.saved_type!r} policy, not --policy-type "
                             f"{e.expected_type}: pass --policy-type {e.saved_type}, or drop the flag.")
