"""Protocol ``policy_mode``: greedy vs sampled actions of a real MLP checkpoint on
toy/PointReach-v0 (in-process gymnasium envs).

A sampled evaluation draws from the Gaussian head: with a wide log-std its episodes differ
from the greedy ones; with the log-std at -20 (std 2e-9 in [-1, 1] action units) they repeat
the greedy episodes; run twice, it repeats itself exactly.
"""

import numpy as np
import pytest
import torch
from rlinf_embodied.eval.policy_files import PolicySourceError
from rlinf_embodied.eval.protocols import ProtocolError, get_protocol
from rlinf_embodied.eval.request import EvalRequest
from rlinf_embodied.eval.run import evaluate
from rlinf_embodied.eval.sources import PolicyContext, resolve_policy

TASK = "toy/PointReach-v0"


def _checkpoint(path, log_std):
    from rlinf_embodied.policies.base import SpaceSpec
    from rlinf_embodied.policies.registry import build_policy, save_policy

    from rlinf_embodied.policies.configuration_actor_critic import MLPPolicyConfig

    spec = SpaceSpec(action_low=[-1.0, -1.0], action_high=[1.0, 1.0], state_dim=4)
    torch.manual_seed(3)
    policy = build_policy(MLPPolicyConfig(hidden_sizes=[16]), spec)
    with torch.no_grad():
        policy.action_head.log_std.fill_(log_std)
    save_policy(policy, path)
    return path


def _run(tmp_path, name, policy, mode, num_envs=2):
    res = evaluate(EvalRequest(env="gym", task=TASK, policy=str(policy), trials_per_task=4,
                               num_envs=num_envs, num_processes=0, output=str(tmp_path / name),
                               reports=False, policy_mode=mode))
    return res, {e.trial: (e.steps, round(e.episode_return, 6)) for e in res.episodes}


def test_sampled_evaluation_differs_when_wide_repeats_and_is_greedy_at_zero_std(tmp_path):
    wide = _checkpoint(tmp_path / "wide", 1.0)
    narrow = _checkpoint(tmp_path / "narrow", -20.0)  # same weights, std ~ 0
    greedy_res, greedy = _run(tmp_path, "g.json", wide, None)
    _, greedy_narrow = _run(tmp_path, "gn.json", narrow, "greedy")
    assert greedy == greedy_narrow  # the log-std does not enter the greedy action
    sample_res, sampled = _run(tmp_path, "s.json", wide, "sample")
    _, again = _run(tmp_path, "s2.json", wide, "sample")
    _, sampled_narrow = _run(tmp_path, "sn.json", narrow, "sample")
    assert sampled == again  # seeded by the protocol's global_seed
    assert sampled != greedy  # wide noise changes every trial's return
    assert all(sampled[t][1] != greedy[t][1] for t in greedy)
    assert sampled_narrow == greedy
    # recorded as a changed protocol, not comparable with the greedy one
    g, s = greedy_res.header["protocol"], sample_res.header["protocol"]
    assert (g["policy_mode"], s["policy_mode"]) == ("greedy", "sample")
    assert s["id"] == "seeded_v1@v1+policy_mode" and g["id"] == "seeded_v1@v1"
    assert s["fingerprint"] != g["fingerprint"]


def _ctx(mode, seed=0):
    protocol = get_protocol("seeded_v1").with_overrides(policy_mode=mode, global_seed=seed)
    return PolicyContext(np.full(2, -1.0), np.ones(2), False, 3, "gym", None, TASK, protocol,
                         "cpu", {"states": (4,)})


