"""Demonstration dataset: ManiSkill HDF5 trajectories as (observation, action) pairs.

Read with ManiSkill's ``ManiSkillTrajectoryDataset`` (h5py under the hood); this module only
turns its arrays into the policy contract's tensors: ``states`` (M, S) float32 and ``actions``
(M, K, A) float32 with K = 1 (one action per observation; the final observation of each
episode, which has no action, is dropped by ManiSkill's loader).
"""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import numpy as np
import torch

__all__ = ["DemoDataset", "RGBDemoDataset"]


def _returns(rewards: torch.Tensor, episode: torch.Tensor, gamma: float) -> torch.Tensor:
    """(M,) discounted returns-to-go per episode; each episode's last reward is held forever
    (``r_T / (1 - gamma)``), see :meth:`DemoDataset.returns`."""
    out = torch.zeros_like(rewards)
    carry = 0.0
    for i in range(len(out) - 1, -1, -1):
        last = i == len(out) - 1 or episode[i + 1] != episode[i]
        r = float(rewards[i])
        carry = r / (1.0 - gamma) if last else r + gamma * carry
        out[i] = carry
    return out


class DemoDataset(torch.utils.data.Dataset):
    """All transitions of a ManiSkill trajectory file, in memory.

    Args:
        path: a ``.h5`` trajectory file (its ``.json`` sidecar next to it) with ``state``
            observations.
        max_trajectories: load only the first this many episodes; None loads all.

    Attributes:
        states: (M, S) float32 observations.
        actions: (M, 1, A) float32 actions in the file's controller (normalised [-1, 1] for
            ManiSkill's delta controllers).
        episode: (M,) int64 episode index of each transition.
        rewards: (M,) float32 recorded rewards (the file's reward mode), or None.
        env_id: the env the demos were recorded in.
        control_mode: the controller of ``actions``.
        seeds: reset seed of each loaded episode.

    Raises:
        FileNotFoundError: the file or its JSON sidecar is missing.
        ValueError: the observations are not flat state vectors (an ``rgb`` file).
    """

    def __init__(self, path: str | Path, max_trajectories: int | None = None):
        from mani_skill.trajectory.dataset import ManiSkillTrajectoryDataset

        path = Path(path)
        meta_path = path.with_suffix(".json")
        if not path.is_file() or not meta_path.is_file():
            raise FileNotFoundError(
                f"No ManiSkill trajectory file at {path} (with {meta_path.name}); generate it "
                "with `rlinf-embodied demos CONFIG.yaml`."
            )
        meta = json.loads(meta_path.read_text())
        n = len(meta["episodes"]) if max_trajectories is None else min(
            max_trajectories, len(meta["episodes"]))
        with contextlib.redirect_stderr(io.StringIO()):  # its tqdm bar
            ds = ManiSkillTrajectoryDataset(str(path), load_count=n, success_only=False)
        if not isinstance(ds.obs, np.ndarray) or ds.obs.ndim != 2:
            raise ValueError(
                f"{path} holds {type(ds.obs).__name__} observations; DemoDataset needs flat "
                "`state` observations (convert with obs mode state)."
            )
        lengths = [int(e["elapsed_steps"]) for e in meta["episodes"][:n]]
        self.states = torch.as_tensor(ds.obs, dtype=torch.float32)
        self.actions = torch.as_tensor(ds.actions, dtype=torch.float32).unsqueeze(1)
        self.episode = torch.repeat_interleave(torch.arange(n), torch.as_tensor(lengths))
        if self.episode.numel() != self.states.shape[0]:
            raise ValueError(
                f"{path}: episode lengths in the JSON sum to {self.episode.numel()} but the file "
                f"has {self.states.shape[0]} transitions; the file is inconsistent, regenerate it."
            )
        self.rewards = (None if ds.rewards is None
                        else torch.as_tensor(ds.rewards, dtype=torch.float32).reshape(-1))
        self.env_id = meta["env_info"]["env_id"]
        self.control_mode = meta["env_info"]["env_kwargs"].get("control_mode")
        self.seeds = [int(e["episode_seed"]) for e in meta["episodes"][:n]]
        self.path = path
        ds.data.close()

    def returns(self, gamma: float) -> torch.Tensor:
        """(M,) discounted returns-to-go within each episode, float32.

        The last step of an episode is a success the demonstrator reached (only successful
        demos are kept); it is bootstrapped as if the reward were held forever,
        ``r_T / (1 - gamma)``, the value of staying on the goal when episodes do not end on
        success (``env.ignore_terminations``).

        Raises:
            ValueError: the file has no rewards (record them with ``--record-rewards``).
        """
        if self.rewards is None:
            raise ValueError(f"{self.path} has no rewards; regenerate the demos (they are recorded).")
        return _returns(self.rewards, self.episode, gamma)

    @property
    def num_trajectories(self) -> int:
        return len(self.seeds)

    def __len__(self) -> int:
        return self.states.shape[0]

    def __getitem__(self, i):
        return self.states[i], self.actions[i]


