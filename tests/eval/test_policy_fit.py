"""A checkpoint that cannot run on the evaluated env is refused before the env is built.

Every evaluation here gets an ``env_factory`` that raises :class:`EnvBuilt`: a refusal that
comes as a PolicySourceError was decided from the policy's files and the request alone; one
that the fix lets through reaches the factory (the env would be built next).
"""

import pytest
from rlinf_embodied.eval.policy_files import PolicySourceError
from rlinf_embodied.eval.policy_fit import predicted_env_shapes
from rlinf_embodied.eval.request import EvalRequest
from rlinf_embodied.eval.run import evaluate


class EnvBuilt(Exception):
    """The evaluation got as far as building its env."""


def _no_env(cfg):
    raise EnvBuilt(cfg)


def _save(directory, spec_kw, cnn=False):
    from rlinf_embodied.policies.base import SpaceSpec
    from rlinf_embodied.policies.configuration_actor_critic import CNNPolicyConfig, MLPPolicyConfig
    from rlinf_embodied.policies.registry import build_policy, save_policy

    spec = SpaceSpec(**spec_kw)
    cfg = (CNNPolicyConfig(hidden_sizes=[8], conv_channels=[4], conv_kernels=[8], conv_strides=[8],
                           image_feature_dim=8, state_feature_dim=8) if cnn
           else MLPPolicyConfig(hidden_sizes=[4]))
    save_policy(build_policy(cfg, spec), directory)
    return directory


def _run(tmp_path, env_yaml, spec_kw, cnn=False):
    """A training run directory as the runner writes it: config.yaml and checkpoints/."""
    from rlinf_embodied.checkpoint import checkpoint_dir

    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text(f"env: {env_yaml}\n")
    with checkpoint_dir(run, "iter_000001") as d:
        _save(d / "policy", spec_kw, cnn)
    return run


def _req(tmp_path, policy, **kw):
    return EvalRequest(**{"env": None, "policy": str(policy), "trials_per_task": 1, "num_envs": 1,
                          "num_processes": 0, "output": str(tmp_path / "r.json"), "reports": False,
                          "env_factory": _no_env, **kw})


LIBERO_CNN = dict(action_low=[-1.0] * 7, action_high=[1.0] * 7, state_dim=8,
                  image_shape=(64, 64, 3))


def test_libero_run_at_another_image_size_is_refused_before_the_env(tmp_path):
    pytest.importorskip("libero")
    run = _run(tmp_path, "{type: libero, suite: libero_spatial, image_size: 64, obs_mode: rgb}",
               LIBERO_CNN, cnn=True)
    with pytest.raises(PolicySourceError) as e:  # the protocol's 256 px: no env built
        evaluate(_req(tmp_path, run, tasks=[0]))
    msg = str(e.value)
    assert "\n" not in msg
    assert "does not match this env: it was built for image shape (64, 64, 3) (env: (256, 256, 3))" in msg
    assert msg.endswith("trained on: --image-size 64 --obs-mode rgb.")
    assert not (tmp_path / "r.json").exists()
    with pytest.raises(EnvBuilt) as built:  # the fix named: the env is built at 64 px
        evaluate(_req(tmp_path, run, tasks=[0], image_size=64))
    assert built.value.args[0].image_size == 64 and built.value.args[0].suite == "libero_spatial"


def test_maniskill_run_on_libero_is_refused_before_the_env(tmp_path):
    pytest.importorskip("libero")
    run = _run(tmp_path, "{type: maniskill, env_id: PushCube-v1, obs_mode: state}",
               dict(action_low=[-1.0] * 8, action_high=[1.0] * 8, state_dim=25))
    with pytest.raises(PolicySourceError) as e:
        evaluate(_req(tmp_path, run, env="libero", suite="libero_spatial", tasks=[0]))
    assert str(e.value) == (
        f"Checkpoint {run}/checkpoints/iter_000001/policy (mlp policy) does not match this env: "
        "it was built for action dim 8 (env: 7), state dim 25 (env: 8). Evaluate it on the env "
        "and obs mode it was trained on: --env maniskill --task PushCube-v1.")


