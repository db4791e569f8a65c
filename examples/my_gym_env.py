"""Bring your own gymnasium env: a complete, runnable example.

``GoalSeekEnv`` is an ordinary gymnasium env with a Dict observation (a camera image plus a
vector state) and a Box action. rlinf-embodied needs nothing from it beyond the gymnasium API;
reporting ``info["success"]`` makes success rates appear in evaluation.

Run it from the repository root (so that ``examples.my_gym_env`` is importable)::

    .venv/bin/python -m examples.my_gym_env

or train with the YAML snippet in docs/extending.md ("Your own gymnasium env")
(``env.env_id: examples.my_gym_env:GoalSeekEnv``, run from the repository root).
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
from gymnasium import spaces


class GoalSeekEnv(gym.Env):
    """Steer a dot to a goal on a 64x64 canvas.

    **Observation**: ``{"camera": (64, 64, 3) uint8 canvas, "position": (2,), "goal": (2,)}``.
    **Action**: (2,) velocity in [-1, 1]; the dot moves by ``0.05 * a`` per step.
    **Success**: the dot is within 0.1 of the goal; the episode then terminates.
    **Reward**: the decrease in distance to the goal, plus 1 on success.
    """

    def __init__(self, size: int = 64):
        self.size = size
        box = spaces.Box(-1.0, 1.0, (2,), np.float32)
        self.observation_space = spaces.Dict({
            "camera": spaces.Box(0, 255, (size, size, 3), np.uint8),
            "position": box,
            "goal": box,
        })
        self.action_space = spaces.Box(-1.0, 1.0, (2,), np.float32)

    def _obs(self):
        canvas = np.full((self.size, self.size, 3), 30, np.uint8)
        for point, color in ((self.goal, (0, 200, 0)), (self.pos, (220, 40, 40))):
            x, y = ((point + 1) / 2 * (self.size - 1)).round().astype(int)
            canvas[max(0, y - 2): y + 3, max(0, x - 2): x + 3] = color
        return {"camera": canvas, "position": self.pos.astype(np.float32),
                "goal": self.goal.astype(np.float32)}

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.pos = self.np_random.uniform(-1, 1, 2)
        self.goal = self.np_random.uniform(-1, 1, 2)
        return self._obs(), {"success": False}

    def step(self, action):
        before = np.linalg.norm(self.pos - self.goal)
        self.pos = np.clip(self.pos + 0.05 * np.clip(action, -1, 1), -1, 1)
        after = np.linalg.norm(self.pos - self.goal)
        success = bool(after < 0.1)
        return self._obs(), float(before - after + success), success, False, {"success": success}


def main() -> None:
    from rlinf_embodied.envs.configuration_gym import GymEnvConfig
    from rlinf_embodied.envs import make_env

    cfg = GymEnvConfig(
        env_id="examples.my_gym_env:GoalSeekEnv",  # or any id registered with gymnasium
        num_envs=4,
        max_episode_steps=80,
        image_keys={"camera": "main_images"},  # Dict keys that are images
        state_keys=["position", "goal"],  # concatenated into obs["states"]
        task_description="move the red dot onto the green dot",
        video=True,
        video_dir="videos/goal_seek",
    )
    env = make_env(cfg)
    obs, info = env.reset(seed=0)
    print({k: tuple(v.shape) if hasattr(v, "shape") else v for k, v in obs.items()})
    episodes = successes = 0
    for _ in range(80):
        s = obs["states"]  # (N, 4) = position, goal
        obs, reward, terminated, truncated, info = env.step((s[:, 2:] - s[:, :2]) * 20)
        done = terminated | truncated  # NEXT_STEP autoreset: obs of done envs is the final one
        episodes += int(done.sum())
        successes += int((done & info["success_once"]).sum())
    print(f"{successes}/{episodes} episodes succeeded; videos in {cfg.video_dir}: {len(env.videos)}")
    env.close()


if __name__ == "__main__":
    main()
