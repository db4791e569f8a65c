"""Reports, compare, and CLI errors (typer runner; gymnasium toy env and LIBERO metadata)."""

import json
from pathlib import Path
from html.parser import HTMLParser

import pytest
import typer
from rlinf_embodied.eval.cli import eval_app, parse_tasks
from rlinf_embodied.eval.report import CompareError, compare, write_reports
from rlinf_embodied.eval.results import Episode, ResultsFile
from typer.testing import CliRunner

runner = CliRunner()


def _results(path, protocol_id="openvla_v1@v1", fp="abc", successes=(1, 1, 0, 0), **h):
    header = {"env": "libero", "suite": "libero_spatial",
              "protocol": {"id": protocol_id, "fingerprint": fp, "max_steps": {"*": 1}},
              "policy": {"source": "x", "sha256": "0"}, **h}
    eps = [Episode(task=t, trial=i, success=bool(s), steps=5, instruction=f"task {t}")
           for t in (0, 1) for i, s in enumerate(successes)]
    r = ResultsFile(path, header, eps)
    r.save()
    return r


def test_reports_exist_and_html_parses(tmp_path):
    r = _results(tmp_path / "a.json")
    paths = write_reports(r.path)
    md = paths["markdown"].read_text()
    assert "| 0 | task 0 | 4 | 50.0 | [15.0, 85.0] | 0 |" in md
    assert "**50.0**" in md
    assert paths["chart"].read_bytes()[:4] == b"\x89PNG"
    cells = []

    class P(HTMLParser):
        def handle_data(self, data):
            cells.append(data.strip())

    p = P()
    p.feed(paths["html"].read_text())
    p.close()
    assert "task 0" in cells and "50.0" in cells
    summary = json.loads((tmp_path / "a.json").read_text())["summary"]
    assert summary["per_task"]["0"]["ci95"] == pytest.approx([0.15004, 0.84996], abs=1e-4)


def test_compare_pairs_and_refuses_other_protocols(tmp_path):
    a = _results(tmp_path / "a.json", successes=(1, 1, 0, 0))
    b = _results(tmp_path / "b.json", successes=(1, 1, 1, 1))
    c = compare(a, b)
    assert c.overall["pairs"] == 8 and c.overall["diff"] == pytest.approx(0.5)
    m = c.overall["mcnemar"]
    assert (m.b, m.c, m.method) == (0, 4, "exact") and m.p_value == pytest.approx(0.125)
    other = _results(tmp_path / "o.json", protocol_id="libero_native@v1", fp="def")
    with pytest.raises(CompareError, match="different protocols.*--force"):
        compare(a, other)
    assert compare(a, other, force=True).warnings[0].startswith("forced: different protocols")
    out = runner.invoke(eval_app, ["compare", str(a.path), str(other.path)])
    assert out.exit_code == 2 and "different protocols" in out.output
    # another suite (and so another protocol): the advice is to evaluate the same task
    maniskill = _results(tmp_path / "m.json", protocol_id="maniskill_lang3_v1@v1", fp="m",
                         env="maniskill", suite="maniskill_lang3")
    with pytest.raises(CompareError, match=r"different env: 'libero' vs 'maniskill'.*evaluate "
                       r"both with the same --env and --task \(or --suite\)") as e:
        compare(a, maniskill)
    assert "--protocol" not in str(e.value)
    # the same protocol with another step limit: the re-run's flag is named, with its value
    short = _results(tmp_path / "s.json", protocol_id="openvla_v1@v1+max_steps", fp="ghi")
    for r, steps in ((a, 220), (short, 40)):
        r.header["protocol"].update(name="openvla_v1", max_steps={"libero_spatial": steps})
        r.save()
    with pytest.raises(CompareError, match=r"Both are openvla_v1 with other max_steps: re-run "
                       r"the evaluation of s.json with --max-steps 220 \(as a.json\) or that of "
                       r"a.json with --max-steps 40 \(as s.json\)"):
        compare(a, short)
    a.header["protocol"]["max_steps"] = {}  # the env's registered limit: no flag given
    a.save()
    with pytest.raises(CompareError, match=r"re-run the evaluation of s.json without --max-steps "
                       r"\(as a.json\) or that of a.json with --max-steps 40 \(as s.json\) into a new -o file"):
        compare(a, short)
    out = runner.invoke(eval_app, ["compare", str(a.path), str(b.path)])
    assert out.exit_code == 0 and "McNemar" in out.output and "0.125 (exact)" in out.output
    out = runner.invoke(eval_app, ["compare", str(a.path), str(tmp_path / "missing.json")])
    assert out.exit_code == 2 and "does not exist" in out.output


