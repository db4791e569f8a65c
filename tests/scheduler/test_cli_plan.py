"""`plan` backend: stable output, JSON, cached profiles."""

import dataclasses
import json

from rlinf_embodied.config import load_config
from rlinf_embodied.scheduler.auto import auto_plan, profile_config_key
from rlinf_embodied.cli_plan import plan_command
from rlinf_embodied.scheduler.profiler import save_profile
from rlinf_embodied.scheduler.profiles import analytic_default_profile
from tests.scheduler import scenarios

JOB = """
run: {{name: t, output_dir: {out}}}
env: {{type: maniskill, num_envs: 256}}
policy: {{type: openvla}}
trainer: {{rollout_steps: 50}}
"""


def _job(tmp_path):
    path = tmp_path / "job.yaml"
    path.write_text(JOB.format(out=tmp_path / "runs"))
    return str(path)


def test_plan_output_is_byte_identical_and_names_the_profile(tmp_path):
    job = _job(tmp_path)
    a = plan_command(job, 8, False, [])
    b = plan_command(job, 8, False, [])
    assert a == b
    assert "Profile: analytic default" in a and "Chosen:" in a and "Runner-ups:" in a
    # one iteration's samples, then the passes over them (256 envs x 50 steps, 4 epochs)
    assert "actor trains on 12800 samples x 4 epochs" in a, a
    assert plan_command(job, 8, True, []) == plan_command(job, 8, True, [])
    # on 1 CPU device the chosen collocated plan keeps state resident: the hint says the
    # shipped layout differs in that (it offloads at each switch)
    one = plan_command(job, 1, False, [])
    assert "offload: false" in one and ("placement=collocated (its shipped layout, which "
                                        "offloads at each switch where this plan keeps state "
                                        "resident)") in one, one


def test_plan_json_has_placement_and_overrides_apply(tmp_path):
    out = json.loads(plan_command(_job(tmp_path), 16, True, ["env.num_envs=512"]))
    assert out["devices"] == 16 and out["workload"]["num_envs"] == 512
    assert set(out["chosen"]["placement"]["groups"]) == {"env", "rollout", "actor"}
    assert out["chosen"]["predicted_iteration_s"] > 0


def test_cached_profile_in_run_dir_is_used(tmp_path):
    job = _job(tmp_path)
    cfg = load_config(job)
    _, prof = scenarios.embodied_maniskill_like()
    save_profile(cfg.run.run_dir(), profile_config_key(cfg), prof)
    text = plan_command(job, 8, False, [])
    assert "Profile: cached (measured" in text and "Chosen: hybrid" in text


def test_auto_plan_returns_runtime_placement_and_report(tmp_path):
    from rlinf_embodied.runtime.placement import PlacementPlan

    cfg = load_config(_job(tmp_path))
    placement, report = auto_plan(cfg, 8, tmp_path / "run")
    PlacementPlan.from_dict(placement).validate(8)
    import torch

    gpu = torch.cuda.device_count() > 0
    assert report["profile"] == analytic_default_profile("maniskill", "openvla", accelerator=gpu).source
    assert "pipeline_stages" in report["granularity"] and report["predicted_iteration_s"] > 0


def test_analytic_profile_on_cpu_devices_charges_no_offload():
    gpu = analytic_default_profile("maniskill", "openvla")
    cpu = analytic_default_profile("maniskill", "openvla", accelerator=False)
    assert gpu.components["env"].onload_s == 2.0 and gpu.components["actor"].offload_s == 8.0
    for name, c in cpu.components.items():
        assert (c.onload_s, c.offload_s) == (0.0, 0.0), name
        assert c.time_s == gpu.components[name].time_s  # only the swap costs change
    assert "CPU devices: offload costs 0 s" in cpu.source


def test_plan_says_when_cpu_devices_outnumber_the_cores(tmp_path, monkeypatch):
    import os

    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    job = _job(tmp_path)
    text = plan_command(job, 4, False, [])
    assert ("Note: 4 CPU devices on a 2-core machine share its cores" in text
            and "plan for --devices 2" in text), text
    assert "Note:" not in plan_command(job, 2, False, [])
    assert "Note" not in plan_command(job, 4, True, [])  # the JSON stays the same on any machine


def test_every_planned_placement_splits_the_envs_as_the_runtime_requires(tmp_path):
    # 16 envs: 3 or 5 env ranks would be refused by the runtime at start (the planner once
    # chose them); beyond what the job can use, the plan leaves devices idle
    from rlinf_embodied.runners.setup import check_divisibility, group_ranks
    from rlinf_embodied.runtime.placement import PlacementPlan

    main = "configs/maniskill_pushcube_ppo_mlp.yaml"
    cfg = load_config(main)
    for devices in (2, 3, 5, 7, 8, 1000):
        out = json.loads(plan_command(main, devices, True, []))
        for cand in [out["chosen"], *out["runner_ups"]]:
            ranks = group_ranks(PlacementPlan.from_dict(cand["placement"]), devices)
            stages = cand["granularity"]["pipeline_stages"]
            job = dataclasses.replace(cfg, trainer=dataclasses.replace(cfg.trainer, pipeline_stages=stages))
            check_divisibility(job, ranks["env"], ranks["actor"])  # raises when refused
        assert bool(out["notes"]) == (devices == 1000), (devices, out["notes"])
    text = plan_command(main, 1000, False, [])
    assert "Note: the plan uses 48 of the 1000 devices" in text, text
    assert ("temporal rejected: env on 48 device(s): its 16 shards (env.num_envs / "
            "algorithm.group_size) do not split evenly over 48 rank(s)") in text, text
    # the job's own placement is predicted, and marked when train would refuse it
    three = plan_command(main, 3, False, [])
    assert "Configured: placement=collocated" in three and "train refuses it here: Set env.num_envs" in three
    assert "train refuses" not in plan_command(main, 2, False, [])


