"""The main job's placement variants are the main job: only where things run may differ, so
bench_scheduler and the README compare placements of one job."""

import dataclasses
from pathlib import Path

import pytest

from rlinf_embodied.config import load_config

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
MAIN = CONFIGS / "maniskill_pushcube_ppo_mlp.yaml"


@pytest.mark.parametrize("variant", ["disaggregated", "hybrid"])
def test_placement_variant_differs_from_the_main_job_only_in_placement(variant):
    main = load_config(MAIN)
    other = load_config(CONFIGS / f"maniskill_pushcube_ppo_mlp_{variant}.yaml")
    assert other.placement != main.placement
    assert other.run.name == f"{main.run.name}_{variant}"
    same = lambda c: dataclasses.replace(  # noqa: E731
        c, run=dataclasses.replace(c.run, name="x"), placement=None,
        cluster=dataclasses.replace(c.cluster, num_cpu_devices=1))
    assert same(other) == same(main)
