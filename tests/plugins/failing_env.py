"""A user's gymnasium env that cannot step: every ``step`` raises numpy's ``LinAlgError`` (as a
simulator inverting a singular matrix would). Loaded by ``env_id =
tests.plugins.failing_env:SingularStepEnv`` in the env pool's processes (tests/envs/test_pool.py,
tests/e2e/test_train.py)."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
from gymnasium import spaces


class SingularStepEnv(gym.Env):
    """Resets fine; every step raises ``numpy.linalg.LinAlgError: Singular matrix``."""

    def __init__(self):
        self.observation_space = spaces.Box(-1.0, 1.0, (3,), np.float32)
        self.action_space = spaces.Box(-1.0, 1.0, (1,), np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(3, np.float32), {}

    def step(self, action):
        np.linalg.inv(np.zeros((2, 2)))
        raise AssertionError("unreachable: a singular matrix has no inverse")