def test_compare_warns_about_an_unfinished_results_file(tmp_path):
    a = _results(tmp_path / "a.json", tasks=[0, 1], trials_per_task=4)
    b = _results(tmp_path / "b.json", tasks=[0, 1], trials_per_task=6)  # 8 of 12 written
    c = compare(a, b)
    assert c.warnings == [f"{b.path} is unfinished: 8 of 12 episodes (2 tasks x 6 trials); run "
                          "its eval command again to finish it (it resumes)."]
    out = runner.invoke(eval_app, ["compare", str(a.path), str(b.path)])
    assert out.exit_code == 0 and "WARNING: " + c.warnings[0] in out.output


def test_cli_runs_gym_eval(tmp_path):
    out = tmp_path / "r.json"
    res = runner.invoke(eval_app, ["--env", "gym", "--task", "toy/PointReach-v0", "--policy",
                                   "eval_helpers:reach", "--trials-per-task", "3",
                                   "--num-envs", "2", "--num-processes", "0", "-o", str(out)])
    assert res.exit_code == 0, res.output
    assert len(ResultsFile.load(out).episodes) == 3 and (tmp_path / "r.html").exists()


@pytest.mark.parametrize("args,message", [
    (["--env", "libero", "--suite", "libero_spatail"], "valid suites: libero_spatial"),
    (["--env", "libero", "--suite", "libero_goal", "--tasks", "10"], "valid ids are 0..9"),
    (["--env", "libero", "--suite", "libero_goal", "--trials-per-task", "51"],
     "only 50 stored initial states"),
    (["--env", "libero", "--suite", "libero_goal", "--protocol", "openvla_v9"],
     "Valid protocols: libero_native, openvla_v1"),
    (["--env", "libero", "--suite", "libero_goal", "--video", "sometimes"],
     "--video must be one of none, failures, all"),
    (["--env", "gym", "--task", "toy/PointReach-v0", "--policy", "no/such/dir"],
     "no such file or directory"),
    (["--env", "gym", "--task", "toy/PointReach-v0", "--policy", "eval_helpers:nope"],
     "has no callable 'nope'"),
    (["--env", "gym", "--task", "toy/PointReach-v0", "--policy", "eval_helpers:broken"],
     "--policy eval_helpers:broken: the factory raised RuntimeError: no weights in ./ckpt (at "),
    # errors of the config / protocol fields a flag sets name the flag
    (["--env", "gym", "--task", "toy/PointReach-v0", "--trials-per-task", "0"],
     "--trials-per-task must be >= 1 (got 0)"),
    (["--env", "gym", "--task", "toy/PointReach-v0", "--max-steps", "0"],
     "--max-steps must be >= 1"),
    (["--env", "gym", "--task", "toy/PointReach-v0", "--num-settle-steps", "-1"],
     "--num-settle-steps must be >= 0 (got -1)"),
    (["--env", "gym", "--task", "toy/PointRaech-v0"], "--task='toy/PointRaech-v0' is not a registered gymnasium env. Did you mean 'toy/PointReach-v0'"),
])
def test_cli_bad_input(tmp_path, args, message):
    if "--policy" not in args:
        args = args + ["--policy", "random"]
    res = runner.invoke(eval_app, args + ["-o", str(tmp_path / "x.json"), "--num-processes", "0"])
    assert res.exit_code == 2, res.output
    assert message in res.output