class RGBDemoDataset:
    """RGB demonstrations of a language-conditioned suite (:mod:`rlinf_embodied.sft.vla_demos`),
    in memory, in the observation layout the suite env gives the policy.

    Args:
        paths: converted HDF5 files, one per task (their JSON sidecars next to them).
        max_trajectories: load only the first this many episodes of each file; None: all.
        trim_idle_start: drop each episode's leading steps whose largest absolute arm action
            (all but the last dim) is below ``idle_fraction`` of the episode's largest: the
            planner's motionless gripper closing and the start of its acceleration ramp. A
            policy cloned on them outputs (nearly) no motion in the initial state, which then
            never changes.
        idle_fraction: see ``trim_idle_start``.

    Attributes:
        main_images: (M, H, W, 3) uint8.
        states: (M, 8) float32 (:func:`~rlinf_embodied.envs.maniskill_suites.suite_states`).
        actions: (M, A) float32 in the file's controller.
        rewards: (M,) float32 recorded rewards.
        episode: (M,) int64 global episode index of each transition.
        instructions: one instruction per episode.
        env_ids: one env id per episode.
        control_mode, sensor_size, suite: what the files were recorded with (equal in all).

    Raises:
        FileNotFoundError: a file or its JSON is missing.
        ValueError: the files were recorded with different control modes, image sizes or
            suites, or hold no ``rlinf`` metadata (not written by ``rlinf-embodied demos``).
    """

    def __init__(self, paths, max_trajectories: int | None = None, trim_idle_start: bool = False,
                 idle_fraction: float = 0.1):
        import h5py

        from rlinf_embodied.envs.maniskill import suite_obs

        images, states, actions, rewards, episode = [], [], [], [], []
        self.instructions, self.env_ids, self.seeds = [], [], []
        recorded = set()
        for path in map(Path, paths):
            side = path.with_suffix(".json")
            if not path.is_file() or not side.is_file():
                raise FileNotFoundError(f"No demonstration file {path} (with {side.name}); run "
                                        "`rlinf-embodied demos CONFIG.yaml`.")
            meta = json.loads(side.read_text())
            info = meta.get("rlinf")
            if info is None:
                raise ValueError(f"{path} was not written by `rlinf-embodied demos` for a suite "
                                 "(no 'rlinf' entry in its JSON); regenerate it.")
            recorded.add((info["suite"], info["control_mode"], int(info["sensor_size"])))
            eps = meta["episodes"][:max_trajectories]
            with h5py.File(path, "r") as f:
                for ep in eps:
                    g = f[f"traj_{ep['episode_id']}"]
                    raw = {"sensor_data": {c: {"rgb": g["obs"]["sensor_data"][c]["rgb"][:-1]}
                                           for c in g["obs"]["sensor_data"]},
                           "agent": {"qpos": g["obs"]["agent"]["qpos"][:-1]},
                           "extra": {"tcp_pose": g["obs"]["extra"]["tcp_pose"][:-1]}}
                    obs = suite_obs(raw)
                    act = torch.as_tensor(g["actions"][:], dtype=torch.float32)
                    keep = slice(None)
                    if trim_idle_start:
                        arm = act[:, :-1].abs().amax(1)
                        moving = (arm >= idle_fraction * arm.max()).nonzero()
                        keep = slice(int(moving[0]) if len(moving) else 0, None)
                    act = act[keep]
                    t = int(act.shape[0])
                    images.append(obs["main_images"][keep])
                    states.append(obs["states"][keep])
                    actions.append(act)
                    rewards.append(torch.as_tensor(g["rewards"][:], dtype=torch.float32).reshape(-1)[keep])
                    episode.append(torch.full((t,), len(self.instructions), dtype=torch.long))
                    self.instructions.append(ep.get("instruction", info["instruction"]))
                    self.env_ids.append(info["env_id"])
                    self.seeds.append(int(ep["episode_seed"]))
        if len(recorded) != 1:
            raise ValueError(f"The demonstration files were recorded with different (suite, "
                             f"control mode, image size): {sorted(recorded)}; regenerate them.")
        (self.suite, self.control_mode, self.sensor_size), = recorded
        self.main_images = torch.cat(images)
        self.states = torch.cat(states)
        self.actions = torch.cat(actions)
        self.rewards = torch.cat(rewards)
        self.episode = torch.cat(episode)
        ends = torch.ones_like(self.episode, dtype=torch.bool)
        ends[:-1] = self.episode[1:] != self.episode[:-1]
        self._last = torch.zeros_like(self.episode)  # index of each transition's episode end
        idx = torch.arange(len(self.episode))
        last = torch.zeros(len(self.instructions), dtype=torch.long)
        last[self.episode[ends]] = idx[ends]
        self._last = last[self.episode]

    def check_env(self, env_cfg) -> None:
        """Refuse demonstrations recorded for another suite, controller or image size.

        Raises:
            ValueError: one line naming both values and the fix.
        """
        want = (env_cfg.suite, env_cfg.control_mode, int(env_cfg.sensor_size))
        have = (self.suite, self.control_mode, self.sensor_size)
        names = ("env.suite", "env.control_mode", "env.sensor_size")
        for name, w, h in zip(names, want, have):
            if w != h:
                raise ValueError(f"The demonstrations were recorded with {name}={h} but the policy's "
                                 f"env has {name}={w}; regenerate them with `rlinf-embodied demos "
                                 f"CONFIG.yaml --force` or set {name}={h}.")

    def __len__(self) -> int:
        return int(self.actions.shape[0])

    @property
    def num_trajectories(self) -> int:
        return len(self.instructions)

    def chunks(self, idx: torch.Tensor, k: int) -> torch.Tensor:
        """(B, K, A) actions t..t+K-1 of each transition t in ``idx``, padded past the
        episode's end with its last action."""
        steps = idx[:, None] + torch.arange(k)[None, :]
        steps = torch.minimum(steps, self._last[idx][:, None])
        return self.actions[steps]

    def obs(self, idx: torch.Tensor) -> dict:
        """The observation batch of transitions ``idx`` (contract keys)."""
        return {"main_images": self.main_images[idx], "states": self.states[idx],
                "task_descriptions": [self.instructions[int(e)] for e in self.episode[idx]]}

    def statistics(self, key: str) -> dict:
        """Dataset statistics in the published ``dataset_statistics.json`` layout:
        ``{key: {"action": {q01, q99, mask, mean, std, min, max}, "proprio": {...},
        "num_transitions", "num_trajectories"}}``; q01/q99 are the 1st/99th percentiles per
        dimension (OpenVLA's BOUNDS_Q99), the gripper (last action dim) is not normalised."""
        def entry(x: torch.Tensor, mask=None) -> dict:
            d = {"q01": torch.quantile(x, 0.01, dim=0).tolist(),
                 "q99": torch.quantile(x, 0.99, dim=0).tolist(),
                 "mean": x.mean(0).tolist(), "std": x.std(0).tolist(),
                 "min": x.min(0).values.tolist(), "max": x.max(0).values.tolist()}
            if mask is not None:
                d["mask"] = mask
            return d
        a = self.actions.shape[1]
        return {key: {"action": entry(self.actions, [True] * (a - 1) + [False]),
                      "proprio": entry(self.states),
                      "num_transitions": len(self), "num_trajectories": self.num_trajectories}}

    def returns(self, gamma: float) -> torch.Tensor:
        """(M,) discounted returns-to-go within each episode (see :meth:`DemoDataset.returns`)."""
        return _returns(self.rewards, self.episode, gamma)