def test_image_checkpoint_on_maniskill_is_refused_before_the_env(tmp_path):
    ckpt = _save(tmp_path / "ckpt", dict(action_low=[-1.0] * 7, action_high=[1.0] * 7,
                                         state_dim=9, image_shape=(64, 64, 3)), cnn=True)
    base = dict(env="maniskill", task="PushCube-v1")
    with pytest.raises(PolicySourceError, match=r"built for image shape \(64, 64, 3\) "
                                                r"\(env: \(128, 128, 3\)\)\. Evaluate"):
        evaluate(_req(tmp_path, ckpt, **base))  # the env's default 128 px camera
    with pytest.raises(PolicySourceError, match=r"built for image shape \(64, 64, 3\) \(env: None\)"):
        evaluate(_req(tmp_path, ckpt, obs_mode="state", **base))  # no images at all
    with pytest.raises(EnvBuilt) as built:  # its size: the controller's action dim is the env's
        evaluate(_req(tmp_path, ckpt, env_overrides={"sensor_size": 64}, **base))
    assert built.value.args[0].sensor_size == 64 and built.value.args[0].obs_mode == "rgb"


def test_policy_type_is_checked_before_the_env(tmp_path):
    ckpt = _save(tmp_path / "ckpt", dict(action_low=[-1.0, -1.0], action_high=[1.0, 1.0],
                                         state_dim=4))
    base = dict(env="gym", task="toy/PointReach-v0")
    with pytest.raises(PolicySourceError, match=r"holds a 'mlp' policy, not --policy-type cnn: "
                                                r"pass --policy-type mlp, or drop the flag\.$"):
        evaluate(_req(tmp_path, ckpt, policy_type="cnn", **base))
    with pytest.raises(PolicySourceError, match="--checkpoint best selects a checkpoint of a "
                                                "training run directory"):
        evaluate(_req(tmp_path, ckpt, checkpoint="best", **base))
    with pytest.raises(EnvBuilt):  # a gym env's spaces are known once it is built
        evaluate(_req(tmp_path, ckpt, policy_type="mlp", **base))


def test_predicted_env_shapes():
    from rlinf_embodied.envs.configuration_libero import LiberoEnvConfig
    from rlinf_embodied.envs.configuration_maniskill import ManiSkillEnvConfig

    assert predicted_env_shapes(LiberoEnvConfig(suite="libero_spatial", obs_mode="rgb", image_size=224)) == {
        "action_dim": 7, "discrete": False, "states": (8,), "main_images": (224, 224, 3)}
    assert predicted_env_shapes(LiberoEnvConfig(suite="libero_spatial", obs_mode="state"))["main_images"] is None
    assert predicted_env_shapes(ManiSkillEnvConfig(obs_mode="rgb", sensor_size=96)) == {
        "main_images": (96, 96, 3)}
    # a state policy filmed by the human camera: its frames are main_images of unknown use
    assert predicted_env_shapes(ManiSkillEnvConfig(obs_mode="state", render_images=True)) == {}
    assert predicted_env_shapes(ManiSkillEnvConfig(suite="maniskill_lang3", obs_mode="rgb",
                                                   sensor_size=64)) == {
        "main_images": (64, 64, 3), "states": (8,)}


def test_a_run_of_another_task_is_pointed_at_its_task(tmp_path):
    """Same env type, another task or suite: the hint names the run's task first (its control
    mode and obs mode are applied already, so repeating only them would not fix anything)."""
    from rlinf_embodied.eval.policy_fit import training_env_hint

    run = _run(tmp_path, "{type: maniskill, env_id: PushCube-v1, obs_mode: state, "
                         "control_mode: pd_joint_delta_pos}",
               dict(action_low=[-1.0] * 8, action_high=[1.0] * 8, state_dim=35))
    with pytest.raises(PolicySourceError) as e:  # the suite's 8-dim states: known before the env
        evaluate(_req(tmp_path, run, env="maniskill", suite="maniskill_lang3", tasks=[0]))
    assert str(e.value).endswith(
        "built for state dim 35 (env: 8). Evaluate it on the env and obs mode it was trained on: "
        "--task PushCube-v1 (without --suite) --env-override control_mode=pd_joint_delta_pos "
        "--obs-mode state.")
    ckpt = run / "checkpoints" / "iter_000001" / "policy"
    # another task of the same env type (its state dim is known once the env is built)
    assert training_env_hint(ckpt, "maniskill", {"suite": None, "env_id": "PickCube-v1"}) == (
        ": --task PushCube-v1 --env-override control_mode=pd_joint_delta_pos --obs-mode state")
    assert training_env_hint(ckpt, "maniskill", {"suite": None, "env_id": "PushCube-v1"}) == (
        ": --env-override control_mode=pd_joint_delta_pos --obs-mode state")