def test_checkpoint_type_and_env_mismatch(tmp_path):
    from rlinf_embodied.policies.base import SpaceSpec
    from rlinf_embodied.policies.registry import build_policy, save_policy

    from rlinf_embodied.policies.configuration_actor_critic import MLPPolicyConfig

    spec = SpaceSpec(action_low=[-1.0, -1.0], action_high=[1.0, 1.0], state_dim=4)
    save_policy(build_policy(MLPPolicyConfig(hidden_sizes=[8]), spec), tmp_path / "ckpt")
    base = ["--env", "gym", "--task", "toy/PointReach-v0", "--num-processes", "0",
            "--trials-per-task", "2", "-o", str(tmp_path / "c.json")]
    res = runner.invoke(eval_app, base + ["--policy", str(tmp_path / "ckpt"),
                                          "--policy-type", "cnn"])
    assert res.exit_code == 2 and "holds a 'mlp' policy, not --policy-type cnn" in res.output
    res = runner.invoke(eval_app, ["--env", "gym", "--task", "CartPole-v1", "--num-processes",
                                   "0", "--policy", str(tmp_path / "ckpt"), "-o",
                                   str(tmp_path / "d.json")])
    assert res.exit_code == 2 and "does not match this env" in res.output
    res = runner.invoke(eval_app, base + ["--policy", str(tmp_path / "ckpt")])
    assert res.exit_code == 0, res.output  # the matching env evaluates it


def test_mismatch_hint_names_the_run_s_env(tmp_path):
    from rlinf_embodied.eval.policy_fit import training_env_hint as _training_env_hint

    ckpt = tmp_path / "run" / "checkpoints" / "iter_1"
    ckpt.mkdir(parents=True)
    (tmp_path / "run" / "config.yaml").write_text(
        "env: {type: maniskill, env_id: PushCube-v1, control_mode: pd_ee_delta_pose, "
        "sensor_size: 64, obs_mode: rgb}\n")
    # the same env type: the settings that differ within it
    assert _training_env_hint(ckpt, "maniskill") == (
        ": --env-override control_mode=pd_ee_delta_pose --env-override sensor_size=64 --obs-mode rgb")
    # another env type: that type and task first; its ManiSkill settings mean nothing to gym
    assert _training_env_hint(ckpt, "gym") == ": --env maniskill --task PushCube-v1"
    assert _training_env_hint(tmp_path, "gym") == ""  # no run config
    # LIBERO: the protocol fixes the image size; a run trained at another names --image-size
    (tmp_path / "run" / "config.yaml").write_text(
        "env: {type: libero, suite: libero_spatial, image_size: 64, obs_mode: rgb}\n")
    assert _training_env_hint(ckpt, "libero") == ": --image-size 64 --obs-mode rgb"


def test_parse_tasks_and_wiring():
    assert parse_tasks("0,3") == [0, 3] and parse_tasks("2-4") == [2, 3, 4]
    assert parse_tasks(None) is None and parse_tasks("all") is None
    with pytest.raises(ValueError, match="0,3 or 0-4"):
        parse_tasks("a,b")
    app = typer.Typer()
    app.add_typer(eval_app, name="eval")
    res = runner.invoke(app, ["eval", "protocols"])
    assert res.exit_code == 0 and "openvla_v1@v1" in res.output


def test_compare_refuses_other_env_kwargs_and_warns_about_other_observations(tmp_path):
    env = {"env_id": "toy/PointReach-v0", "kwargs": {"dim": 2}, "state_keys": ["pos", "goal"],
           "num_envs": 4, "video": False}
    a = _results(tmp_path / "a.json", env_config=env)
    # how the evaluation ran (num_envs, video) is no difference
    same = _results(tmp_path / "s.json", env_config={**env, "num_envs": 1, "video": True})
    assert compare(a, same).warnings == []
    # nor is the reward an RL run trained on (success does not depend on it)
    sparse = _results(tmp_path / "r.json", env_config={**env, "reward_mode": "sparse"})
    assert compare(_results(tmp_path / "d.json", env_config={**env, "reward_mode": "dense"}),
                   sparse).warnings == []
    # an env type that writes no kwargs as None and one that writes {} set the same task
    none = {**env, "kwargs": None}
    assert compare(_results(tmp_path / "n.json", env_config=none),
                   _results(tmp_path / "e.json", env_config={**env, "kwargs": {}})).warnings == []
    harder = _results(tmp_path / "k.json", env_config={**env, "kwargs": {"dim": 3}})
    with pytest.raises(CompareError, match=r"the task itself\): kwargs: \{'dim': 2\} vs \{'dim': 3\}.*--env-override"):
        compare(a, harder)
    assert "forced: different env settings" in compare(a, harder, force=True).warnings[0]
    reordered = _results(tmp_path / "o.json", env_config={**env, "state_keys": ["goal", "pos"]})
    (w,) = compare(a, reordered).warnings
    assert "different env settings" in w and "state_keys: ['pos', 'goal'] vs ['goal', 'pos']" in w
    out = runner.invoke(eval_app, ["compare", str(a.path), str(reordered.path)])
    assert out.exit_code == 0 and "WARNING: the policies ran with different env settings" in out.output
    # results written before headers recorded env_config pair as before
    assert compare(_results(tmp_path / "old.json"), a).warnings == []
    (w,) = compare(a, a.path).warnings
    assert "A and B are the same file" in w


