"""Exact-value tests of the BatchedEnv semantics on the deterministic toy envs (in-process)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rlinf_embodied.config import load_config
from rlinf_embodied.envs.configuration_gym import GymEnvConfig
from rlinf_embodied.envs import AutoresetMode, EnvError, make_env
from rlinf_embodied.envs.base import EnvWarning


def countdown(num_envs=3, length=3, **fields):
    kwargs = {"length": length, **fields.pop("kwargs", {})}
    return make_env("toy/Countdown-v0", num_envs=num_envs, kwargs=kwargs, **fields)


def t_of(obs):
    return obs["states"][:, 0].tolist()


def test_next_step_autoreset_returns_final_obs_then_resets():
    env = countdown(autoreset_mode="next_step")
    assert env.autoreset_mode is AutoresetMode.NEXT_STEP
    obs, info = env.reset(seed=0)
    assert t_of(obs) == [0, 0, 0]
    for t in (1, 2):
        obs, r, te, tr, info = env.step(np.zeros((3, 1)))
        assert t_of(obs) == [t] * 3 and r.tolist() == [t] * 3 and not te.any()
    obs, r, te, tr, info = env.step(np.zeros((3, 1)))
    assert t_of(obs) == [3] * 3 and te.all() and not tr.any()  # final observation kept
    assert info["success"].all() and info["success_once"].all()
    obs, r, te, tr, info = env.step(np.zeros((3, 1)))  # the autoreset step
    assert info["autoreset"].all() and t_of(obs) == [0] * 3
    assert r.tolist() == [0] * 3 and not (te | tr).any() and not info["success"].any()
    obs, r, *_ = env.step(np.zeros((3, 1)))
    assert t_of(obs) == [1] * 3 and r.tolist() == [1] * 3
    env.close()


def test_same_step_autoreset_puts_final_obs_in_info():
    env = countdown(autoreset_mode="same_step")
    env.reset(seed=0)
    env.step(np.zeros((3, 1)))
    env.step(np.zeros((3, 1)))
    obs, r, te, tr, info = env.step(np.zeros((3, 1)))
    assert te.all() and t_of(obs) == [0] * 3
    assert info["final_obs"]["states"][:, 0].tolist() == [3] * 3
    assert info["success"].all() and info["elapsed_steps"].tolist() == [3] * 3
    obs, r, te, tr, info = env.step(np.zeros((3, 1)))
    assert t_of(obs) == [1] * 3 and not info["autoreset"].any()
    env.close()


def test_disabled_autoreset_requires_explicit_reset():
    env = countdown(autoreset_mode="disabled")
    env.reset(seed=0)
    for _ in range(3):
        *_, info = env.step(np.zeros((3, 1)))
    with pytest.raises(EnvError, match="reset\\(env_ids="):
        env.step(np.zeros((3, 1)))
    obs, _ = env.reset(env_ids=[0, 1, 2])
    assert t_of(obs) == [0] * 3
    env.close()


def test_ignore_terminations_runs_fixed_length_episodes():
    env = countdown(ignore_terminations=True, max_episode_steps=5)
    env.reset(seed=0)
    for t in range(1, 6):
        obs, r, te, tr, info = env.step(np.zeros((3, 1)))
        assert not te.any() and r.tolist() == [t] * 3
        assert tr.all() == (t == 5)
        assert info["success_once"].all() == (t >= 3)
    env.close()


def test_ignore_terminations_fraction_fixes_the_first_envs_only():
    env = countdown(num_envs=4, ignore_terminations_fraction=0.5, max_episode_steps=5)
    env.reset(seed=0)
    for _ in range(2):
        env.step(np.zeros((4, 1)))
    obs, r, te, tr, info = env.step(np.zeros((4, 1)))
    assert te.tolist() == [False, False, True, True] and not tr.any()
    assert info["success"].all()
    obs, r, te, tr, info = env.step(np.zeros((4, 1)))
    # envs 0-1 go on past the termination; envs 2-3 autoreset
    assert t_of(obs) == [4, 4, 0, 0] and info["autoreset"].tolist() == [False, False, True, True]
    obs, r, te, tr, info = env.step(np.zeros((4, 1)))
    assert tr.tolist() == [True, True, False, False] and not te.any()
    env.close()
    with pytest.raises(Exception, match="ignore_terminations_fraction must be in"):
        countdown(ignore_terminations_fraction=1.5)


def test_success_hold_steps_ends_a_successful_episode_after_the_hold():
    # success and termination from t = 2 on (length 2); a hold of 3 ends the episode at t = 4
    env = countdown(num_envs=2, kwargs={"length": 2}, success_hold_steps=3, max_episode_steps=10)
    env.reset(seed=0)
    dones = []
    for t in range(1, 6):
        obs, r, te, tr, info = env.step(np.zeros((2, 1)))
        dones.append(te.tolist())
        if t <= 4:
            assert t_of(obs) == [t, t] and info["success"].tolist() == [t >= 2] * 2
    assert dones[:4] == [[False, False]] * 3 + [[True, True]] and not tr.any()
    assert info["autoreset"].all()  # t = 5 is the autoreset step
    env.close()
    # a termination without success ends the episode at once whatever the hold
    env = countdown(num_envs=1, kwargs={"length": 2, "success_at": 9}, success_hold_steps=3)
    env.reset(seed=0)
    assert [bool(env.step(np.zeros((1, 1)))[2][0]) for _ in range(2)] == [False, True]
    env.close()
    # a broken run of successes restarts the count; chunk steps count substeps
    env = countdown(num_envs=1, kwargs={"length": 2}, success_hold_steps=2)
    env.reset(seed=0)
    _, rew, te, tr, info = env.chunk_step(np.zeros((1, 5, 1)))
    assert te[0].tolist() == [False, False, True, False, False]
    assert info["num_substeps"].tolist() == [3]
    env.close()
    with pytest.raises(Exception, match="success_hold_steps must be >= 1"):
        countdown(success_hold_steps=0)


def test_the_success_hold_can_change_between_rollouts():
    # env.success_hold_ramp: the trainer sets the hold before each rollout's resets
    env = countdown(num_envs=1, kwargs={"length": 2}, max_episode_steps=10,
                    success_hold_steps=3, success_hold_ramp=[2, 4])
    ends = []
    for hold in (1, 3):
        env.set_success_hold_steps(hold)
        env.reset(seed=0)
        te = [bool(env.step(np.zeros((1, 1)))[2][0]) for _ in range(4)]
        ends.append(te.index(True) + 1)  # success from t = 2 on
    assert ends == [2, 4]
    with pytest.raises(ValueError, match="success hold must be >= 1 step"):
        env.set_success_hold_steps(0)
    env.close()


def test_chunk_step_stops_each_env_at_its_first_done():
    env = countdown(kwargs={"length": 10})
    env.reset(seed=0, options={"length": [2, 4, 10]})
    actions = torch.arange(15, dtype=torch.float32).reshape(3, 5, 1) / 100
    obs, rew, te, tr, info = env.chunk_step(actions)
    assert rew.shape == (3, 5) and te.shape == (3, 5) and rew.dtype == torch.float32
    assert rew.tolist() == [[1, 2, 0, 0, 0], [1, 2, 3, 4, 0], [1, 2, 3, 4, 5]]
    assert te.nonzero().tolist() == [[0, 1], [1, 3]]
    assert info["num_substeps"].tolist() == [2, 4, 5]
    assert t_of(obs) == [2, 4, 5]
    # the last executed action of each env reached it (obs[:, 2] echoes a0)
    assert obs["states"][:, 2].tolist() == pytest.approx([0.01, 0.08, 0.14])
    obs, rew, te, tr, info = env.chunk_step(torch.zeros(3, 5, 1))
    assert info["autoreset"].tolist() == [True, True, False]
    assert info["num_substeps"].tolist() == [0, 0, 5]
    assert rew[2].tolist() == [6, 7, 8, 9, 10] and te[2].tolist() == [False] * 4 + [True]
    assert t_of(obs) == [0, 0, 10]
    env.close()


def test_chunk_step_truncates_at_time_limit():
    env = countdown(kwargs={"length": 100}, max_episode_steps=3)
    env.reset(seed=0)
    _, rew, te, tr, info = env.chunk_step(np.zeros((3, 4, 1)))
    assert tr[:, 2].all() and not tr[:, 3].any() and not te.any()
    assert info["num_substeps"].tolist() == [3, 3, 3] and rew[:, 3].tolist() == [0, 0, 0]
    env.close()


def test_seeding_and_partial_reset():
    env = countdown()
    obs_a, _ = env.reset(seed=7)
    obs_b, _ = env.reset(seed=7)
    assert torch.equal(obs_a["states"], obs_b["states"])
    starts = obs_a["states"][:, 1]
    assert len(set(starts.tolist())) == 3  # env i is seeded with seed + i
    env.step(np.zeros((3, 1)))
    env.reset(env_ids=[2], seed=11)
    after_step, *_ = env.step(np.zeros((3, 1)))
    obs, info = env.reset(env_ids=[1])
    assert torch.equal(obs["states"][[0, 2]], after_step["states"][[0, 2]])
    assert info["elapsed_steps"].tolist() == [2, 0, 1]
    assert obs["states"][1, 0] == 0
    env.close()


def test_one_seed_per_env():
    env = countdown()
    by_int, _ = env.reset(seed=7)  # env i: 7 + i
    by_list, _ = env.reset(seed=[7, 8, 9])
    assert torch.equal(by_int["states"], by_list["states"])
    shared, _ = env.reset(seed=[5, 5, 5])  # one initial state for all (a GRPO group)
    assert len(set(shared["states"][:, 1].tolist())) == 1
    # seeds follow env_ids' order, whatever that order is
    obs, _ = env.reset(seed=[9, 7], env_ids=[2, 0])
    assert torch.equal(obs["states"][[0, 2]], by_int["states"][[0, 2]])
    with pytest.raises(ValueError, match="one seed per"):
        env.reset(seed=[1, 2], env_ids=[0, 1, 2])
    # per-env options follow env_ids' order too
    obs, _ = env.reset(env_ids=[2, 0], options={"start": [20, 0]})
    assert obs["states"][:, 1].tolist() == [0.0, shared["states"][1, 1].item(), 20.0]
    env.close()


def test_dict_observations_images_and_discrete_actions():
    env = countdown(num_envs=2, kwargs={"with_image": True},
                    image_keys={"pixels": "main_images", "wrist": "wrist_images"},
                    task_description="count")
    obs, _ = env.reset(seed=0)
    assert obs["main_images"].shape == (2, 8, 8, 3) and obs["main_images"].dtype == torch.uint8
    assert obs["states"].shape == (2, 3) and obs["task_descriptions"] == ["count", "count"]
    obs, *_ = env.step(np.zeros((2, 1)))
    assert (obs["main_images"] == 1).all() and (obs["wrist_images"] == 254).all()
    env.close()
    cart = make_env("gym/CartPole-v1", num_envs=2)
    assert cart.action_spec.discrete and cart.action_spec.n == 2 and cart.action_dim == 1
    cart.reset(seed=0)
    obs, r, *_ = cart.step(torch.tensor([[0], [1]]))
    assert obs["states"].shape == (2, 4) and r.tolist() == [1.0, 1.0]
    cart.close()


def test_point_reach_straight_line_policy_succeeds():
    env = make_env("toy/PointReach-v0", num_envs=4)
    assert env.max_episode_steps == 50 and env.action_dim == 2 and not env.action_spec.discrete
    obs, _ = env.reset(seed=0)
    total = torch.zeros(4)
    done = torch.zeros(4, dtype=torch.bool)
    d0 = (obs["states"][:, :2] - obs["states"][:, 2:]).norm(dim=1)
    for _ in range(50):
        s = obs["states"]
        a = (s[:, 2:] - s[:, :2]) / 0.1
        obs, r, te, tr, info = env.step(a)
        total += r * ~done
        done |= te | tr
        if done.all():
            break
    assert done.all()
    # optimal return: (d0 - d_T) / max_step + 1 with d_T <= radius
    assert torch.all(total >= d0 / 0.1 + 1 - 0.05 / 0.1 - 1e-4)
    assert torch.all(total <= d0 / 0.1 + 1 + 1e-4)
    env.close()


def test_registry_errors_name_close_matches():
    with pytest.raises(KeyError, match="toy/PointReach-v0"):
        make_env("toy/PointRech-v0")
    with pytest.raises(ValueError, match="CartPole-v1"):
        make_env(GymEnvConfig(env_id="CartPol-v1"))
    with pytest.raises(ValueError, match=r"shape \(N, A\)"):
        env = countdown()
        env.reset()
        try:
            env.step(np.zeros((3, 2)))
        finally:
            env.close()


def test_make_env_from_loaded_config():
    cfg = load_config(overrides=["env.type=gym", "env.env_id=toy/Countdown-v0", "env.num_envs=2",
                                 "env.autoreset_mode=same_step"])
    env = make_env(cfg.env)
    assert env.num_envs == 2 and env.autoreset_mode is AutoresetMode.SAME_STEP
    env.close()
    with pytest.raises(Exception, match="autoreset_mode"):
        load_config(overrides=["env.type=gym", "env.autoreset_mode=later"])


def test_entry_point_env_id():
    env = make_env(GymEnvConfig(env_id="rlinf_embodied.envs.toy:CountdownEnv", num_envs=2,
                                kwargs={"length": 2}))
    env.reset(seed=0)
    _, _, te, *_ = env.step(np.zeros((2, 1)))
    _, _, te, *_ = env.step(np.zeros((2, 1)))
    assert te.all() and env.max_episode_steps is None
    env.close()


def test_env_without_success_info_warns_once():
    env = make_env(GymEnvConfig(env_id="CartPole-v1", num_envs=2))
    env.reset(seed=0)
    with pytest.warns(EnvWarning, match=r"CartPole-v1 ended an episode without info\['success'\]"):
        for _ in range(200):  # pushing left, the pole falls within ~10 steps
            _, _, te, tr, info = env.step(np.zeros((2, 1)))
            if (te | tr).any():
                break
    assert (te | tr).any() and not info["success"].any()
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # said once: later episode ends stay quiet
        for _ in range(30):
            env.step(np.zeros((2, 1)))
    env.close()


def test_an_unmapped_image_key_is_refused_not_flattened_into_states():
    # a (8, 8, 3) uint8 'wrist' left out of image_keys would become 192 state dims
    with pytest.raises(Exception, match=r"'wrist' is an image \(\(8, 8, 3\) uint8\).*env.image_keys"):
        countdown(num_envs=1, kwargs={"with_image": True}, image_keys={"pixels": "main_images"})
    env = countdown(num_envs=1, kwargs={"with_image": True}, image_keys={"pixels": "main_images"},
                    state_keys=["state"])
    obs, _ = env.reset(seed=0)
    assert obs["states"].shape == (1, 3) and "wrist_images" not in obs
    env.close()


def test_env_kwargs_typo_is_a_config_error_before_any_env_is_built():
    from rlinf_embodied.config import ConfigError

    with pytest.raises(ConfigError, match=r"env.kwargs 'dimm' \(did you mean 'dim'\?\) not taken by "
                                          r"toy/PointReach-v0's constructor; it takes dim, max_step"):
        GymEnvConfig(env_id="toy/PointReach-v0", kwargs={"dimm": 3}).check_available()
    GymEnvConfig(env_id="toy/PointReach-v0", kwargs={"dim": 3}).check_available()
    GymEnvConfig(env_id="CartPole-v1", kwargs={"render_mode": None}).check_available()
    with pytest.raises(ConfigError, match="'lenght' \\(did you mean 'length'\\?\\)"):
        GymEnvConfig(env_id="rlinf_embodied.envs.toy:CountdownEnv", kwargs={"lenght": 3}).check_available()
