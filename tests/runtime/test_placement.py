import pytest

from rlinf_embodied.runtime.placement import PlacementError, PlacementPlan, parse_device_ids


def plan(groups, context_switch=True):
    return PlacementPlan.from_dict({"placement": {"context_switch": context_switch, "groups": groups}})


@pytest.mark.parametrize(
    "spec, expected",
    [("all", [0, 1, 2, 3]), ("0-3", [0, 1, 2, 3]), ("0,2", [0, 2]), ("0-1,3", [0, 1, 3]), ("2-", [2, 3]),
     (2, [2]), ([3, 1], [1, 3])],
)
def test_parse_device_ids(spec, expected):
    assert parse_device_ids(spec, 4) == expected


def test_modes_and_describe():
    collocated = plan({"env": {"devices": "all"}, "rollout": {}, "actor": {"devices": "0-3"}})
    assert collocated.mode(4) == "collocated"
    assert collocated.shares_devices("env", 4)
    disagg = plan({"env": {"devices": "0"}, "rollout": {"devices": "1"}, "actor": {"devices": "2-3"}}, False)
    assert disagg.mode(4) == "disaggregated"
    assert not disagg.shares_devices("actor", 4)
    hybrid = plan({"env": {"devices": 0}, "rollout": {"devices": 1, "procs_per_device": 2},
                   "actor": {"devices": "all"}})
    assert hybrid.mode(2) == "hybrid"
    text = hybrid.describe(2)
    assert text.startswith("placement: hybrid over 2 devices")
    assert "rollout  devices 1" in text and "-> 2 rank(s)" in text
    assert "takes turns with env, rollout" in text


def test_device_ids_outside_cluster():
    with pytest.raises(PlacementError, match=r"rollout\.devices '0-7' names device\(s\) \[4, 5, 6, 7\] "
                       r"outside this cluster's devices 0-3; .*cluster\.num_cpu_devices sets"):
        plan({"rollout": {"devices": "0-7"}}).validate(4)


def test_empty_groups_and_empty_device_sets():
    with pytest.raises(PlacementError, match="placement.groups is empty"):
        plan({}).validate(2)
    with pytest.raises(PlacementError, match=r"env\.devices is empty"):
        plan({"env": {"devices": ""}}).validate(2)
    with pytest.raises(PlacementError, match="not a device set"):
        plan({"env": {"devices": "3-1"}}).validate(4)


def test_sharing_without_context_switch():
    p = plan({"env": {"devices": "0-1"}, "actor": {"devices": "1-2"}}, context_switch=False)
    with pytest.raises(PlacementError, match=r"env and actor share devices \[1\] while "
                       r"placement.context_switch is false; set context_switch: true"):
        p.validate(4)


def test_unknown_keys_and_procs():
    with pytest.raises(PlacementError, match=r"unknown key\(s\) \['gpus'\]; valid keys: \['devices', 'procs_per_device'\]"):
        plan({"env": {"gpus": 1}})
    with pytest.raises(PlacementError, match="procs_per_device must be >= 1"):
        plan({"env": {"procs_per_device": 0}}).validate(2)
    with pytest.raises(PlacementError, match="no group 'rollout'"):
        plan({"env": {}}).group("rollout")


@pytest.mark.parametrize("name, mode", [("collocated", "collocated"), ("disaggregated", "disaggregated"),
                                        ("hybrid", "hybrid")])
def test_shipped_placement_configs(name, mode):
    from pathlib import Path

    path = Path(__file__).parents[2] / "configs" / "placement" / f"{name}.yaml"
    p = PlacementPlan.from_yaml(path)
    assert set(p.groups) == {"env", "rollout", "actor"}
    assert p.mode(3) == mode  # a CPU laptop: 3 device slots
    p.validate(8)