def test_plan_prices_a_vla_by_its_parameter_count(tmp_path):
    import pytest
    import torch
    from rlinf_embodied.policies.size import parameter_count, safetensors_parameter_count
    from rlinf_embodied.scheduler.profiles import (ANALYTIC_POLICY_PARAMS, LORA_TRAINABLE_PER_RANK,
                                                   GiB)
    from safetensors.torch import save_file

    tiny = load_config(_job(tmp_path)).policy  # openvla, preset tiny, no checkpoint
    n = parameter_count(tiny)
    assert 1e5 < n < 1e7
    # a checkpoint directory is counted from its safetensors headers
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    save_file({"a": torch.zeros(3, 4), "b": torch.zeros(5)}, str(ckpt / "model.safetensors"))
    with_ckpt = dataclasses.replace(tiny, pretrained=str(ckpt))
    assert safetensors_parameter_count(ckpt) == 17 and parameter_count(with_ckpt) == 17
    # a checkpoint not here: unknown size (the published one is assumed)
    assert parameter_count(dataclasses.replace(tiny, pretrained=str(tmp_path / "nope"))) is None
    assert parameter_count(dataclasses.replace(tiny, type="mlp")) is None
    # memory scales with the count, times stay the published size's guesses
    full = analytic_default_profile("maniskill", "openvla")
    small = analytic_default_profile("maniskill", "openvla", policy_params=n)
    ratio = n / ANALYTIC_POLICY_PARAMS["openvla"]
    for name in ("rollout", "actor"):
        assert small.components[name].static_bytes == pytest.approx(
            full.components[name].static_bytes * ratio)
        assert small.components[name].time_s == full.components[name].time_s
    assert small.components["env"] == full.components["env"]
    assert f"memory scaled to {n / 1e6:.3g}M parameters" in small.source
    assert "7.5B parameters assumed (the published size)" in full.source
    # LoRA: frozen bf16 weights + the adapters' training state, activations unchanged
    lora = analytic_default_profile("maniskill", "openvla", lora_rank=32)
    share = 32 * LORA_TRAINABLE_PER_RANK
    assert lora.components["actor"].static_bytes == pytest.approx(
        full.components["actor"].static_bytes * (2 + 16 * share) / 16)
    assert lora.components["actor"].activation_bytes(64) == pytest.approx(
        full.components["actor"].activation_bytes(64))
    assert "LoRA rank 32" in lora.source
    # π0 has a row of its own (3.3B), not the MLP's
    assert analytic_default_profile("maniskill", "pi0").components["actor"].static_bytes == 55 * GiB
    # the plan of the tiny model: a few GiB per device, not the 7B model's 80
    out = json.loads(plan_command(_job(tmp_path), 2, True, []))
    assert out["chosen"]["peak_gib_per_device"] < 10 and out["configured"]["over_memory"] is None


def test_configured_plan_over_device_memory_says_why_it_is_not_chosen(tmp_path):
    job = _job(tmp_path)
    # a checkpoint that is not here is priced at the published 7.5B; 128 envs' whole-batch
    # update (no micro-batches) on 2 devices exceeds 80 GiB, so the search picks micro-batches
    args = ["policy.pretrained=/nowhere", "env.num_envs=128", "trainer.rollout_steps=12"]
    text = plan_command(job, 2, False, args)
    assert "; over the profile's device memory, so not searched: needs " in text, text
    assert json.loads(plan_command(job, 2, True, args))["configured"]["over_memory"].startswith("needs ")


def test_placement_auto_runs_the_planned_actor_micro_batch(tmp_path, monkeypatch, capsys):
    """train's placement=auto applies the plan's pipeline stages and actor micro-batch (what
    `plan` prints as `trainer.micro_batch_size=N`), unless the job sets its own micro-batch."""
    from types import SimpleNamespace

    import rlinf_embodied.scheduler.auto as auto
    from rlinf_embodied.runners import setup

    cfg = load_config(_job(tmp_path))
    assert cfg.trainer.micro_batch_size is None
    placement = {"context_switch": True, "offload": True,
                 "groups": {g: {"devices": "0"} for g in ("env", "rollout", "actor")}}
    report = {"text": "the plan", "granularity": {"pipeline_stages": 2, "micro_batch": {"actor": 7}}}
    monkeypatch.setattr(auto, "profile_for_config", lambda *a, **k: SimpleNamespace(source="cached"))
    monkeypatch.setattr(auto, "auto_plan", lambda *a, **k: (placement, report))
    _, out = setup._auto_placement(cfg, 1, tmp_path, "id")
    assert (out.trainer.pipeline_stages, out.trainer.micro_batch_size) == (2, 7)
    own = dataclasses.replace(cfg, trainer=dataclasses.replace(cfg.trainer, micro_batch_size=5))
    _, out = setup._auto_placement(own, 1, tmp_path, "id")
    assert out.trainer.micro_batch_size == 5
    assert ("placement=auto: keeping trainer.micro_batch_size=5 (the plan's: 7; set "
            "trainer.micro_batch_size=null to run the plan's)") in capsys.readouterr().out
    text = plan_command(_job(tmp_path), 2, False, [])
    assert "with trainer.micro_batch_size=" in text and "placement=auto plans and runs it" in text
