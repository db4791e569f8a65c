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

__all__ = ["DemoDataset"]


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
        out = torch.zeros_like(self.rewards)
        carry = 0.0
        for i in range(len(out) - 1, -1, -1):
            last = i == len(out) - 1 or self.episode[i + 1] != self.episode[i]
            r = float(self.rewards[i])
            carry = r / (1.0 - gamma) if last else r + gamma * carry
            out[i] = carry
        return out

    @property
    def num_trajectories(self) -> int:
        return len(self.seeds)

    def __len__(self) -> int:
        return self.states.shape[0]

    def __getitem__(self, i):
        return self.states[i], self.actions[i]
