"""Video wrapper: one readable MP4 per episode with the right number of frames."""

from __future__ import annotations

import numpy as np
import pytest

from rlinf_embodied.envs import make_env
from rlinf_embodied.envs.wrappers.video import VideoRecorder, compose_frame


def image_countdown(**fields):
    return make_env("toy/Countdown-v0", num_envs=2, kwargs={"length": 5, "with_image": True},
                    image_keys={"pixels": "main_images", "wrist": "wrist_images"}, **fields)


@pytest.mark.parametrize("mode", ["next_step", "same_step"])
def test_one_mp4_per_episode_with_all_frames(tmp_path, mode):
    import imageio.v2 as imageio

    env = VideoRecorder(image_countdown(autoreset_mode=mode), tmp_path, env_ids=[1])
    env.reset(seed=0)
    for _ in range(5 + 3):  # one episode, then part of a second one
        env.step(np.zeros((2, 1)))
    assert len(env.videos) == 1 and env.videos[0].name.endswith("env001_success.mp4")
    frames = imageio.mimread(env.videos[0])
    assert len(frames) == 6  # the reset frame and 5 steps
    assert frames[0].shape == (128, 256, 3)  # 8x8 main + wrist, upscaled to 128 px high
    env.close()


def test_video_via_config_flag(tmp_path):
    env = image_countdown(video=True, video_dir=str(tmp_path / "v"))
    assert isinstance(env, VideoRecorder) and env.num_envs == 2
    env.reset(seed=0)
    env.chunk_step(np.zeros((2, 5, 1)))
    assert sorted(p.name for p in env.videos) == ["episode_00000_env000_success.mp4",
                                                  "episode_00001_env001_success.mp4"]
    env.close()


def test_state_only_env_refuses_video(tmp_path):
    with pytest.raises(ValueError, match="obs_mode=rgb"):
        make_env("toy/PointReach-v0", video=True, video_dir=str(tmp_path))


def test_compose_frame_pads_to_even_sizes():
    frame = compose_frame(np.zeros((129, 65, 3), np.uint8), None, "step 1")
    assert frame.shape == (130, 66, 3) and frame.dtype == np.uint8


def test_readme_gym_example_runs(tmp_path, monkeypatch):
    import pathlib

    root = pathlib.Path(__file__).resolve().parents[2]
    monkeypatch.syspath_prepend(str(root))
    monkeypatch.chdir(tmp_path)
    from examples import my_gym_env

    my_gym_env.main()
    assert list((tmp_path / "videos" / "goal_seek").glob("*.mp4"))
