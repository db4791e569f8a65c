"""LIBERO adapter: stored initial states by id, task order, proprio state, images."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from rlinf_embodied.envs.configuration_libero import LiberoEnvConfig
from rlinf_embodied.envs import make_env

from .conftest import HAS_LIBERO

pytestmark = [pytest.mark.libero,
              pytest.mark.skipif(not HAS_LIBERO, reason="needs the libero extra")]


def package_suite(name):
    from libero.libero import benchmark

    return benchmark.get_benchmark_dict()[name]()


def test_quat_to_axis_angle():
    from rlinf_embodied.envs.libero import quat_to_axis_angle

    s = np.sin(np.pi / 4)
    assert np.allclose(quat_to_axis_angle(np.array([0, 0, s, s])), [0, 0, np.pi / 2])
    assert np.allclose(quat_to_axis_angle(np.array([0, 0, 0, 1.0])), 0)


def test_robosuite_macro_file_advice_is_dropped_and_other_warnings_pass():
    import subprocess
    import sys

    code = ("import logging\n"
            "from rlinf_embodied.envs.libero import libero_tasks\n"
            "libero_tasks('libero_spatial')\n"
            "logging.getLogger('robosuite_logs').warning('controller config not found')\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    assert "macro file" not in p.stderr and "setup_macros" not in p.stderr
    assert "controller config not found" in p.stderr


def test_tasks_follow_the_suite_order():
    from rlinf_embodied.envs.libero import libero_tasks

    ours = libero_tasks("libero_10")
    theirs = package_suite("libero_10")
    assert [t.name for t in ours] == theirs.get_task_names()
    assert len(libero_tasks("libero_90")) == 90


def test_initial_states_are_used_by_id_exactly_as_stored():
    stored = package_suite("libero_spatial").get_task_init_states(0)
    env = make_env("libero/libero_spatial", num_envs=2, obs_mode="state", num_processes=0,
                   num_settle_steps=0)
    try:
        obs, info = env.reset(options={"init_state_ids": [3, 7]})
        sims = env.env_method("get_sim_states")
        assert np.array_equal(sims[0], stored[3]) and np.array_equal(sims[1], stored[7])
        assert env.env_method("get_init_state_ids") == [3, 7]
        assert obs["states"].shape == (2, 8) and info["elapsed_steps"].tolist() == [0, 0]
        # default ids: env i starts from state seed + i, then + N per episode
        env.reset(seed=10)
        assert env.env_method("get_init_state_ids") == [10, 11]
        env.reset(env_ids=[1])
        assert env.env_method("get_init_state_ids") == [10, 13]
        assert np.array_equal(env.env_method("get_sim_states", env_ids=[1])[0], stored[13])
        # proprio: eef pos (3) + axis angle (3) + gripper qpos (2)
        assert torch.all(obs["states"][:, 6] > 0) and torch.all(obs["states"][:, 7] < 0)
        with pytest.raises(ValueError, match="outside the 50 stored states"):
            env.reset(env_ids=[0], options={"init_state_ids": [50]})
    finally:
        env.close()


def test_images_and_flip():
    from rlinf_embodied.envs.libero import LiberoSubBatch

    raw = {"robot0_eef_pos": np.zeros(3), "robot0_eef_quat": np.array([0, 0, 0, 1.0]),
           "robot0_gripper_qpos": np.zeros(2),
           "agentview_image": np.arange(4 * 4 * 3, dtype=np.uint8).reshape(4, 4, 3),
           "robot0_eye_in_hand_image": np.zeros((4, 4, 3), np.uint8)}
    sub = LiberoSubBatch.__new__(LiberoSubBatch)  # conversion only, no simulator
    sub._rgb = True
    for flip in (True, False):
        sub._cfg = LiberoEnvConfig(flip_images=flip)
        out = sub._obs([raw])
        want = raw["agentview_image"][::-1, ::-1] if flip else raw["agentview_image"]
        assert np.array_equal(out["main_images"][0], want)


def test_rgb_observations_are_256px():
    env = make_env("libero/libero_object", num_envs=1, num_processes=0, task_ids=[2])
    try:
        obs, _ = env.reset(seed=0)
        assert obs["main_images"].shape == (1, 256, 256, 3) and obs["main_images"].dtype == torch.uint8
        assert obs["wrist_images"].shape == (1, 256, 256, 3)
        assert obs["main_images"].float().std() > 10  # a rendered scene, not a blank frame
        assert obs["task_descriptions"][0] == package_suite("libero_object").get_task(2).language
        assert os.environ.get("MUJOCO_GL") in ("egl", "osmesa")
        obs, r, te, tr, info = env.step(np.array([[0, 0, 0, 0, 0, 0, -1.0]]))
        assert not info["success"].any() and r.tolist() == [0.0]
    finally:
        env.close()


def test_libero_root_is_honoured(tmp_path, monkeypatch):
    from libero.libero import get_libero_path

    from rlinf_embodied.envs.libero import libero_init_states

    pkg = os.path.dirname(get_libero_path("bddl_files").rstrip("/").replace("/./", "/"))
    for name in ("bddl_files", "init_files"):
        (tmp_path / name).symlink_to(os.path.join(pkg, name))
    # libero_root sets LIBERO_CONFIG_PATH in this process: make monkeypatch restore it after
    monkeypatch.setenv("LIBERO_CONFIG_PATH", "unset-after-test")
    monkeypatch.delenv("LIBERO_CONFIG_PATH")
    states = libero_init_states("libero_goal", 1, libero_root=str(tmp_path))
    assert get_libero_path("bddl_files") == str(tmp_path / "bddl_files")
    assert np.array_equal(states, package_suite("libero_goal").get_task_init_states(1))
    with pytest.raises(FileNotFoundError, match="bddl_files"):
        make_env("libero/libero_goal", libero_root=str(tmp_path / "missing"))
