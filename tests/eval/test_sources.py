"""--policy SOURCE resolution: published OpenVLA/OFT directories, run directories, hashes."""

import numpy as np
import pytest
import torch
from rlinf_embodied.eval.protocols import get_protocol
from rlinf_embodied.eval.policy_files import PolicySourceError
from rlinf_embodied.eval.sources import PolicyContext, resolve_policy

SHAPES = {"states": (8,), "main_images": (32, 32, 3), "wrist_images": (32, 32, 3)}


def _ctx(n=2):
    return PolicyContext(np.full(7, -1.0), np.ones(7), False, n, "libero", "libero_spatial",
                         None, get_protocol("openvla_v1"), "cpu", SHAPES)


@pytest.mark.parametrize("kind,chunk", [("openvla", 1), ("openvla_oft", 8)])
def test_published_vla_directory(tmp_path, kind, chunk):
    pytest.importorskip("transformers")
    from rlinf_embodied.policies.base import SpaceSpec
    from rlinf_embodied.policies.registry import build_policy

    from rlinf_embodied.config import config_class

    spec = SpaceSpec(action_low=[-1.0] * 7, action_high=[1.0] * 7, state_dim=8,
                     image_shape=SHAPES["main_images"], wrist_image_shape=SHAPES["wrist_images"])
    build_policy(config_class("policy", kind)(type=kind, preset="tiny"), spec) \
        .save_pretrained_like(tmp_path / "vla")
    loaded = resolve_policy(str(tmp_path / "vla"), _ctx())
    assert loaded.kind == kind and len(loaded.sha256) == 64
    obs = {"main_images": np.zeros((2, 32, 32, 3), np.uint8),
           "wrist_images": np.zeros((2, 32, 32, 3), np.uint8),
           "states": np.zeros((2, 8), np.float32), "task_descriptions": ["open the drawer"] * 2}
    assert tuple(loaded.act(obs).shape) == (2, chunk, 7)
    if kind == "openvla_oft":
        with pytest.raises(PolicySourceError, match="published openvla_oft checkpoint but --policy-type"):
            resolve_policy(str(tmp_path / "vla"), _ctx(), expected_type="openvla")
    else:  # no head files: --policy-type openvla_oft reads it as a discrete-token OFT model
        as_oft = resolve_policy(str(tmp_path / "vla"), _ctx(), expected_type="openvla_oft")
        assert as_oft.kind == "openvla_oft" and tuple(as_oft.act(obs).shape) == (2, 8, 7)


def test_run_directory_resolves_latest_checkpoint(tmp_path):
    from rlinf_embodied.policies.base import SpaceSpec
    from rlinf_embodied.policies.registry import build_policy, save_policy

    from rlinf_embodied.checkpoint import checkpoint_dir
    from rlinf_embodied.policies.configuration_actor_critic import MLPPolicyConfig

    spec = SpaceSpec(action_low=[-1.0] * 7, action_high=[1.0] * 7, state_dim=8)
    with pytest.raises(PolicySourceError, match="no complete checkpoint yet"):
        (tmp_path / "run" / "checkpoints").mkdir(parents=True)
        resolve_policy(str(tmp_path / "run"), _ctx())
    for it in (1, 2):
        with checkpoint_dir(tmp_path / "run", f"iter_{it:06d}") as d:
            save_policy(build_policy(MLPPolicyConfig(hidden_sizes=[4]), spec), d / "policy")
    loaded = resolve_policy(str(tmp_path / "run"), _ctx())
    assert loaded.kind == "checkpoint" and loaded.path.endswith("iter_000002/policy")
    assert not loaded.needs_images
    assert tuple(loaded.act({"states": np.zeros((2, 8), np.float32)}).shape) == (2, 1, 7)
    assert resolve_policy("random", _ctx()).sha256 != loaded.sha256
    # --checkpoint best: checkpoints/best (written outside the rotation, latest unchanged)
    with pytest.raises(PolicySourceError, match="no checkpoints/best yet"):
        resolve_policy(str(tmp_path / "run"), _ctx(), checkpoint="best")
    torch.manual_seed(5)
    with checkpoint_dir(tmp_path / "run", "best", update_latest=False) as d:
        save_policy(build_policy(MLPPolicyConfig(hidden_sizes=[4]), spec), d / "policy")
    best = resolve_policy(str(tmp_path / "run"), _ctx(), checkpoint="best")
    assert best.path.endswith("checkpoints/best/policy") and best.sha256 != loaded.sha256
    obs = {"states": np.ones((2, 8), np.float32)}
    assert not np.allclose(np.asarray(best.act(obs)), np.asarray(loaded.act(obs)))
    assert resolve_policy(str(tmp_path / "run"), _ctx()).path == loaded.path  # still latest
    with pytest.raises(PolicySourceError, match="has no checkpoints/; pass the run directory"):
        resolve_policy(loaded.path, _ctx(), checkpoint="best")  # a checkpoint, not a run
    with pytest.raises(PolicySourceError, match="--policy random is none"):
        resolve_policy("random", _ctx(), checkpoint="best")
    with pytest.raises(PolicySourceError, match="must be one of latest, best .*--policy RUN/checkpoints/iter_NNNNNN"):
        resolve_policy(str(tmp_path / "run"), _ctx(), checkpoint="newest")


def test_a_file_as_policy_names_what_to_pass(tmp_path):
    import json

    from rlinf_embodied.eval.results import FORMAT

    results = tmp_path / "sft.json"
    results.write_text(json.dumps({"format": FORMAT, "header": {"policy": {"source": "runs/a"}}}))
    with pytest.raises(PolicySourceError, match=r"is an eval results file, not a policy; pass the "
                                                r"policy it evaluated \(--policy runs/a\)"):
        resolve_policy(str(results), _ctx())
    other = tmp_path / "notes.json"
    other.write_text("{}")
    with pytest.raises(PolicySourceError, match="is a file; pass its directory"):
        resolve_policy(str(other), _ctx())
