"""The scheduler plans the reasoning graph (rollout -> reward -> actor) too."""

import json

import pytest
from typer.testing import CliRunner

from rlinf_embodied.cli import app
from rlinf_embodied.config import load_config
from rlinf_embodied.reasoning.config import ReasoningJobConfig
from rlinf_embodied.runtime import PlacementPlan
from rlinf_embodied.scheduler.reasoning import (
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
    assert json.loads(j.output)["workload"]["responses"] == 128
