"""A run's stored policy paths into its own run directory follow the directory when it is
copied or moved (:func:`~rlinf_embodied.runners.setup.rebase_policy_paths`)."""

from rlinf_embodied.config import load_config
from rlinf_embodied.runners.setup import rebase_policy_paths


def test_paths_inside_the_old_run_directory_move_and_others_stay(tmp_path):
    old, new = tmp_path / "runs" / "a", tmp_path / "runs" / "b"
    cfg = load_config("configs/gym_pointreach_ppo_mlp.yaml",
                      [f"policy.checkpoint={old / 'sft' / 'policy'}"])
    moved = rebase_policy_paths(cfg, old, new)
    assert moved.policy.checkpoint == str(new.resolve() / "sft" / "policy")
    assert moved.run == cfg.run and moved.env == cfg.env  # nothing else changes
    assert rebase_policy_paths(cfg, old, old).policy.checkpoint == cfg.policy.checkpoint
    # outside the run directory (a sibling whose name starts alike, too): as it is
    for other in (tmp_path / "policy", tmp_path / "runs" / "ab" / "sft" / "policy"):
        cfg = load_config("configs/gym_pointreach_ppo_mlp.yaml", [f"policy.checkpoint={other}"])
        assert rebase_policy_paths(cfg, old, new).policy.checkpoint == str(other)
    # a relative path (as the user wrote run.dir) stays relative
    cfg = load_config("configs/gym_pointreach_ppo_mlp.yaml", ["policy.checkpoint=runs/a/sft/policy"])
    assert rebase_policy_paths(cfg, "runs/a", "runs/b").policy.checkpoint == "runs/b/sft/policy"
    cfg = load_config("configs/gym_pointreach_ppo_mlp.yaml")
    assert cfg.policy.checkpoint is None and rebase_policy_paths(cfg, old, new) is cfg
