"""Chunks skip the observations of their inner steps (ManiSkill renders only after the chunk).

A ManiSkill chunk of K steps renders the camera once: ``SubBatch.step_unobserved`` for the
first K - 1 steps, ``observe`` for an episode that ends inside the chunk. What the policy and
the learner see must not change: the same rewards, flags and final observations as K observed
single steps, on real ManiSkill envs of the language-conditioned suite (every task).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from .conftest import HAS_LIBERO, HAS_MANISKILL

pytestmark = pytest.mark.skipif(not HAS_MANISKILL, reason="needs mani_skill")

K, LIMIT = 4, 6  # the second chunk ends after 2 of its 4 steps (time limit)


def _suite_env(num_processes: int):
    from rlinf_embodied.config import config_class
    from rlinf_embodied.envs import make_env

    cfg = config_class("env", "maniskill")(suite="maniskill_lang3", obs_mode="rgb", num_envs=3,
                                           num_processes=num_processes, sensor_size=32,
                                           control_mode="pd_ee_delta_pose",
                                           reward_mode="normalized_dense",
                                           max_episode_steps=LIMIT)
    return make_env(cfg)


def test_chunk_equals_observed_single_steps():
    rng = np.random.default_rng(0)
    acts = torch.as_tensor(rng.uniform(-1, 1, (3, 2 * K, 7)), dtype=torch.float32)
    single, chunked = _suite_env(0), _suite_env(1)  # the chunked env through a pool worker
    try:
        single.reset(seed=3)  # env i: task (3 + i) % 3, so every task is stepped
        chunked.reset(seed=3)
        obs_1, rew_1, done_1, info_1 = [], [], [], []
        for t in range(LIMIT):
            obs, rew, te, tr, info = single.step(acts[:, t])
            obs_1.append(obs)
            rew_1.append(rew)
            done_1.append(te | tr)
            info_1.append(info)
        assert done_1[-1].all() and not torch.stack(done_1[:-1]).any()

        obs, rew, te, tr, info = chunked.chunk_step(acts[:, :K])
        assert torch.equal(rew, torch.stack(rew_1[:K], 1))
        assert not (te | tr).any()
        for key in ("main_images", "states"):
            assert torch.equal(obs[key], obs_1[K - 1][key]), key
        assert obs["task_descriptions"] == obs_1[K - 1]["task_descriptions"]

        # the time limit ends every episode at step 2 of the second chunk: its last
        # observation is taken where the episode ended (observe), not after an earlier step
        obs, rew, te, tr, info = chunked.chunk_step(acts[:, K:])
        assert info["num_substeps"].tolist() == [LIMIT - K] * 3
        assert torch.equal(rew[:, : LIMIT - K], torch.stack(rew_1[K:], 1))
        assert tr[:, LIMIT - K - 1].all() and (rew[:, LIMIT - K:] == 0).all()
        for key in ("main_images", "states"):
            assert torch.equal(obs[key], obs_1[-1][key]), key
        assert not torch.equal(obs_1[-1]["main_images"], obs_1[K - 1]["main_images"])
        assert torch.equal(info["success"], info_1[-1]["success"])
        assert torch.equal(info["success_once"], info_1[-1]["success_once"])
    finally:
        single.close()
        chunked.close()


def test_step_without_obs_matches_env_step():
    """Reward, flags and info of the unobserved step equal ManiSkill's own step, and the
    observation taken afterwards equals the one the observed step returns."""
    from rlinf_embodied.envs.maniskill import ManiSkillSuiteSubBatch
    from rlinf_embodied.config import config_class

    cfg = config_class("env", "maniskill")(suite="maniskill_lang3", obs_mode="rgb", num_envs=3,
                                           sensor_size=32, control_mode="pd_ee_delta_pose",
                                           reward_mode="normalized_dense")
    a, b = ManiSkillSuiteSubBatch(cfg, [0, 1, 2]), ManiSkillSuiteSubBatch(cfg, [0, 1, 2])
    try:
        ids = np.arange(3)
        seeds = [10, 11, 12]  # tasks 1, 2, 0
        a.reset(ids, seeds, [{}] * 3)
        b.reset(ids, seeds, [{}] * 3)
        rng = np.random.default_rng(1)
        for _ in range(5):
            act = rng.uniform(-1, 1, (3, 7)).astype(np.float32)
            ta, tb = a.step(ids, act), b.step_unobserved(ids, act)
            assert tb.obs == {}
            np.testing.assert_array_equal(ta.reward, tb.reward)
            np.testing.assert_array_equal(ta.terminated, tb.terminated)
            np.testing.assert_array_equal(ta.success, tb.success)
            seen = b.observe(ids)
            for key in ta.obs:
                np.testing.assert_array_equal(ta.obs[key], seen.obs[key])
        assert np.abs(ta.reward).sum() > 0  # the dense reward was computed, not zeros
    finally:
        a.close()
        b.close()


def test_step_unobserved_without_observe_is_refused_at_class_definition():
    from rlinf_embodied.envs.base import SubBatch

    with pytest.raises(TypeError, match="overrides step_unobserved but not observe"):
        class Forgetful(SubBatch):  # noqa: F841
            def step_unobserved(self, local_ids, actions):
                raise AssertionError("never called")


@pytest.mark.skipif(not HAS_LIBERO, reason="needs libero")
def test_libero_chunk_renders_once_and_equals_observed_single_steps(monkeypatch):
    """LIBERO skips the cameras on a chunk's inner steps (robosuite renders in every step):
    the chunk's rewards and its final states and images equal those of K observed single
    steps to the bit, on real LIBERO envs (libero_spatial task 0, 32 px)."""
    from rlinf_embodied.envs import make_env
    from rlinf_embodied.envs.libero import LiberoSubBatch

    renders = []
    real = LiberoSubBatch.observe

    def counted(self, local_ids):
        renders.append(len(local_ids))
        return real(self, local_ids)

    monkeypatch.setattr(LiberoSubBatch, "observe", counted)
    from robosuite.utils.binding_utils import MjSim

    frames = []
    render = MjSim.render
    monkeypatch.setattr(MjSim, "render", lambda self, *a, **kw: frames.append(1) or render(self, *a, **kw))

    def libero():
        return make_env("libero/libero_spatial", num_envs=2, num_processes=0, image_size=32,
                        num_settle_steps=2, max_episode_steps=LIMIT)

    rng = np.random.default_rng(0)
    acts = torch.as_tensor(rng.uniform(-0.5, 0.5, (2, 2 * K, 7)), dtype=torch.float32)
    single, chunked = libero(), libero()
    try:
        single.reset(seed=0)
        chunked.reset(seed=0)
        steps = [single.step(acts[:, t]) for t in range(LIMIT)]
        frames.clear()
        obs, rew, te, tr, info = chunked.chunk_step(acts[:, :K])
        assert not (te | tr).any() and renders == []
        assert len(frames) == 2 * 2  # 2 envs x 2 cameras, once per chunk (not K times)
        assert torch.equal(rew, torch.stack([s[1] for s in steps[:K]], 1))
        for key in ("main_images", "wrist_images", "states"):
            assert torch.equal(obs[key], steps[K - 1][0][key]), key
        assert not torch.equal(obs["main_images"], steps[0][0]["main_images"])  # the arm moved

        # the time limit ends both episodes at step 2 of the second chunk: their observations
        # are taken there (observe), where the arm is, not where the chunk's first step left it
        obs, rew, te, tr, info = chunked.chunk_step(acts[:, K:])
        assert renders == [2] and info["num_substeps"].tolist() == [LIMIT - K] * 2
        assert tr[:, LIMIT - K - 1].all()
        ended, before = steps[-1][0]["states"], steps[K][0]["states"]
        assert (obs["states"] - ended).abs().max() < (obs["states"] - before).abs().max()
    finally:
        single.close()
        chunked.close()
