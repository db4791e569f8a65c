"""Suite demos are recorded longest task first (so that ``demos.processes`` workers finish
together) and reported in the suite's task order."""

from __future__ import annotations

from rlinf_embodied.envs.configuration_maniskill import ManiSkillEnvConfig
from rlinf_embodied.sft import vla_demos


def test_suite_demos_start_with_the_longest_task_and_report_in_suite_order(monkeypatch, tmp_path):
    started = []

    def fake_task(env_cfg, directory, env_id, instruction, n, seed, max_attempts, stride):
        started.append(env_id)
        return {"env_id": env_id, "path": str(tmp_path / f"{env_id}.h5"), "episodes": n,
                "steps": 10 * n, "planning_s": 0.0, "convert_s": 0.0, "log": [f"{env_id} done"]}

    monkeypatch.setattr(vla_demos, "_task_demos", fake_task)
    cfg = ManiSkillEnvConfig(suite="maniskill_lang3", obs_mode="rgb",
                             control_mode="pd_ee_delta_pose", sensor_size=64)
    logged = []
    out = vla_demos.generate_suite_demos(cfg, tmp_path, 3, processes=1, log=logged.append)
    assert started == ["StackCube-v1", "PushCube-v1", "PullCube-v1"]  # demo_steps 110, 70, 70
    assert list(out.paths) == ["PushCube-v1", "PullCube-v1", "StackCube-v1"]
    assert logged == ["PushCube-v1 done", "PullCube-v1 done", "StackCube-v1 done"]
    assert out.episodes == {"PushCube-v1": 3, "PullCube-v1": 3, "StackCube-v1": 3}


def test_a_tasks_demo_stride_overrides_demos_stride_when_recording_and_finding(monkeypatch,
                                                                               tmp_path):
    strides = {}

    def fake_task(env_cfg, directory, env_id, instruction, n, seed, max_attempts, stride):
        strides[env_id] = stride
        path = vla_demos.suite_demo_file(directory, env_cfg.suite, env_id, env_cfg.control_mode,
                                         env_cfg.sensor_size, stride)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"")
        path.with_suffix(".json").write_text("{}")
        return {"env_id": env_id, "path": str(path), "episodes": n, "steps": n,
                "planning_s": 0.0, "convert_s": 0.0, "log": []}

    monkeypatch.setattr(vla_demos, "_task_demos", fake_task)
    cfg = ManiSkillEnvConfig(suite="maniskill_lang3_peg", obs_mode="rgb",
                             control_mode="pd_ee_delta_pose", sensor_size=64)
    out = vla_demos.generate_suite_demos(cfg, tmp_path, 2, processes=1, stride=2)
    # LiftPegUpright's plans take 91-105 steps at stride 2: its demo_stride is 3
    assert strides == {"LiftPegUpright-v1": 3, "PushCube-v1": 2, "PullCube-v1": 2}
    assert out.paths["LiftPegUpright-v1"].name.endswith(".stride3.h5")
    found = vla_demos.find_suite_demos(tmp_path, cfg, 2)
    assert {e: p.name.split(".")[-2] for e, p in found.items()} == {
        "PushCube-v1": "stride2", "PullCube-v1": "stride2", "LiftPegUpright-v1": "stride3"}
    assert cfg.suite_spec().max_episode_steps == 100
