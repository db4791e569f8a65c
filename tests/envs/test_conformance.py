"""The BatchedEnv contract, checked the same way on every env kind we ship.

Each kind is built once per module (simulators take seconds to build) with 2 envs and a
3-step time limit, so that chunk_step meets a done within one chunk on every simulator.
"""

from __future__ import annotations

import pytest
import torch

from rlinf_embodied.envs import BatchedEnv, make_env

from .conftest import HAS_LIBERO, HAS_MANISKILL, env_children

N, LIMIT = 2, 3

KINDS = {
    "gym-toy-sync": dict(id="toy/Countdown-v0", kwargs={"length": 50, "with_image": True},
                         image_keys={"pixels": "main_images", "wrist": "wrist_images"}),
    "gym-toy-async": dict(id="toy/PointReach-v0", vectorization="async", num_processes=2),
    "maniskill-state": dict(id="maniskill/PushCube-v1", obs_mode="state", num_processes=1,
                            sim_backend="physx_cpu"),
    "maniskill-rgb": dict(id="maniskill/PushCube-v1", obs_mode="rgb", sensor_size=32,
                          num_processes=0, sim_backend="physx_cpu"),
    "libero-state": dict(id="libero/libero_spatial", obs_mode="state", num_processes=0),
}
NEEDS = {"maniskill": HAS_MANISKILL, "libero": HAS_LIBERO}


@pytest.fixture(scope="module", params=list(KINDS))
def kind_env(request):
    kind = request.param
    if not NEEDS.get(kind.split("-")[0], True):
        pytest.skip(f"{kind} needs its simulator extra")
    fields = dict(KINDS[kind])
    env = make_env(fields.pop("id"), num_envs=N, max_episode_steps=LIMIT, **fields)
    yield kind, env
    env.close()


def _zeros(env: BatchedEnv, k: int | None = None) -> torch.Tensor:
    shape = (env.num_envs, env.action_dim) if k is None else (env.num_envs, k, env.action_dim)
    mid = (torch.as_tensor(env.action_spec.low) + torch.as_tensor(env.action_spec.high)) / 2
    return torch.zeros(shape) + mid


def _check_obs(env: BatchedEnv, obs: dict) -> None:
    assert isinstance(obs["task_descriptions"], list) and len(obs["task_descriptions"]) == N
    assert all(isinstance(t, str) and t for t in obs["task_descriptions"])
    assert obs["states"].dtype == torch.float32 and obs["states"].shape[0] == N
    assert tuple(obs["states"].shape[1:]) == env.spec.obs_shapes["states"]
    for key in ("main_images", "wrist_images"):
        if key in env.spec.obs_shapes:
            img = obs[key]
            assert img.dtype == torch.uint8 and img.shape[0] == N and img.shape[-1] == 3
            assert img.ndim == 4
        else:
            assert key not in obs  # absent, not zeros


def _check_info(info: dict) -> None:
    for key in ("success", "success_once", "autoreset", "env_error"):
        assert info[key].dtype == torch.bool and info[key].shape == (N,), key
    assert info["elapsed_steps"].shape == (N,)


def test_shapes_dtypes_and_success(kind_env):
    kind, env = kind_env
    assert env.num_envs == N and env.max_episode_steps == LIMIT
    assert env.action_spec.low.shape == env.action_spec.high.shape == (env.action_dim,)
    obs, info = env.reset(seed=0)
    _check_obs(env, obs)
    _check_info(info)
    obs, r, te, tr, info = env.step(_zeros(env))
    _check_obs(env, obs)
    _check_info(info)
    assert r.shape == (N,) and r.dtype == torch.float32
    assert te.dtype == tr.dtype == torch.bool and te.shape == tr.shape == (N,)


def test_seeding_is_reproducible(kind_env):
    kind, env = kind_env
    a, _ = env.reset(seed=123)
    a1, *_ = env.step(_zeros(env))
    b, _ = env.reset(seed=123)
    b1, *_ = env.step(_zeros(env))
    for key in env.spec.obs_shapes:
        assert torch.equal(a[key], b[key]), key
        assert torch.equal(a1[key], b1[key]), key


def test_partial_reset_leaves_other_envs_untouched(kind_env):
    kind, env = kind_env
    env.reset(seed=1)
    stepped, *_ = env.step(_zeros(env))
    obs, info = env.reset(env_ids=[0])
    assert info["elapsed_steps"].tolist() == [0, 1]
    for key in env.spec.obs_shapes:
        assert torch.equal(obs[key][1], stepped[key][1]), key
    again, *_ = env.step(_zeros(env))
    assert again["states"].shape == stepped["states"].shape


def test_chunk_step_stops_at_done(kind_env):
    kind, env = kind_env
    env.reset(seed=2)
    obs, rew, te, tr, info = env.chunk_step(_zeros(env, k=LIMIT + 2))
    assert rew.shape == te.shape == tr.shape == (N, LIMIT + 2)
    done = te | tr
    first = done.float().argmax(1)
    assert done.any(1).all(), "the 3-step limit must end every episode within the chunk"
    assert info["num_substeps"].tolist() == (first + 1).tolist()
    for i in range(N):
        assert not done[i, first[i] + 1:].any() and (rew[i, first[i] + 1:] == 0).all()
    obs, rew, te, tr, info = env.chunk_step(_zeros(env, k=2))  # NEXT_STEP: the reset chunk
    assert info["autoreset"].all() and (rew == 0).all()
    _check_obs(env, obs)


def test_close_leaves_no_child_process(kind_env):
    kind, env = kind_env
    pids = set(env.worker_pids())
    env.close()
    assert not pids & env_children(), f"{kind}: workers {pids & env_children()} outlived close()"