@pytest.mark.parametrize("at_end", [False, True])
def test_html_table_rows_have_the_header_s_columns(tmp_path, at_end):
    # Empty Markdown cells ("| |") must stay empty cells, not become a literal "|".
    from rlinf_embodied.eval.report import _md_to_html_table, markdown_table

    r = _results(tmp_path / "a.json")
    if at_end:
        r.episodes = [Episode(task=e.task, trial=e.trial, success=e.success, steps=5,
                              instruction=e.instruction, success_at_end=e.success)
                      for e in r.episodes]
    html_table = _md_to_html_table(markdown_table(r))
    widths = [ln.count("<td>") + ln.count("<th>") for ln in html_table.splitlines()
              if ln.startswith("<tr>")]
    assert len(set(widths)) == 1 and widths[0] == (7 if at_end else 6), html_table
    assert "<td>|</td>" not in html_table
    avg = next(ln for ln in html_table.splitlines() if "average" in ln)
    assert "<td>50.0</td>" in avg
    # an env id as the instruction (gym, a ManiSkill task) is not repeated in its column
    r.episodes = [Episode(task="toy/PointReach-v0", trial=0, success=True, steps=5,
                          instruction="toy/PointReach-v0")]
    assert "| toy/PointReach-v0 |  | 1 |" in markdown_table(r)


def test_video_without_images_is_refused_and_leaves_no_results_file(tmp_path):
    out = tmp_path / "v.json"
    base = ["--env", "gym", "--task", "toy/PointReach-v0", "--policy", "random",
            "--trials-per-task", "1", "--num-envs", "1", "--num-processes", "0", "-o", str(out)]
    for extra in ([], ["--obs-mode", "rgb"]):
        res = runner.invoke(eval_app, base + ["--video", "all", *extra])
        assert res.exit_code == 2, res.output
        assert "use --video none" in res.output, res.output
        assert not out.exists()  # a retry starts afresh instead of "resuming" a header
    res = runner.invoke(eval_app, base + ["--obs-mode", "state", "--video", "all"])
    assert res.exit_code == 2 and "--video needs image observations for --env gym" in res.output
    assert "use --video none" in res.output
    res = runner.invoke(eval_app, base)  # the fix named: no video
    assert res.exit_code == 0 and len(ResultsFile.load(out).episodes) == 1, res.output
    stem = out.with_suffix("")
    assert f"reports: {stem}.md, {stem}.png, {stem}.html" in res.output  # where they went
    assert all(Path(f"{stem}{ext}").is_file() for ext in (".md", ".png", ".html"))
    assert "videos:" not in res.output


def test_rgb_for_a_state_checkpoint_is_refused_up_front(tmp_path):
    from rlinf_embodied.policies.base import SpaceSpec
    from rlinf_embodied.policies.configuration_actor_critic import MLPPolicyConfig
    from rlinf_embodied.policies.registry import build_policy, save_policy

    spec = SpaceSpec(action_low=[-1.0, -1.0], action_high=[1.0, 1.0], state_dim=4)
    save_policy(build_policy(MLPPolicyConfig(hidden_sizes=[8]), spec), tmp_path / "ckpt")
    res = runner.invoke(eval_app, ["--env", "gym", "--task", "toy/PointReach-v0", "--policy",
                                   str(tmp_path / "ckpt"), "--obs-mode", "rgb",
                                   "-o", str(tmp_path / "r.json")])
    assert res.exit_code == 2, res.output
    assert "reads state observations only" in res.output and "--obs-mode state or auto" in res.output
    assert not (tmp_path / "r.json").exists()


