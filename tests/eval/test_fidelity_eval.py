"""Evaluation records what ran and scores every env (issue 15 items 6, 8, 9) on real
gymnasium envs: per-query execution, returns with intervals, non-negative error bars, step
limits."""

import dataclasses
import math

import eval_helpers  # noqa: F401 (policy factories and envs by module name)
import numpy as np
import pytest
from rlinf_embodied.eval.report import write_reports
from rlinf_embodied.eval.request import EvalError, EvalRequest
from rlinf_embodied.eval.results import Episode, ResultsError, ResultsFile
from rlinf_embodied.eval.run import evaluate
from rlinf_embodied.eval.stats import mean_interval, t_quantile, wilson_interval

pytestmark = pytest.mark.timeout(120)


def test_zero_success_task_plots_with_two_tasks_of_three_trials(tmp_path):
    # Wilson's lower bound at 0/3 is 5.6e-17 in floats: the error bar was -5.6e-17 and
    # matplotlib refused it ("'yerr' must not contain negative values").
    for k in range(4):
        low, high = wilson_interval(k, 3)
        assert low <= k / 3 <= high
    assert wilson_interval(0, 3)[0] == 0.0 and wilson_interval(3, 3)[1] == 1.0
    header = {"env": "libero", "suite": "libero_spatial", "protocol": {"id": "p", "fingerprint": "f"},
              "policy": {"source": "x", "sha256": "0"}}
    eps = [Episode(task=t, trial=i, success=(t == 1 and i == 0), steps=3)
           for t in (0, 1) for i in range(3)]
    r = ResultsFile(tmp_path / "r.json", header, eps)
    r.save()
    paths = write_reports(r)
    assert paths["chart"].read_bytes()[:4] == b"\x89PNG"
    assert "| 0 |  | 3 | 0.0 | [0.0, 56.1] | 0 |" in paths["markdown"].read_text()


def test_env_without_success_reports_returns_and_execution(tmp_path):
    res = evaluate(EvalRequest(env="gym", task="CartPole-v1", policy="random", trials_per_task=5,
                               num_envs=2, num_processes=0, output=str(tmp_path / "cp.json")))
    for e in res.episodes:
        # CartPole pays 1 per step; a random policy queries once per step (K = 1).
        assert e.episode_return == e.steps and e.queries == e.steps
        assert e.action_chunk == 1 and e.open_loop_steps == 1 and e.head == "random"
    s = res.to_dict()["summary"]["per_task"]["CartPole-v1"]
    steps = [e.steps for e in res.episodes]
    mean, low, high = mean_interval(steps)
    assert s["mean_return"] == pytest.approx(np.mean(steps)) and s["return_ci95"] == [low, high]
    sd = np.std(steps, ddof=1)
    assert high - mean == pytest.approx(2.776 * sd / math.sqrt(5), rel=2e-3)  # t(0.975, 4)
    assert res.header["execution"]["head"] == "random"
    md = (tmp_path / "cp.md").read_text()
    assert "mean return [95% CI]" in md and f"{mean:.4g} [{low:.4g}, {high:.4g}]" in md


def test_chunked_policy_records_queries_and_open_loop_steps(tmp_path):
    res = evaluate(EvalRequest(env="gym", task="toy/PointReach-v0", policy="eval_helpers:reach_chunk4",
                               trials_per_task=3, num_envs=2, num_processes=0, reports=False,
                               output=str(tmp_path / "k4.json")))
    for e in res.episodes:
        assert e.success and e.action_chunk == 4 and e.open_loop_steps == 4
        assert e.queries == math.ceil(e.steps / 4)


def test_gym_entry_point_without_step_limit(tmp_path):
    from rlinf_embodied.checkpoint import checkpoint_dir
    from rlinf_embodied.policies.configuration_actor_critic import MLPPolicyConfig
    from rlinf_embodied.policies.base import SpaceSpec
    from rlinf_embodied.policies.registry import build_policy, save_policy

    req = dict(env="gym", task="eval_helpers:NeverEnds", trials_per_task=2, num_envs=2,
               num_processes=0, reports=False)
    with pytest.raises(EvalError, match="no step limit.*--max-steps"):
        evaluate(EvalRequest(policy="random", output=str(tmp_path / "a.json"), **req))
    assert not (tmp_path / "a.json").exists()
    # A training run's own env.max_episode_steps is used (and recorded in the protocol id).
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("env:\n  type: gym\n  max_episode_steps: 6\n")
    spec = SpaceSpec(action_low=[-1.0] * 2, action_high=[1.0] * 2, state_dim=3)
    with checkpoint_dir(run, "iter_000001") as d:
        save_policy(build_policy(MLPPolicyConfig(hidden_sizes=[4]), spec), d / "policy")
    res = evaluate(EvalRequest(policy=str(run), output=str(tmp_path / "b.json"), **req))
    assert [e.steps for e in res.episodes] == [6, 6]
    assert [e.episode_return for e in res.episodes] == [3.0, 3.0]
    assert res.header["max_steps"] == 6 and res.header["protocol"]["id"].endswith("+max_steps")
    res = evaluate(EvalRequest(policy="random", max_steps=4, output=str(tmp_path / "c.json"), **req))
    assert [e.steps for e in res.episodes] == [4, 4]


