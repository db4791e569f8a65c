"""Protocol registry, overrides, fingerprints and simulator-version checks."""

import pytest
from rlinf_embodied.eval import protocols as P


def test_canonical_protocol_values():
    p = P.get_protocol("openvla_v1")
    assert p.id == "openvla_v1@v1"
    assert [p.max_steps_for(s) for s in P.LIBERO_SUITES] == [220, 280, 300, 520, 400]
    assert (p.num_settle_steps, p.settle_action) == (10, (0, 0, 0, 0, 0, 0, -1))
    assert (p.trials_per_task, p.image_size, p.rotate_180) == (50, 256, True)
    assert (p.env_seed, p.global_seed) == (0, 7)
    assert p.requires["mujoco"] == "==3.3.2"
    native = P.get_protocol("libero_native")
    assert (native.max_steps_for("libero_goal"), native.num_settle_steps,
            native.trials_per_task, native.image_size) == (600, 5, 20, 128)
    assert P.get_protocol("simplevla_512").max_steps_for("libero_10") == 512
    assert {"openvla_v1", "libero_native", "simplevla_512"} <= set(P.protocol_names("libero"))


def test_unknown_and_wrong_env():
    with pytest.raises(P.ProtocolError, match="Valid protocols: .*openvla_v1"):
        P.get_protocol("openvla_v2")
    with pytest.raises(P.ProtocolError, match="is for libero, not maniskill"):
        P.get_protocol("openvla_v1", env="maniskill")
    with pytest.raises(P.ProtocolError, match="at version 1, not v3"):
        P.get_protocol("openvla_v1@v3")


def test_overrides_change_id_and_fingerprint_but_not_trial_selection():
    p = P.get_protocol("openvla_v1")
    fewer = p.with_overrides(trials_per_task=5)
    assert fewer.trials_per_task == 5 and fewer.id == p.id
    assert fewer.fingerprint() == p.fingerprint()
    short = p.with_overrides(max_steps=30)
    assert short.id == "openvla_v1@v1+max_steps" and short.max_steps_for("libero_goal") == 30
    assert short.fingerprint() != p.fingerprint()
    assert short.to_dict()["overrides"] == {"max_steps": {"*": 30}}
    with pytest.raises(P.ProtocolError, match="valid fields"):
        p.with_overrides(colour="red")


def test_version_mismatch_warns_loudly(monkeypatch, capsys):
    monkeypatch.setattr(P, "installed_version", lambda d: {"mujoco": "3.4.0"}.get(d, "1.4.0"))
    with pytest.warns(P.SimulatorVersionWarning, match="mujoco 3.4.0 does not satisfy ==3.3.2"):
        problems = P.warn_versions(P.get_protocol("openvla_v1"))
    assert problems == ["mujoco 3.4.0 does not satisfy ==3.3.2"]
    assert "WARNING" in capsys.readouterr().err