def test_sample_stream_is_its_own_and_seeded(tmp_path):
    ckpt = str(_checkpoint(tmp_path / "p", 0.0))
    obs = {"states": np.zeros((3, 4), np.float32)}

    def draws(seed, disturb):
        act = resolve_policy(ckpt, _ctx("sample", seed)).act
        out = []
        for _ in range(3):
            out.append(torch.as_tensor(act(obs)).clone())
            if disturb:
                torch.rand(100)  # another user of torch's global generator
        return torch.stack(out)

    a, b, c = draws(0, False), draws(0, True), draws(1, False)
    assert torch.equal(a, b)
    assert not torch.equal(a, c)
    assert not torch.equal(a[0], a[1])  # the stream advances between calls
    greedy = torch.as_tensor(resolve_policy(ckpt, _ctx("greedy")).act(obs))
    assert torch.equal(greedy, torch.as_tensor(resolve_policy(ckpt, _ctx("greedy")).act(obs)))
    assert not torch.equal(greedy, a[0])


def test_bad_policy_mode_and_sampling_a_plain_function():
    with pytest.raises(ProtocolError, match="policy_mode must be one of greedy, sample"):
        get_protocol("seeded_v1").with_overrides(policy_mode="argmax")
    with pytest.raises(PolicySourceError, match="--policy-mode greedy"):
        resolve_policy("eval_helpers:reach", _ctx("sample"))


def test_sampled_episodes_do_not_depend_on_num_envs(tmp_path):
    wide = _checkpoint(tmp_path / "wide", 1.0)
    _, greedy = _run(tmp_path, "g.json", wide, "greedy")
    _, two = _run(tmp_path, "s2.json", wide, "sample", num_envs=2)
    _, three = _run(tmp_path, "s3.json", wide, "sample", num_envs=3)  # other batch neighbours
    _, one = _run(tmp_path, "s1.json", wide, "sample", num_envs=1)
    assert two == three == one  # (steps, return) of every trial
    assert all(two[t][1] != greedy[t][1] for t in greedy)  # and they are sampled


def test_report_title_names_the_run_checkpoint_it_evaluated(tmp_path):
    import json

    from rlinf_embodied.checkpoint import checkpoint_dir
    from rlinf_embodied.eval.report import markdown_table
    from rlinf_embodied.policies.registry import load_policy, save_policy

    policy = load_policy(_checkpoint(tmp_path / "p", 0.0))
    run = tmp_path / "run"  # a training run directory as the runner writes it
    for name, it, latest in (("iter_000004", 4, True), ("best", 2, False)):
        with checkpoint_dir(run, name, update_latest=latest) as d:
            save_policy(policy, d / "policy")
            (d / "runner_state.json").write_text(json.dumps({"iteration": it, "env_steps": 0}))
    titles = {}
    for which in ("latest", "best"):
        res = evaluate(EvalRequest(env="gym", task=TASK, policy=str(run), checkpoint=which,
                                   trials_per_task=1, num_envs=1, num_processes=0,
                                   output=str(tmp_path / f"{which}.json"), reports=False))
        titles[which] = markdown_table(res).splitlines()[0]
    assert titles["latest"].endswith(f"policy {run} (latest checkpoint, iteration 4)**")
    assert titles["best"].endswith(f"policy {run} (best checkpoint, iteration 2)**")


def test_policy_mode_errors_name_the_flag_and_the_modes(tmp_path):
    from rlinf_embodied.eval.cli import eval_app
    from rlinf_embodied.eval.report import CompareError, compare
    from typer.testing import CliRunner

    out = CliRunner().invoke(eval_app, ["--env", "gym", "--task", TASK, "--policy", "random",
                                        "--policy-mode", "argmax", "-o", str(tmp_path / "x.json")])
    assert out.exit_code == 2
    assert "--policy-mode must be one of greedy, sample (got 'argmax')" in out.output
    ckpt = _checkpoint(tmp_path / "p", 0.0)
    greedy, _ = _run(tmp_path, "g.json", ckpt, "greedy")
    sampled, _ = _run(tmp_path, "s.json", ckpt, "sample")
    with pytest.raises(CompareError) as e:
        compare(greedy, sampled)
    msg = str(e.value)
    assert "policy_mode greedy (g.json) vs sample (s.json)" in msg
    assert "--policy-mode (greedy or sample)" in msg and "--protocol" not in msg
