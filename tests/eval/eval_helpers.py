"""Policy factories and instrumented SubBatches for the eval tests (imported by module name).

The SubBatches subclass the real adapters and move the simulator into the goal configuration
(the direct state manipulation the success-detection tests need); they run in-process only.
"""

from __future__ import annotations

import time
from typing import Any, Dict, List

import numpy as np
from rlinf_embodied.envs.libero import LiberoSubBatch
from rlinf_embodied.envs.maniskill import ManiSkillSubBatch

CALLS = {"n": 0}
RAISE_AT = {"value_error": None, "interrupt": None}


def zero(ctx):
    """All-zero actions (LIBERO: no motion, gripper half-way; ManiSkill: hold)."""
    def act(obs):
        return np.zeros((ctx.num_envs, len(ctx.action_low)), np.float32)
    return act


def reach(ctx):
    """Greedy controller of toy/PointReach-v0: head for the target at full speed."""
    def act(obs):
        s = np.asarray(obs["states"])
        d = s[:, 2:] - s[:, :2]
        return (d / np.maximum(np.linalg.norm(d, axis=1, keepdims=True), 1e-9)).astype(np.float32)
    return act


def flaky(ctx):
    """:func:`reach` that raises ValueError / KeyboardInterrupt at the configured call numbers."""
    inner = reach(ctx)

    def act(obs):
        CALLS["n"] += 1
        if CALLS["n"] == RAISE_AT["value_error"]:
            raise ValueError("policy exploded")
        if CALLS["n"] == RAISE_AT["interrupt"]:
            raise KeyboardInterrupt
        return inner(obs)
    return act


def slow_random(ctx):
    """Random actions, 20 ms per call (so a subprocess can be killed mid-evaluation)."""
    rng = np.random.default_rng(0)

    def act(obs):
        time.sleep(0.02)
        return rng.uniform(ctx.action_low, ctx.action_high,
                           (ctx.num_envs, len(ctx.action_low))).astype(np.float32)
    return act


class TeleportManiSkill(ManiSkillSubBatch):
    """PushCube with the cube put on the goal before step 3 of trials in ``TELEPORT_TRIALS``."""

    ENV_SEED = 1_000_000
    TELEPORT_TRIALS: set = set()

    def reset(self, local_ids, seeds, options):
        if not hasattr(self, "_trial"):
            self._trial, self._t = {}, {}
        for i, s in zip(local_ids, seeds):
            self._trial[int(i)] = None if s is None else int(s) - self.ENV_SEED
            self._t[int(i)] = 0
        return super().reset(local_ids, seeds, options)

    def _step(self, local_ids, actions, observe):  # every step, observed or not
        for i in local_ids:
            i = int(i)
            self._t[i] += 1
            if self._t[i] == 3 and self._trial.get(i) in self.TELEPORT_TRIALS:
                e = self._envs[i].unwrapped
                p = e.obj.pose.p.clone()
                p[..., :2] = e.goal_region.pose.p[..., :2]
                e.obj.set_pose(type(e.obj.pose).create_from_pq(p=p, q=e.obj.pose.q))
        return super()._step(local_ids, actions, observe)


class RecordingLibero(LiberoSubBatch):
    """LIBERO SubBatch that logs loaded init states and settle steps, and puts the bowl on the
    plate (libero_spatial task 0's goal) before step 3 of trials in ``TELEPORT_TRIALS``."""

    LOG: List[Dict[str, Any]] = []
    TELEPORT_TRIALS: set = set()

    def reset(self, local_ids, seeds, options):
        self._t = getattr(self, "_t", {})
        for i in local_ids:
            env = self._envs[int(i)]
            if not getattr(env, "_recording", False):
                env._recording = True
                orig_set, orig_step = env.set_init_state, env.step

                def set_state(state, _i=int(i), _orig=orig_set):
                    self.LOG.append({"slot": _i, "state": np.array(state, copy=True), "settle": 0})
                    return _orig(state)

                def step(action, _orig=orig_step):
                    if self._in_reset:
                        self.LOG[-1]["settle"] += 1
                    return _orig(action)

                env.set_init_state, env.step = set_state, step
        self._in_reset = True
        try:
            out = super().reset(local_ids, seeds, options)
        finally:
            self._in_reset = False
        for i in local_ids:
            self._t[int(i)] = 0
        return out

    def step(self, local_ids, actions):
        for i in local_ids:
            i = int(i)
            self._t[i] += 1
            if self._t[i] == 3 and self.get_init_state_ids([i])[0] in self.TELEPORT_TRIALS:
                sim = self._envs[i].env.sim
                plate = sim.data.body_xpos[sim.model.body_name2id("plate_1_main")].copy()
                adr = sim.model.get_joint_qpos_addr("akita_black_bowl_1_joint0")[0]
                sim.data.qpos[adr:adr + 3] = plate + np.array([0.0, 0.0, 0.02])
                sim.data.qvel[:] = 0.0
                sim.forward()
        return super().step(local_ids, actions)


def in_process(sub_batch_cls):
    """``env_factory`` for EvalRequest: a VectorBatchedEnv over ``sub_batch_cls``, in-process."""
    import functools

    from rlinf_embodied.envs.vector import VectorBatchedEnv

    def factory(cfg):
        return VectorBatchedEnv(functools.partial(sub_batch_cls, cfg), cfg, num_processes=0)
    return factory


def reach_chunk4(ctx):
    """:func:`reach` repeated as a chunk of K=4 actions per query."""
    inner = reach(ctx)

    def act(obs):
        return np.repeat(inner(obs)[:, None], 4, axis=1)
    return act


try:
    import gymnasium as _gym

    class NeverEnds(_gym.Env):
        """A gymnasium env that never terminates and has no registered step limit."""

        observation_space = _gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
        action_space = _gym.spaces.Box(-1.0, 1.0, (2,), np.float32)

        def reset(self, *, seed=None, options=None):
            super().reset(seed=seed)
            return np.zeros(3, np.float32), {}

        def step(self, action):
            return np.zeros(3, np.float32), 0.5, False, False, {}
except ImportError:  # pragma: no cover
    pass


def broken(ctx):
    """A factory whose own code fails (eval reports it in one line, not a traceback)."""
    raise RuntimeError("no weights in ./ckpt")