def test_run_on_a_user_env_type_is_evaluated_with_its_settings(tmp_path):
    # a training run whose env.type is a user's module:Class (tests/plugins/lab_components.py)
    from rlinf_embodied.checkpoint import checkpoint_dir
    from rlinf_embodied.policies.base import SpaceSpec
    from rlinf_embodied.policies.configuration_actor_critic import MLPPolicyConfig
    from rlinf_embodied.policies.registry import build_policy, save_policy

    env_type = "tests.plugins.lab_components:FixedGoalEnv"
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text(
        f"env: {{type: '{env_type}', env_id: toy/PointReach-v0, goal_radius: 0.3, num_envs: 64, "
        "max_episode_steps: 20, video: false, video_dir: videos, seed: 3, num_processes: 2, "
        "vectorization: async, kwargs: {}}\n")  # as a run writes it: the whole env section
    spec = SpaceSpec(action_low=[-1.0, -1.0], action_high=[1.0, 1.0], state_dim=4)
    with checkpoint_dir(run, "iter_000001") as d:
        save_policy(build_policy(MLPPolicyConfig(hidden_sizes=[8]), spec), d / "policy")
    out = tmp_path / "u.json"
    res = runner.invoke(eval_app, ["--policy", str(run), "--trials-per-task", "3", "--num-envs",
                                   "2", "--num-processes", "0", "-o", str(out)])
    assert res.exit_code == 0, res.output
    assert f"--env {env_type} (the env type of the policy's run" in res.output
    results = ResultsFile.load(out)
    assert results.header["env"] == env_type and len(results.episodes) == 3
    assert results.header["env_config"]["goal_radius"] == 0.3  # the run's own setting
    assert results.header["env_config"]["max_episode_steps"] == 20
    # another env class of the user's: its own default env_id; a policy class is no env
    res = runner.invoke(eval_app, ["--policy", str(run), "--env", "tests.plugins.lab_components:CameraReachEnv",
                                   "--trials-per-task", "2", "--num-envs", "2", "--num-processes",
                                   "0", "-o", str(tmp_path / "c.json")])
    assert res.exit_code == 0, res.output  # its states are the 4-d ones the MLP reads
    assert ResultsFile.load(tmp_path / "c.json").header["env_config"]["env_id"] == "toy/PointReach-v0"
    res = runner.invoke(eval_app, ["--policy", "random", "--env", "tests.plugins.lab_components:ScaledMLPPolicy",
                                   "-o", str(tmp_path / "p.json")])
    assert res.exit_code == 2 and "is not an env class" in res.output, res.output
    # an --env that is neither a family nor a module:Class names both
    res = runner.invoke(eval_app, ["--env", "gymm", "--task", "x", "--policy", "random",
                                   "-o", str(tmp_path / "x.json")])
    assert res.exit_code == 2 and "valid: gym, libero, maniskill, or a package.module:Class" in res.output


