"""Evaluation results do not depend on ``--num-envs`` or ``--num-processes`` (issue 38).

One checkpoint per policy family (MLP on states, CNN and a tiny OpenVLA-OFT on images; random
weights, built from config) is evaluated on ManiSkill PushCube and LIBERO-Spatial task 0 with
1, 3 and 8 envs in-process and with 3 envs in an env pool process (the default-suite LIBERO
case: 3 trials, 1 and 3 envs, pooled): every trial's return and success flags, and every
action the policy took (recorded per trial and query), are identical.
Without the batch-invariant path a batch of 3 rounds differently from a batch of 1 in the last
bits (CPU GEMM blocking depends on the batch size) and PushCube's contacts amplify it.

Kept small: 4 trials, 12 (ManiSkill) or 8 (LIBERO) steps, 64 px images. LIBERO keeps its hard
resets (``env.hard_reset``, the default): a soft reset keeps controller state from the slot's
previous episode, so there an episode depends on which episodes ran before it in its slot, hence
on ``--num-envs``, whatever the policy does.
The image-policy cases (CNN, OFT) take minutes on 2 CPU cores (rendering, model loading):
``slow``; the default suite keeps the state MLP on both simulators, and
tests/eval/test_batch_invariance.py checks every family's acting row by row.
"""

import numpy as np
import pytest
import torch
from rlinf_embodied.eval.request import EvalRequest

pytestmark = pytest.mark.timeout(1200)

H = 64
TRIALS = 4
RUNS = [(1, 0), (3, 0), (8, 0), (3, 1)]  # (--num-envs, --num-processes); 8 is capped at 4

# What each env gives the policy (checked by the evaluation against the checkpoint's spec).
SPECS = {
    ("maniskill", "state"): dict(state_dim=35),  # PushCube-v1, pd_ee_delta_pose
    ("maniskill", "rgb"): dict(state_dim=25, image_shape=(H, H, 3)),
    ("libero", "state"): dict(state_dim=8),
    ("libero", "rgb"): dict(state_dim=8, image_shape=(H, H, 3), wrist_image_shape=(H, H, 3)),
}
ENVS = {
    "maniskill": dict(env="maniskill", task="PushCube-v1", max_steps=12,
                      env_overrides={"sim_backend": "physx_cpu", "control_mode": "pd_ee_delta_pose",
                                     "sensor_size": H}),
    "libero": dict(env="libero", suite="libero_spatial", tasks=[0], max_steps=8,
                   num_settle_steps=0, image_size=H),  # hard resets (the default): see below
}


def _checkpoint(path, env, family):
    from rlinf_embodied.policies.base import SpaceSpec
    from rlinf_embodied.policies.registry import build_policy, save_policy

    spec = SpaceSpec(action_low=[-1.0] * 7, action_high=[1.0] * 7,
                     **SPECS[env, "state" if family == "mlp" else "rgb"])
    torch.manual_seed(0)
    if family == "mlp":
        from rlinf_embodied.policies.configuration_actor_critic import MLPPolicyConfig

        cfg = MLPPolicyConfig(hidden_sizes=[64, 64])
    elif family == "cnn":
        from rlinf_embodied.policies.configuration_actor_critic import CNNPolicyConfig

        cfg = CNNPolicyConfig(hidden_sizes=[64], conv_channels=[8, 16], conv_kernels=[8, 4],
                              conv_strides=[4, 2], image_feature_dim=32, state_feature_dim=32)
    else:
        from rlinf_embodied.policies.configuration_openvla import OpenVLAOFTPolicyConfig

        libero = env == "libero"
        cfg = OpenVLAOFTPolicyConfig(action_chunk=4, logprob_granularity="token",
                                     use_wrist_image=libero, use_proprio=libero, proprio_dim=8,
                                     max_prompt_tokens=192, critic=False)
    save_policy(build_policy(cfg, spec), path)
    return path


def _recorded(monkeypatch):
    """Record every action the evaluation's policy returns, per (task, trial, query)."""
    import rlinf_embodied.eval.run as run_mod

    log = {}
    real = run_mod.run_pairs

    def run_pairs(env, act, *args, **kwargs):
        def recording(obs, episodes=None):
            out = act(obs, episodes)
            for i, key in enumerate(episodes):
                if key is not None:
                    log[key] = np.array(out[i], copy=True)
            return out

        assert getattr(act, "per_episode", False)  # batch-invariant acting
        recording.per_episode = True
        return real(env, recording, *args, **kwargs)

    monkeypatch.setattr(run_mod, "run_pairs", run_pairs)
    return log


def _check_invariant(tmp_path, monkeypatch, env, family, runs=RUNS, trials=TRIALS):
    from rlinf_embodied.eval.run import evaluate

    pytest.importorskip("libero" if env == "libero" else "mani_skill")
    if family == "oft":
        pytest.importorskip("transformers")
    ckpt = _checkpoint(tmp_path / "policy", env, family)
    seen = {}
    log = _recorded(monkeypatch)
    for num_envs, procs in runs:
        log.clear()
        res = evaluate(EvalRequest(
            policy=str(ckpt), trials_per_task=trials, num_envs=num_envs, num_processes=procs,
            device="cpu", reports=False, output=str(tmp_path / f"{num_envs}_{procs}.json"),
            **ENVS[env]))
        assert res.header["batch_invariant"] is True
        assert res.header["num_envs"] == min(num_envs, trials)
        episodes = {e.trial: (e.episode_return, e.success, e.success_at_end, e.steps, e.error)
                    for e in res.episodes}
        assert sorted(episodes) == list(range(trials))
        assert all(e[4] is None for e in episodes.values()), episodes
        seen[num_envs, procs] = episodes, dict(log)
    (base, base_actions), queries = seen[runs[0]], len(seen[runs[0]][1])
    assert queries >= trials * 2
    for run, (episodes, actions) in seen.items():
        assert episodes == base, (run, episodes, base)
        assert actions.keys() == base_actions.keys(), run
        for key, a in actions.items():
            assert np.array_equal(a, base_actions[key]), (run, key)
    return base


@pytest.mark.maniskill
def test_maniskill_mlp_episodes_do_not_depend_on_num_envs(tmp_path, monkeypatch):
    base = _check_invariant(tmp_path, monkeypatch, "maniskill", "mlp")
    assert len({ret for ret, *_ in base.values()}) == TRIALS  # dense rewards: every trial its own


@pytest.mark.slow
@pytest.mark.maniskill
def test_maniskill_cnn_episodes_do_not_depend_on_num_envs(tmp_path, monkeypatch):
    _check_invariant(tmp_path, monkeypatch, "maniskill", "cnn")


@pytest.mark.libero
def test_libero_mlp_episodes_do_not_depend_on_num_envs(tmp_path, monkeypatch):
    # 3 trials (a LIBERO hard reset costs 0.5-1 s): batches of 1 and 3, in-process and pooled
    _check_invariant(tmp_path, monkeypatch, "libero", "mlp", [(1, 0), (3, 0), (3, 1)], 3)


@pytest.mark.slow
@pytest.mark.maniskill
def test_maniskill_oft_episodes_do_not_depend_on_num_envs(tmp_path, monkeypatch):
    _check_invariant(tmp_path, monkeypatch, "maniskill", "oft")


@pytest.mark.slow
@pytest.mark.libero
@pytest.mark.parametrize("family", ["cnn", "oft"])
def test_libero_image_policy_episodes_do_not_depend_on_num_envs(tmp_path, monkeypatch, family):
    _check_invariant(tmp_path, monkeypatch, "libero", family)
