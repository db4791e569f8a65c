"""One MP4 per episode: main camera, wrist camera beside it, step and success drawn on top.

Off by default in training (``env.video=false``), on in evaluation. Frames are the observations
the BatchedEnv returns: with ``chunk_step`` that is one frame per chunk (the sub-steps inside a
chunk are not observed). Videos are written with imageio (ffmpeg, H.264) when an episode ends;
episodes cut short by an explicit ``reset(env_ids=...)`` or by ``close()`` are dropped.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

import numpy as np
import torch

from ..base import AutoresetMode, BatchedEnv

__all__ = ["VideoRecorder", "compose_frame"]

_MIN_HEIGHT = 128  # small frames are upscaled (nearest) so the overlay text stays legible


def _np_image(x: Any) -> np.ndarray:
    return x.detach().cpu().numpy() if isinstance(x, torch.Tensor) else np.asarray(x)


def compose_frame(main: np.ndarray, wrist: Optional[np.ndarray], text: str) -> np.ndarray:
    """One video frame (H', W', 3) uint8: ``main`` and ``wrist`` side by side, ``text`` on top.

    Images are (H, W, 3) uint8; a wrist image of another height is padded with black. Frames
    lower than 128 px are upscaled by an integer factor (nearest); sizes are padded to even
    numbers (H.264 needs them). The text is drawn with PIL when it is installed.
    """
    parts = [main] if wrist is None else [main, wrist]
    h = max(p.shape[0] for p in parts)
    parts = [np.pad(p, ((0, h - p.shape[0]), (0, 0), (0, 0))) for p in parts]
    frame = np.concatenate(parts, axis=1).astype(np.uint8)
    scale = max(1, -(-_MIN_HEIGHT // frame.shape[0]))
    if scale > 1:
        frame = frame.repeat(scale, 0).repeat(scale, 1)
    frame = np.pad(frame, ((0, frame.shape[0] % 2), (0, frame.shape[1] % 2), (0, 0)))
    try:
        from PIL import Image, ImageDraw
    except ImportError:
        return frame
    img = Image.fromarray(frame)
    draw = ImageDraw.Draw(img)
    draw.rectangle((0, 0, 8 + 6 * len(text), 14), fill=(0, 0, 0))
    draw.text((3, 2), text, fill=(255, 255, 255))
    return np.asarray(img)


class VideoRecorder(BatchedEnv):
    """Wraps a BatchedEnv and writes ``{out_dir}/{prefix}_{k:05d}_env{i:03d}_{success|fail}.mp4``.

    Args:
        env: the env; its observations must include ``main_images``.
        out_dir: directory for the videos (created).
        fps: frames per second; default the env's control frequency, else 20.
        env_ids: envs to record (default all).
        max_videos: stop after this many videos (None: no limit).
        prefix: file name prefix.

    Attributes:
        videos: paths of the videos written so far.

    Raises:
        ValueError: the env has no image observations (set ``obs_mode=rgb`` or ``video=false``).
    """

    def __init__(self, env: BatchedEnv, out_dir: str | os.PathLike, fps: Optional[float] = None,
                 env_ids: Optional[Sequence[int]] = None, max_videos: Optional[int] = None,
                 prefix: str = "episode"):
        spec = getattr(env, "spec", None)
        if spec is not None and "main_images" not in spec.obs_shapes:
            raise ValueError(
                "Video recording needs image observations (main_images); set env.obs_mode=rgb "
                "or env.video=false."
            )
        self.env = env
        self.out_dir = Path(out_dir)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        meta = getattr(spec, "metadata", {}) if spec is not None else {}
        self.fps = float(fps or meta.get("control_freq_hz") or 20)
        self.prefix = prefix
        self.max_videos = max_videos
        self.videos: List[Path] = []
        self._record = set(range(env.num_envs) if env_ids is None else env_ids)
        self._frames: Dict[int, List[np.ndarray]] = {}

    # contract attributes come from the wrapped env
    num_envs = property(lambda self: self.env.num_envs)
    action_spec = property(lambda self: self.env.action_spec)
    max_episode_steps = property(lambda self: self.env.max_episode_steps)
    autoreset_mode = property(lambda self: self.env.autoreset_mode)
    ignore_terminations = property(lambda self: self.env.ignore_terminations)
    device = property(lambda self: self.env.device)

    def __getattr__(self, name: str) -> Any:  # spec, env_method, worker_pids, ...
        if name == "env":
            raise AttributeError(name)
        return getattr(self.env, name)

    def _frame(self, obs: Dict[str, Any], i: int, step: int, success: bool) -> np.ndarray:
        wrist = obs.get("wrist_images")
        return compose_frame(_np_image(obs["main_images"][i]),
                             None if wrist is None else _np_image(wrist[i]),
                             f"step {step}  success {int(success)}")

    def _write(self, i: int, success: bool) -> None:
        frames = self._frames.pop(i, [])
        if not frames or (self.max_videos is not None and len(self.videos) >= self.max_videos):
            return
        import imageio.v2 as imageio

        name = f"{self.prefix}_{len(self.videos):05d}_env{i:03d}_{'success' if success else 'fail'}.mp4"
        path = self.out_dir / name
        imageio.mimwrite(path, frames, fps=self.fps, macro_block_size=1)
        self.videos.append(path)

    def reset(self, seed=None, env_ids=None, options=None):
        obs, info = self.env.reset(seed=seed, env_ids=env_ids, options=options)
        ids = range(self.num_envs) if env_ids is None else [int(i) for i in env_ids]
        for i in ids:
            if i in self._record:
                self._frames[i] = [self._frame(obs, i, 0, False)]
        return obs, info

    def _after(self, obs, done: torch.Tensor, info: Dict[str, Any]) -> None:
        same_step = self.autoreset_mode is AutoresetMode.SAME_STEP
        for i in self._record:
            if bool(info["autoreset"][i]):
                self._frames[i] = [self._frame(obs, i, 0, False)]
                continue
            if i not in self._frames:
                continue
            final = info["final_obs"] if same_step and bool(done[i]) else obs
            self._frames[i].append(
                self._frame(final, i, int(info["elapsed_steps"][i]), bool(info["success"][i])))
            if bool(done[i]):
                self._write(i, bool(info["success_once"][i]))
                if same_step:  # obs already holds the next episode's first observation
                    self._frames[i] = [self._frame(obs, i, 0, False)]

    def step(self, actions):
        obs, reward, term, trunc, info = self.env.step(actions)
        self._after(obs, term | trunc, info)
        return obs, reward, term, trunc, info

    def chunk_step(self, actions):
        obs, reward, term, trunc, info = self.env.chunk_step(actions)
        self._after(obs, (term | trunc).any(-1), info)
        return obs, reward, term, trunc, info

    def close(self) -> None:
        self._frames.clear()
        self.env.close()