def test_a_suite_run_is_evaluated_on_its_own_tasks_unless_the_suite_is_named():
    from rlinf_embodied.eval.families import FAMILIES
    from rlinf_embodied.eval.request import EvalRequest, adopt_run_env

    run_env = {"type": "maniskill", "suite": "maniskill_lang3", "task_ids": [0, 1]}
    said = []
    req = adopt_run_env(EvalRequest(env=None, policy="run"), run_env, "run/config.yaml", FAMILIES, said.append)
    assert (req.env, req.suite, req.tasks, req.task) == ("maniskill", "maniskill_lang3", [0, 1], None)
    assert said[-1].startswith("eval: --tasks 0,1 (the tasks the policy's run trained on; "
                               "--suite maniskill_lang3 evaluates every task)")
    # a LIBERO run's suite too (the fresh-user trial: `--env libero needs --suite` before)
    req = adopt_run_env(EvalRequest(env=None, policy="run"), {"type": "libero", "suite": "libero_spatial"},
                        "c", FAMILIES, said.append)
    assert (req.env, req.suite, req.tasks) == ("libero", "libero_spatial", None)
    assert said[-1] == "eval: --suite libero_spatial (the suite of the policy's run, c)."
    # an explicit --suite (or --tasks) is the user's choice
    req = adopt_run_env(EvalRequest(env=None, policy="run", suite="maniskill_lang3"), run_env, "c", FAMILIES, said.append)
    assert req.tasks is None
    req = adopt_run_env(EvalRequest(env=None, policy="run", tasks=[2]), run_env, "c", FAMILIES, said.append)
    assert req.tasks == [2]
    with pytest.raises(Exception, match="--env is required"):
        adopt_run_env(EvalRequest(env=None, policy="random"), {}, None, FAMILIES, said.append)
    # a suite names its env (a checkpoint without its run's config, or random)
    for suite, env in (("maniskill_lang3", "maniskill"), ("libero_spatial", "libero")):
        req = adopt_run_env(EvalRequest(env=None, policy="random", suite=suite), {}, None, FAMILIES, said.append)
        assert (req.env, req.suite) == (env, suite) and said[-1] == f"eval: --env {env} (the env of --suite {suite})."
    with pytest.raises(Exception, match=r"^Unknown --suite 'maniskill_lang'\. Did you mean 'maniskill_lang3'\? "
                                        r"Registered suites: .*libero_spatial.*maniskill_lang3"):
        adopt_run_env(EvalRequest(env=None, policy="random", suite="maniskill_lang"), {}, None, FAMILIES, said.append)
    with pytest.raises(Exception, match="--policy x: no such file or directory"):
        adopt_run_env(EvalRequest(env=None, policy="x"), {}, None, FAMILIES, said.append)


def test_compare_of_a_report_or_a_folder_is_one_line_naming_the_results_json(tmp_path):
    _results(tmp_path / "a.json")
    (tmp_path / "a.png").write_bytes(b"\x89PNG\r\n\x1a\n\x00")  # eval's report beside it
    (tmp_path / "a.md").write_text("# report\n")
    (tmp_path / "dir").mkdir()
    (tmp_path / "other.json").write_text('{"success": 0.5}')  # some other tool's JSON
    (tmp_path / "old.json").write_text('{"format": "rlinf-embodied-eval/0"}')
    app = typer.Typer()
    app.add_typer(eval_app, name="eval")
    for other, message in [("a.png", "is not JSON (invalid start byte)"), ("a.md", "is not JSON"),
                           ("dir", "is a directory; pass the results .json"),
                           ("other.json", 'not an rlinf-embodied results file (no "format": '
                            "'rlinf-embodied-eval/1' field); pass the --output"),
                           ("old.json", "(format 'rlinf-embodied-eval/0', expected "
                            "'rlinf-embodied-eval/1')")]:
        r = runner.invoke(app, ["eval", "compare", str(tmp_path / "a.json"), str(tmp_path / other)])
        out = " ".join(r.output.split())
        assert r.exit_code == 2 and message in out and "Traceback" not in out, out
        assert "\n" not in r.output.strip() and "pass another --output" not in out  # eval's, not compare's


def test_a_suite_of_another_env_and_a_directory_without_a_policy_name_the_real_cause(tmp_path):
    """Fresh-user trial: a ManiSkill run evaluated with --suite libero_spatial said "Unknown
    ManiSkill suite" (it exists, for LIBERO); a directory holding no policy said "--env is
    required" before the missing checkpoint."""
    from rlinf_embodied.eval.families import FAMILIES
    from rlinf_embodied.eval.request import EvalError, EvalRequest, adopt_run_env

    run_env = {"type": "maniskill", "suite": "maniskill_lang3", "task_ids": [0, 1]}
    with pytest.raises(EvalError) as e:
        adopt_run_env(EvalRequest(env=None, policy="run", suite="libero_spatial"), run_env,
                      "run/config.yaml", FAMILIES, lambda _: None)
    assert str(e.value).startswith("--suite libero_spatial is a libero suite, but the policy's run "
                                   "(run/config.yaml) trained on maniskill; pass one of its suites "
                                   "(maniskill_lang3, maniskill_lang3_peg)")
    (tmp_path / "notes.txt").write_text("no policy here")
    with pytest.raises(EvalError, match=f"No policy checkpoint found at {tmp_path}"):
        adopt_run_env(EvalRequest(env=None, policy=str(tmp_path)), {}, None, FAMILIES, lambda _: None)
