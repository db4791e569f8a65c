"""A cnn policy whose conv stack outgrows the env's images is refused before Ray starts."""

import dataclasses
from pathlib import Path

import pytest
from rlinf_embodied.policies import SpaceSpec, build_policy

from rlinf_embodied.config import ConfigError, config_class, load_config
from rlinf_embodied.policies.configuration_actor_critic import CNNPolicyConfig
from rlinf_embodied.runners.setup import check_image_policy, validate_job

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
MANISKILL_CNN = ["policy.type=cnn", "env.obs_mode=rgb"]
BOX = {"action_low": [-1.0], "action_high": [1.0]}


def test_validate_job_names_size_layer_and_fix():
    cfg = load_config(CONFIGS / "maniskill_pushcube_ppo_mlp.yaml",
                      [*MANISKILL_CNN, "env.sensor_size=16"])
    with pytest.raises(ConfigError) as e:
        validate_job(cfg)  # NatureCNN 8/4/3, strides 4/2/1: 16 -> 3 px, under layer 2's kernel 4
    assert str(e.value) == (
        "env.sensor_size=16 gives 16x16 px images, too small for the cnn policy: conv layer 2 "
        "of 3 (policy.conv_kernels[1]=4, policy.conv_strides[1]=2) gets 3x3 px, smaller than "
        "its kernel, so its output drops below 1 px; set env.sensor_size to at least 36, or use "
        "fewer layers or smaller kernels/strides (policy.conv_channels, policy.conv_kernels, "
        "policy.conv_strides)."
    )
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("kernels,strides,smallest", [([8, 4, 3], [4, 2, 1], 36),
                                                      ([3, 3], [2, 2], 7), ([5], [3], 5)])
def test_min_image_size_matches_the_network(kernels, strides, smallest):
    pc = CNNPolicyConfig(conv_channels=[4] * len(kernels), conv_kernels=kernels,
                         conv_strides=strides, image_feature_dim=8, state_feature_dim=8,
                         hidden_sizes=[8])
    assert pc.min_image_size() == smallest
    pc.check_image_size(smallest, "env.sensor_size")  # passes, and the network builds
    build_policy(pc, SpaceSpec(**BOX, image_shape=(smallest, smallest, 3)))
    with pytest.raises(ConfigError, match=f"env.sensor_size={smallest - 1} gives"):
        pc.check_image_size(smallest - 1, "env.sensor_size")
    with pytest.raises(ValueError, match="too small"):  # the worker-side check agrees
        build_policy(pc, SpaceSpec(**BOX, image_shape=(smallest - 1, smallest - 1, 3)))


def test_check_names_the_envs_key_and_skips_unknown_sizes():
    cfg = load_config(CONFIGS / "maniskill_pushcube_ppo_mlp.yaml",
                      [*MANISKILL_CNN, "env.sensor_size=36"])
    check_image_policy(cfg)  # the smallest size NatureCNN takes
    state = dataclasses.replace(cfg, env=dataclasses.replace(cfg.env, obs_mode="state",
                                                             sensor_size=7))
    with pytest.raises(ConfigError, match=r"^policy.type=cnn reads camera images but "
                                          r"env.obs_mode=state gives none; set env.obs_mode=rgb"):
        check_image_policy(state)  # no camera images at all
    with pytest.raises(ConfigError, match=r"^env.sensor_size=7 gives 7x7 px images.*layer 1 of 3.*gets 7x7"):
        check_image_policy(dataclasses.replace(
            state, env=dataclasses.replace(state.env, render_images=True)))
    libero = dataclasses.replace(cfg, env=config_class("env", "libero")(image_size=32))
    with pytest.raises(ConfigError, match=r"^env.image_size=32 gives 32x32 px images.*at least 36"):
        check_image_policy(libero)
    gym_cfg = load_config(CONFIGS / "gym_pointreach_ppo_mlp.yaml", ["policy.type=cnn"])
    check_image_policy(gym_cfg)  # the gym env decides its image size: nothing to check here