@pytest.mark.parametrize("df,q", [(1, 12.706), (2, 4.303), (3, 3.182), (4, 2.776), (9, 2.262),
                                  (29, 2.045), (120, 1.980)])
def test_t_quantile_table_values(df, q):
    # Student t table, two-sided 95% (e.g. NIST/SEMATECH e-Handbook, Table 1.4.2.3).
    assert t_quantile(0.975, df) == pytest.approx(q, abs=2e-3 * q)


def test_a_run_limit_equal_to_the_env_default_keeps_the_protocol(tmp_path):
    """A run directory trained with the env's registered step limit is evaluated under the
    plain protocol (its results pair with a random baseline's in eval compare); another limit
    is an override, recorded as +max_steps."""
    from rlinf_embodied.checkpoint import checkpoint_dir
    from rlinf_embodied.policies.configuration_actor_critic import MLPPolicyConfig
    from rlinf_embodied.policies.base import SpaceSpec
    from rlinf_embodied.policies.registry import build_policy, save_policy

    req = dict(env="gym", task="toy/PointReach-v0", trials_per_task=2, num_envs=2,
               num_processes=0, reports=False)
    base = evaluate(EvalRequest(policy="random", output=str(tmp_path / "r.json"), **req))
    ids = {}
    for limit in (50, 7):  # toy/PointReach-v0 registers 50 steps
        run = tmp_path / f"run{limit}"
        run.mkdir()
        (run / "config.yaml").write_text(f"env:\n  type: gym\n  max_episode_steps: {limit}\n")
        spec = SpaceSpec(action_low=[-1.0] * 2, action_high=[1.0] * 2, state_dim=4)
        with checkpoint_dir(run, "iter_000001") as d:
            save_policy(build_policy(MLPPolicyConfig(hidden_sizes=[4]), spec), d / "policy")
        res = evaluate(EvalRequest(policy=str(run), output=str(tmp_path / f"{limit}.json"), **req))
        ids[limit] = res.header["protocol"]["id"]
        assert res.header["max_steps"] == limit and max(e.steps for e in res.episodes) <= limit
    assert ids[50] == base.header["protocol"]["id"] and "+" not in ids[50]
    assert ids[7] == ids[50] + "+max_steps"


def _run_with_policy(run, env_yaml: str, spec) -> None:
    from rlinf_embodied.checkpoint import checkpoint_dir
    from rlinf_embodied.policies.configuration_actor_critic import MLPPolicyConfig
    from rlinf_embodied.policies.registry import build_policy, save_policy

    run.mkdir()
    (run / "config.yaml").write_text(env_yaml)
    with checkpoint_dir(run, "iter_000001") as d:
        save_policy(build_policy(MLPPolicyConfig(hidden_sizes=[4]), spec), d / "policy")


