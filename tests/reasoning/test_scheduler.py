"""The scheduler plans the reasoning graph (rollout -> reward -> actor) too."""

import json

import pytest
from typer.testing import CliRunner

from rlinf_embodied.cli import app
from rlinf_embodied.config import load_config
from rlinf_embodied.reasoning.config import ReasoningJobConfig
from rlinf_embodied.runtime import PlacementPlan
from rlinf_embodied.scheduler.planner import granularity
from rlinf_embodied.reasoning.schedule import (
    _to_runtime_slots,
    plan_reasoning_config,
    reasoning_analytic_profile,
    reasoning_graph,
)


def _cfg(*overrides):
    return load_config("configs/reasoning_grpo_tiny.yaml", list(overrides), schema=ReasoningJobConfig)


def test_reasoning_graph_counts_responses():
    g = reasoning_graph(_cfg("rollout.prompts_per_step=8", "algorithm.group_size=4",
                             "trainer.update_epochs=2"))
    assert [(n.name, n.items) for n in g.nodes] == [("rollout", 32), ("reward", 32), ("actor", 64)]
    assert [s.members for s in g.stages()] == [("rollout",), ("reward",), ("actor",)]


@pytest.mark.parametrize("devices", [1, 4])
def test_plan_places_every_role_and_maps_reward_to_the_env_slot(devices):
    cfg = _cfg()
    result = plan_reasoning_config(cfg, devices, reasoning_analytic_profile(cfg))
    placement = _to_runtime_slots(result.placement())
    assert set(placement["groups"]) == {"rollout", "env", "actor"}
    plan = PlacementPlan.from_dict(placement)
    plan.validate(devices)
    if devices == 1:
        assert result.best.mode == "temporal" and placement["context_switch"]


def test_plan_cli_on_a_reasoning_config():
    r = CliRunner().invoke(app, ["plan", "configs/reasoning_grpo_tiny.yaml", "--devices", "4"])
    assert r.exit_code == 0, r.output
    assert "reward" in r.output and "Chosen:" in r.output and "analytic default (reasoning" in r.output
    j = CliRunner().invoke(app, ["plan", "configs/reasoning_grpo_tiny.yaml", "--devices", "2", "--json"])
    assert j.exit_code == 0, j.output
    assert json.loads(j.output)["workload"]["responses"] == 32 * 8  # prompts_per_step x G


def test_plan_cli_prints_the_configured_placement_and_no_duplicate_runner_up():
    r = CliRunner().invoke(app, ["plan", "configs/reasoning_grpo_tiny.yaml", "--devices", "1"])
    assert r.exit_code == 0, r.output
    assert "Configured: placement=collocated" in r.output
    chosen = r.output.split("Chosen: ")[1].splitlines()[0]
    runner_ups = r.output.split("Runner-ups:")[1].split("Why:")[0]
    assert chosen.split("  micro_batch")[0] not in runner_ups  # the chosen plan is not repeated
    j = CliRunner().invoke(app, ["plan", "configs/reasoning_grpo_tiny.yaml", "--devices", "3",
                                 "placement=disaggregated", "--json"])
    conf = json.loads(j.output)["configured"]
    assert conf["placement"] == "disaggregated" and conf["plan"].count("@") == 3
    assert conf["predicted_iteration_s"] > json.loads(j.output)["chosen"]["predicted_iteration_s"]


def test_placement_auto_resolves_from_a_cached_profile(tmp_path, capsys):
    """``placement: auto`` goes through the launcher's resolution to the scheduler's plan
    (a cached profile in the run directory skips the profiling run)."""
    from dataclasses import replace

    from rlinf_embodied.reasoning.launch import resolve_reasoning_placement
    from rlinf_embodied.scheduler.profiler import save_profile
    from rlinf_embodied.reasoning.schedule import _profile_key

    cfg = _cfg("placement=auto")
    prof = replace(reasoning_analytic_profile(cfg), source="measured (test)")
    save_profile(tmp_path, _profile_key(cfg), prof)

    class _Cluster:
        num_devices = 3

    plan = resolve_reasoning_placement(cfg, _Cluster(), tmp_path, "t")
    plan.validate(3)
    want = _to_runtime_slots(plan_reasoning_config(cfg, 3, prof).placement())
    assert plan == PlacementPlan.from_dict(want)
    assert [plan.device_ids(g, 3) for g in ("rollout", "env", "actor")] == [[0, 1, 2]] * 3
    planned = granularity(plan_reasoning_config(cfg, 3, prof).best.plan)["micro_batch"]["actor"]
    assert planned != cfg.trainer.micro_batch_size  # the job's 64 is kept, and that is said
    assert (f"placement=auto: keeping trainer.micro_batch_size={cfg.trainer.micro_batch_size} "
            f"(the plan's: {planned}; set trainer.micro_batch_size={planned}") in capsys.readouterr().out
