"""Evaluation on the real LIBERO and ManiSkill adapters, at small scale.

LIBERO runs in-process, state-only, with soft resets (``hard_reset=False``) to stay fast on CPU;
the instrumented SubBatches of ``eval_helpers`` log what the simulator was given and move it into
the goal configuration for chosen trials.
"""

from html.parser import HTMLParser
from pathlib import Path

import eval_helpers
import numpy as np
import pytest
from rlinf_embodied.eval.request import EvalRequest
from rlinf_embodied.eval.run import evaluate

pytest.importorskip("libero")


@pytest.mark.libero
def test_libero_init_states_settle_success_and_timeout(tmp_path):
    from rlinf_embodied.envs.libero import libero_init_states

    rec = eval_helpers.RecordingLibero
    rec.LOG.clear()
    rec.TELEPORT_TRIALS = {1}
    res = evaluate(EvalRequest(
        env="libero", suite="libero_spatial", tasks=[0], trials_per_task=3, num_envs=2,
        num_processes=0, obs_mode="state", max_steps=8, policy="eval_helpers:zero",
        output=str(tmp_path / "libero.json"), env_overrides={"hard_reset": False},
        env_factory=eval_helpers.in_process(rec), reports=False,
    ))
    by_trial = {e.trial: e for e in res.episodes}
    assert sorted(by_trial) == [0, 1, 2]
    # Goal configuration reached -> success at the first step the BDDL check holds (the bowl
    # is put on the plate before step 3 and seats within a step); the others time out after
    # max_steps policy steps.
    assert by_trial[1].success and 3 <= by_trial[1].steps < 8 and by_trial[1].error is None
    for t in (0, 2):
        assert not by_trial[t].success and by_trial[t].steps == 8 and by_trial[t].error is None
    # Trial i was started from stored initial state i, followed by 10 uncounted settle steps.
    stored = libero_init_states("libero_spatial", 0)
    loaded = [r["state"] for r in rec.LOG]
    for trial in range(3):
        assert any(np.array_equal(s, stored[trial]) for s in loaded), trial
    assert all(r["settle"] == 10 for r in rec.LOG)
    h = res.header
    assert h["protocol"]["id"] == "openvla_v1@v1+max_steps"
    assert h["versions"]["mujoco"] == "3.3.2" and h["version_mismatches"] == []
    assert h["policy"]["kind"] == "callable" and len(h["policy"]["sha256"]) == 64


@pytest.mark.libero
def test_libero_rgb_video_report(tmp_path, monkeypatch):
    # The env worker (a subprocess) picks MUJOCO_GL itself; the header stamps its choice, not
    # this process's (unset) variable.
    monkeypatch.delenv("MUJOCO_GL", raising=False)
    res = evaluate(EvalRequest(
        env="libero", suite="libero_spatial", tasks=[0], trials_per_task=1, num_envs=1,
        num_processes=1, max_steps=4, image_size=64, policy="random", video="failures",
        output=str(tmp_path / "rgb.json"), env_overrides={"hard_reset": False},
    ))
    (ep,) = res.episodes
    assert not ep.success and ep.video and (tmp_path / ep.video).stat().st_size > 0
    assert res.header["obs_mode"] == "rgb"
    assert res.header["render_backend"] in ("mujoco MUJOCO_GL=egl", "mujoco MUJOCO_GL=osmesa")
    for suffix in (".md", ".png", ".html"):
        assert (tmp_path / f"rgb{suffix}").stat().st_size > 0

    class Collect(HTMLParser):
        def __init__(self):
            super().__init__()
            self.videos, self.tables = [], 0

        def handle_starttag(self, tag, attrs):
            if tag == "video":
                self.videos.append(dict(attrs)["src"])
            self.tables += tag == "table"

    page = Collect()
    page.feed((tmp_path / "rgb.html").read_text())
    page.close()
    assert page.tables >= 2 and page.videos == [ep.video]
    assert (tmp_path / page.videos[0]).is_file()  # relative to the page


@pytest.mark.maniskill
def test_maniskill_fair_eval_success_once_and_at_end(tmp_path):
    pytest.importorskip("mani_skill")
    eval_helpers.TeleportManiSkill.TELEPORT_TRIALS = {0, 2}
    res = evaluate(EvalRequest(
        env="maniskill", task="PushCube-v1", trials_per_task=4, num_envs=3, num_processes=0,
        obs_mode="state",
        policy="eval_helpers:zero", output=str(tmp_path / "ms.json"),
        env_factory=eval_helpers.in_process(eval_helpers.TeleportManiSkill),
        env_overrides={"sim_backend": "physx_cpu"},
    ))
    by_trial = {e.trial: e for e in res.episodes}
    assert sorted(by_trial) == [0, 1, 2, 3]
    for t, e in by_trial.items():
        assert e.steps == 50  # fair evaluation: terminations ignored, full horizon
        assert e.success == (t in (0, 2)) and e.success_at_end == (t in (0, 2))
        # the cube is put on the goal before the third step: success first holds after it
        assert e.success_step == (3 if t in (0, 2) else None)
    s = res.to_dict()["summary"]["overall"]
    assert s["rate"] == 0.5 and s["success_at_end_rate"] == 0.5
    assert res.header["protocol"]["name"] == "maniskill_fair_v1"
    assert "success at end" in Path(tmp_path / "ms.md").read_text()


@pytest.mark.maniskill
def test_maniskill_state_policy_video(tmp_path):
    # A state policy is filmed with the human camera (env render_images) instead of being
    # refused for want of image observations; the policy still sees states only.
    pytest.importorskip("mani_skill")
    res = evaluate(EvalRequest(
        env="maniskill", task="PushCube-v1", trials_per_task=1, num_envs=1, num_processes=0,
        obs_mode="state", max_steps=3, policy="random", video="failures",
        output=str(tmp_path / "st.json"), reports=False,
        env_overrides={"sim_backend": "physx_cpu", "sensor_size": 64},
    ))
    (ep,) = res.episodes
    assert not ep.success and ep.steps == 3 and ep.video
    import imageio.v3 as iio

    frames = iio.imread(tmp_path / ep.video)
    assert frames.shape[1:] == (64, 64, 3) and frames.shape[0] == 4  # reset frame + 3 steps
    assert frames.std() > 1.0  # a rendered scene, not a blank frame
    h = res.header
    assert h["obs_mode"] == "state" and h["env_config"]["render_images"] is True
    assert h["render_backend"].startswith("sapien (video frames only")