def test_a_run_is_evaluated_with_the_env_settings_it_trained_with(tmp_path, capsys):
    """The env constructor kwargs (gym) and control mode / camera size (ManiSkill) of a
    training run shape its policy's spaces; eval takes them from the run's config.yaml unless
    the request sets them, and records them."""
    from rlinf_embodied.policies.base import SpaceSpec

    run = tmp_path / "run"  # toy/PointReach-v0 with dim=3: 6 state dims, 3 action dims
    _run_with_policy(run, "env:\n  type: gym\n  env_id: toy/PointReach-v0\n  kwargs: {dim: 3}\n",
                     SpaceSpec(action_low=[-1.0] * 3, action_high=[1.0] * 3, state_dim=6))
    req = dict(env="gym", task="toy/PointReach-v0", trials_per_task=2, num_envs=2,
               num_processes=0, reports=False, policy=str(run))
    res = evaluate(EvalRequest(output=str(tmp_path / "a.json"), **req))
    assert res.header["env_config"]["kwargs"] == {"dim": 3} and len(res.episodes) == 2
    assert "kwargs={'dim': 3}" in capsys.readouterr().err
    # an explicit setting wins (and here no longer fits the policy)
    with pytest.raises(Exception, match=r"state dim 6 \(env: 4\)"):
        evaluate(EvalRequest(output=str(tmp_path / "b.json"), env_overrides={"kwargs": {"dim": 2}}, **req))
    # no --task: the run's env_id; another task: the run's gym settings are not applied
    res = evaluate(EvalRequest(**{**req, "task": None}, output=str(tmp_path / "t.json")))
    assert res.header["env_id"] == "toy/PointReach-v0" and res.header["env_config"]["kwargs"] == {"dim": 3}
    assert "--task toy/PointReach-v0 (the env_id of the policy's run" in capsys.readouterr().err
    other = tmp_path / "other"
    _run_with_policy(other, "env:\n  type: gym\n  env_id: toy/Countdown-v0\n  kwargs: {length: 9}\n",
                     SpaceSpec(action_low=[-1.0] * 2, action_high=[1.0] * 2, state_dim=4))
    res = evaluate(EvalRequest(**{**req, "policy": str(other)}, output=str(tmp_path / "o.json")))
    assert res.header["env_config"]["kwargs"] == {} and "env settings" not in capsys.readouterr().err
    with pytest.raises(EvalError, match="--env-override kwarg: not a gym env setting; valid: .*kwargs"):
        evaluate(EvalRequest(output=str(tmp_path / "k.json"), env_overrides={"kwarg": {}}, **req))
    with pytest.raises(EvalError, match="--output .* is a folder; pass the results file's path"):
        evaluate(EvalRequest(**{**req, "output": str(tmp_path)}))
    with pytest.raises(EvalError, match=r"the results file is JSON; name a .json file, e.g. "
                                        r"--output .*r\.json"):
        evaluate(EvalRequest(**{**req, "output": str(tmp_path / "r.txt")}))
    (tmp_path / "notes.json").write_text("my notes\n")  # eval would resume into it
    with pytest.raises(ResultsError, match=r"is not JSON .* To evaluate into .*notes.json, delete "
                                           r"it or pass another --output."):
        evaluate(EvalRequest(**{**req, "output": str(tmp_path / "notes.json")}))

    seen = []

    class Built(Exception):
        pass

    def factory(cfg):
        seen.append(cfg)
        raise Built

    ms = tmp_path / "ms"
    _run_with_policy(ms, "env:\n  type: maniskill\n  control_mode: pd_ee_delta_pose\n  sensor_size: 64\n",
                     SpaceSpec(action_low=[-1.0] * 7, action_high=[1.0] * 7, state_dim=3))
    for image_size, sensor in ((None, 64), (96, 96)):
        with pytest.raises(Built):
            evaluate(EvalRequest(env="maniskill", task="PickCube-v1", policy=str(ms), obs_mode="state",
                                 image_size=image_size, output=str(tmp_path / "c.json"),
                                 env_factory=factory, reports=False))
        assert (seen[-1].control_mode, seen[-1].sensor_size) == ("pd_ee_delta_pose", sensor)


def test_a_gym_run_is_evaluated_with_its_state_key_order(tmp_path):
    """A Dict observation's state vector follows the run's env.state_keys; with the default
    (sorted keys) order a trained policy would be fed its inputs permuted."""
    from rlinf_embodied.policies.base import SpaceSpec

    run = tmp_path / "run"
    _run_with_policy(run, "env:\n  type: gym\n  env_id: toy/Countdown-v0\n  kwargs: {with_image: true}\n"
                          "  image_keys: {pixels: main_images}\n  state_keys: [state]\n",
                     SpaceSpec(action_low=[-1.0], action_high=[1.0], state_dim=3))
    res = evaluate(EvalRequest(env="gym", task="toy/Countdown-v0", policy=str(run), obs_mode="state",
                               trials_per_task=1, num_envs=1, num_processes=0, reports=False,
                               max_steps=3, output=str(tmp_path / "a.json")))
    cfg = res.header["env_config"]
    assert cfg["state_keys"] == ["state"] and cfg["image_keys"] == {"pixels": "main_images"}
    # an explicit override of a setting the run trained with is taken (with a warning)
    res = evaluate(EvalRequest(env="gym", task="toy/Countdown-v0", policy=str(run), obs_mode="state",
                               trials_per_task=1, num_envs=1, num_processes=0, reports=False,
                               max_steps=3, output=str(tmp_path / "b.json"),
                               env_overrides={"kwargs": {"with_image": True, "length": 4}}))
    assert res.header["env_config"]["kwargs"] == {"with_image": True, "length": 4}
    from rlinf_embodied.eval.request import overridden_run_settings

    req = EvalRequest(env="gym", task="toy/Countdown-v0", policy=str(run), env_overrides={"kwargs": {"with_image": False},
                                                                          "state_keys": ["state"]})
    run_env = {"type": "gym", "env_id": "toy/Countdown-v0", "kwargs": {"with_image": True}, "state_keys": ["state"]}
    assert overridden_run_settings(req, run_env) == {"kwargs": {"with_image": False}}  # same state_keys: no warning
    assert overridden_run_settings(dataclasses.replace(req, task="toy/PointReach-v0"), run_env) == {}
