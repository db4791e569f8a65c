"""End-to-end training on real Ray workers, real FSDP (gloo) and real envs, at toy scale."""

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from rlinf_embodied.checkpoint import checkpoint_dir, latest_checkpoint
from rlinf_embodied.config import load_config
from rlinf_embodied.runners.embodied import EmbodiedRunner

TOY = """
run: {{name: toy, seed: 3}}
cluster: {{num_cpu_devices: 3}}
placement: {placement}
env: {{type: gym, env_id: toy/PointReach-v0, num_envs: 4, max_episode_steps: 20}}
policy: {{type: mlp, hidden_sizes: [32, 32]}}
algorithm: {{gamma: 0.9, gae_lambda: 0.95}}
trainer: {{iterations: {iterations}, rollout_steps: 20, update_epochs: 2, num_minibatches: 2,
          eval_every: 0, save_every: 1}}
logging: {{tensorboard: false, console: false}}
"""

PLACEMENTS = {
    # Same rank counts (1 each), different devices: only where things run differs.
    "collocated": "placement: {context_switch: true, groups: {env: {devices: '0'}, rollout: {devices: '0'}, actor: {devices: '0'}}}",
    "disaggregated": "placement: {context_switch: false, groups: {env: {devices: '0'}, rollout: {devices: '1'}, actor: {devices: '2'}}}",
    # taking turns without moving state off the device (what the planner picks when it fits)
    "resident": "placement: {context_switch: true, offload: false, groups: {env: {devices: '0'}, rollout: {devices: '0'}, actor: {devices: '0'}}}",
}


def make_cfg(tmp_path, placement="collocated", iterations=2, overrides=()):
    pfile = tmp_path / f"{placement}.yaml"
    pfile.write_text(PLACEMENTS[placement] + "\n")
    job = tmp_path / "job.yaml"
    job.write_text(TOY.format(placement=pfile, iterations=iterations))
    return load_config(job, list(overrides))


def weights(run_dir):
    ckpt = latest_checkpoint(run_dir)
    return load_file(str(ckpt / "policy" / "model.safetensors"))


def assert_same(a, b):
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=0, atol=1e-6, msg=k)


def test_placement_equivalence(ray_session, tmp_path):
    runs = {}
    for p in ("collocated", "disaggregated", "resident"):
        # join_forwards may join only requests that draw no random numbers: with one stream per
        # rollout rank nothing arrives together, so the run stays bit-identical
        cfg = make_cfg(tmp_path, p, overrides=["trainer.join_forwards=true"] if p == "resident" else [])
        EmbodiedRunner(cfg, tmp_path / p).run()
        runs[p] = weights(tmp_path / p)
    assert_same(runs["collocated"], runs["disaggregated"])
    assert_same(runs["collocated"], runs["resident"])
    # Training moved the weights (the comparison above is not between two untouched models).
    first = next(iter(runs["collocated"].values()))
    assert first.abs().sum() > 0


def test_resume_is_exact(ray_session, tmp_path):
    full = make_cfg(tmp_path, iterations=4)
    EmbodiedRunner(full, tmp_path / "full").run()
    part = make_cfg(tmp_path, iterations=2)
    EmbodiedRunner(part, tmp_path / "resumed").run()
    assert json.loads((latest_checkpoint(tmp_path / "resumed") / "runner_state.json").read_text())["iteration"] == 2
    more = make_cfg(tmp_path, iterations=4)
    EmbodiedRunner(more, tmp_path / "resumed", resume=True).run()
    assert latest_checkpoint(tmp_path / "resumed").name == "iter_000004"
    assert_same(weights(tmp_path / "full"), weights(tmp_path / "resumed"))


def test_resume_with_parameters_that_never_had_a_gradient(ray_session, tmp_path):
    """A policy with parameters no loss reaches (a Prismatic ViT's last block in the VLAs) has
    no optimizer state for them; resuming loads the rest and stays exact (it raised "Missing
    optimizer state for parameter ..." on torch 2.14)."""
    spare = ["policy.type=tests.plugins.lab_components:SpareLayerMLPPolicy"]
    EmbodiedRunner(make_cfg(tmp_path, iterations=2, overrides=spare), tmp_path / "full").run()
    EmbodiedRunner(make_cfg(tmp_path, iterations=1, overrides=spare), tmp_path / "resumed").run()
    EmbodiedRunner(make_cfg(tmp_path, iterations=2, overrides=spare), tmp_path / "resumed", resume=True).run()
    assert latest_checkpoint(tmp_path / "resumed").name == "iter_000002"
    full, resumed = weights(tmp_path / "full"), weights(tmp_path / "resumed")
    assert "spare.weight" in full
    assert_same(full, resumed)


def test_resume_with_a_longer_linear_schedule_trains_at_the_new_rate(ray_session, tmp_path):
    """Extending a finished linear-schedule run: the first new iteration trains at the new
    schedule's rate (it trained at 0 before: the optimizer kept the saved end-of-schedule lr)."""
    lr = 1e-3
    part = make_cfg(tmp_path, iterations=2, overrides=["trainer.lr_schedule=linear", f"trainer.lr={lr}"])
    EmbodiedRunner(part, tmp_path / "run").run()
    more = make_cfg(tmp_path, iterations=4, overrides=["trainer.lr_schedule=linear", f"trainer.lr={lr}"])
    EmbodiedRunner(more, tmp_path / "run", resume=True).run()
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    lrs = {r["iteration"]: r["train/lr"] for r in rows if "train/lr" in r}
    assert lrs[1] == pytest.approx(lr) and lrs[2] == pytest.approx(lr / 2)  # 1 - 1/2 over 2
    assert lrs[3] == pytest.approx(lr / 2) and lrs[4] == pytest.approx(lr / 4)  # 1 - 2/4, 1 - 3/4
    assert {r["iteration"]: r["train/approx_kl"] for r in rows if "train/approx_kl" in r}[3] > 0


def holders_never_overlap(trace):
    """Replay a lock trace: the actor never holds a device while env/rollout do, and vice versa."""
    held = {}
    for _, device, worker, event in trace:
        now = held.setdefault(device, set())
        if event == "acquire":
            now.add(worker)
            roles = {w.split("[")[0] for w in now}
            assert not ("actor" in roles and roles & {"env", "rollout"}), (device, sorted(now))
        elif event == "release":
            now.discard(worker)
    return True


def test_run_directory_contents(ray_session, tmp_path):
    from rlinf_embodied.runtime import DeviceLock

    lock = DeviceLock.connect()
    lock.clear_trace()
    cfg = make_cfg(tmp_path, iterations=2, overrides=[
        "trainer.eval_every=2", "eval.num_episodes=2", "eval.num_videos=1",
        # an env with camera images, so the final evaluation writes a video
        "env.env_id=toy/Countdown-v0", "env.kwargs={length: 10, terminate: false, with_image: true}",
        "env.image_keys={pixels: main_images, wrist: wrist_images}", "env.state_keys=[state]",
        # a training-only mix of fixed-length envs: the evaluation env must still build
        "env.ignore_terminations_fraction=0.5", "trainer.keep_checkpoints=1"])
    run = tmp_path / "run"
    import ray

    def channel_actors() -> set:
        return {a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
                if a["name"].startswith("rlinf_channel:")}

    before = channel_actors()
    runner = EmbodiedRunner(cfg, run)
    assert len(runner.g.channels) == 3 and channel_actors() - before  # obs, actions, trajectories
    runner.run()
    assert channel_actors() == before  # the run's queue actors went with it (shared cluster)
    trace = lock.trace()
    acquired = {w.split("[")[0] for _, _, w, e in trace if e == "acquire"}
    assert acquired == {"env", "rollout", "actor"}  # collocated: every group context-switches
    assert holders_never_overlap(trace)
    # env and rollout hold device 0 together during a rollout (one sharing party)
    together = False
    held = set()
    for _, d, w, e in trace:
        held.add(w) if e == "acquire" else held.discard(w) if e == "release" else None
        together |= {x.split("[")[0] for x in held} >= {"env", "rollout"}
    assert together
    assert (run / "config.yaml").exists() and load_config(run / "config.yaml").trainer.iterations == 2
    hist = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [h["iteration"] for h in hist] == [1, 2]
    for key in ("time/env_step_s", "time/generate_s", "time/train_s", "time/weight_sync_s",
                "train/approx_kl", "train/clip_fraction", "train/entropy", "train/grad_norm",
                "train/value_loss", "eval/success_once", "eval/success_at_end"):
        assert key in hist[-1], key
    ev = json.loads((run / "eval" / "latest.json").read_text())
    assert ev["episodes"] == 2 and 0.0 <= ev["success_once"] <= 1.0
    assert ev["videos"] and all(Path(v).stat().st_size > 0 for v in ev["videos"])
    assert (run / "curves.png").stat().st_size > 0
    # the best-evaluated policy is kept apart from the rotation; `latest` is the last iteration
    assert (run / "checkpoints" / "best" / "policy" / "model.safetensors").exists()
    assert latest_checkpoint(run).name == "iter_000002"
    # trainer.keep_checkpoints=1: iter_000001 was deleted after the second save
    assert sorted(p.name for p in (run / "checkpoints").glob("iter_*")) == ["iter_000002"]


def test_the_success_hold_ramp_lengthens_the_training_episodes(ray_session, tmp_path):
    # Countdown with length 2: success and termination from step 2 on. A hold of h ends an
    # episode at step h + 1, then one autoreset step; 6 queries per env per rollout.
    cfg = make_cfg(tmp_path, iterations=3, overrides=[
        "env.env_id=toy/Countdown-v0", "env.kwargs={length: 2}", "env.num_envs=2",
        "trainer.rollout_steps=6", "trainer.save_every=0",
        "env.success_hold_steps=3", "env.success_hold_ramp=[1, 3]"])
    EmbodiedRunner(cfg, tmp_path / "hold").run()
    hist = [json.loads(line) for line in (tmp_path / "hold" / "metrics.jsonl").read_text().splitlines()]
    assert [h["rollout/success_hold_steps"] for h in hist] == [1, 2, 3]
    # hold 1: episodes end at queries 2 and 5; hold 2: at 3; hold 3: at 4 (2 envs each)
    assert [h["rollout/episodes"] for h in hist] == [4, 2, 2]


def test_interrupted_checkpoint_write_keeps_previous(tmp_path):
    with checkpoint_dir(tmp_path, "iter_000001") as d:
        (d / "w.txt").write_text("one")
    with pytest.raises(RuntimeError):
        with checkpoint_dir(tmp_path, "iter_000002") as d:
            (d / "w.txt").write_text("half")
            raise RuntimeError("killed mid-write")
    latest = latest_checkpoint(tmp_path)
    assert latest.name == "iter_000001" and (latest / "w.txt").read_text() == "one"
    assert not any(p.name.startswith(".iter_000002") for p in (tmp_path / "checkpoints").iterdir())


def test_ppo_learns_toy_env(ray_session, tmp_path):
    cfg = make_cfg(tmp_path, iterations=30, overrides=[
        "env.num_envs=8", "env.max_episode_steps=50", "trainer.rollout_steps=50",
        "trainer.update_epochs=4", "trainer.num_minibatches=4", "trainer.save_every=0",
        "trainer.eval_every=30", "eval.num_episodes=8", "eval.num_videos=0",
        "policy.hidden_sizes=[64,64]", "trainer.lr=0.001"])
    EmbodiedRunner(cfg, tmp_path / "learn").run()
    hist = [json.loads(line) for line in (tmp_path / "learn" / "metrics.jsonl").read_text().splitlines()]
    first = hist[0]["rollout/episode_return"]
    last = hist[-1]["eval/episode_return"]
    # Random policy: about 0; optimal: about 10.4 (envs/toy.py). 30 x 400 = 12k env steps.
    assert first < 3.0 and last > 6.0, (first, last)


def test_env_process_killed_mid_rollout(ray_session, tmp_path):
    """An env process that dies mid-rollout is restarted; its episode ends as truncated with
    ``env_error`` and the run goes on (the toy env kills its own process at step 7 of every
    episode, so every iteration loses processes mid-rollout, deterministically)."""
    cfg = make_cfg(tmp_path, iterations=3, overrides=[
        "env.env_id=toy/Countdown-v0", "env.vectorization=async", "env.num_processes=2",
        "env.kwargs={length: 30, crash_at_step: 7}", "trainer.save_every=0",
        "algorithm.gamma=0.5"])
    state = EmbodiedRunner(cfg, tmp_path / "fault").run()
    assert state["iteration"] == 3
    hist = [json.loads(line) for line in (tmp_path / "fault" / "metrics.jsonl").read_text().splitlines()]
    assert all(h["rollout/env_errors"] >= 1 for h in hist), [h["rollout/env_errors"] for h in hist]
    # the crashed episodes were recorded (as truncated), not lost
    assert all(h["rollout/episodes"] >= h["rollout/env_errors"] for h in hist)


def test_env_that_cannot_step_stops_the_run(ray_session, tmp_path):
    """An env whose every step raises (tests/plugins/failing_env.py) is not trained on as a
    stream of error-truncated episodes: after MAX_STEP_FAILURES failed steps in a row the
    rollout raises, and the run stops with one line naming the env's error (what `train` prints
    as its error)."""
    from rlinf_embodied.envs.pool import MAX_STEP_FAILURES
    from rlinf_embodied.runners.errors import short_error

    cfg = make_cfg(tmp_path, iterations=2, overrides=[
        "env.env_id=tests.plugins.failing_env:SingularStepEnv", "env.vectorization=async",
        "env.num_processes=1"])
    runner = EmbodiedRunner(cfg, tmp_path / "broken")
    with pytest.raises(Exception, match=f"failed {MAX_STEP_FAILURES} steps in a row") as raised:
        runner.run()
    line = short_error(raised.value)
    assert "\n" not in line and "EnvError" in line, line
    assert "numpy.linalg.LinAlgError: Singular matrix in its step" in line, line
    assert runner.state["iteration"] == 0 and runner.saved is None


@pytest.mark.parametrize("name", ["maniskill_ppo_openvla_tiny", "libero_spatial_grpo_openvla_oft_tiny",
                                  "libero_spatial_grpo_pi0_tiny", "libero_spatial_grpo_pi05_tiny"])
def test_tiny_vla_configs_train(ray_session, tmp_path, name):
    """The shipped tiny VLA jobs run end to end (2 iterations) and save a loadable checkpoint."""
    from rlinf_embodied.policies import load_policy

    root = Path(__file__).resolve().parents[2]
    # no time budget: on a loaded machine its forecast could stop the run after iteration 1
    cfg = load_config(root / "configs" / f"{name}.yaml", ["logging.tensorboard=false",
                                                          "trainer.max_time_s=null"])
    state = EmbodiedRunner(cfg, tmp_path / name).run()
    assert state["iteration"] == 2 and state["env_steps"] > 0
    policy = load_policy(latest_checkpoint(tmp_path / name) / "policy")
    assert policy.config.type == cfg.policy.type
    if cfg.algorithm.advantage == "grpo":  # each iteration says how many groups carried a gradient
        hist = [json.loads(line) for line in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
        mixed = [h["rollout/mixed_groups"] for h in hist if "rollout/episodes" in h]
        assert len(mixed) == 2 and all(m in (0.0, 1.0) for m in mixed)  # one group of 2 envs


def test_placement_auto_profiles_plans_and_trains(ray_session, tmp_path):
    """placement=auto measures env / rollout / actor on this machine, caches the profile,
    plans a placement over the cluster's devices and trains under it."""
    job = tmp_path / "job.yaml"
    job.write_text(TOY.format(placement="auto", iterations=1).replace("num_cpu_devices: 3", "num_cpu_devices: 2"))
    cfg = load_config(job)
    run = tmp_path / "auto"
    state = EmbodiedRunner(cfg, run).run()
    assert state["iteration"] == 1
    cached = json.loads((run / "scheduler_profile.json").read_text())
    entry = next(iter(cached.values())) if "components" not in cached else cached
    text = json.dumps(entry)
    for group in ("env", "rollout", "actor"):
        assert f'"{group}"' in text
    assert "measured" in text


def test_a_failed_launch_leaves_no_workers_or_channels(ray_session, tmp_path, monkeypatch):
    """The actor's setup raises after the env and rollout groups and the channels exist: the
    launch stops the groups it started and deletes its channels before the error propagates,
    on a cluster that outlives it (the test session's Ray)."""
    import ray

    from rlinf_embodied.runners.setup import launch_groups
    from rlinf_embodied.runtime import WorkerGroup
    from rlinf_embodied.workers.actor_worker import ActorWorker

    class BrokenActor(ActorWorker):
        def setup(self, checkpoint=None):
            raise RuntimeError("actor setup failed on purpose")

    groups = []
    init = WorkerGroup.__init__

    def recording_init(self, *args, **kwargs):
        init(self, *args, **kwargs)
        groups.append(self)

    monkeypatch.setattr(WorkerGroup, "__init__", recording_init)

    def channel_actors() -> set:
        return {a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
                if a["name"].startswith("rlinf_channel:")}

    before = channel_actors()
    with pytest.raises(Exception, match="actor setup failed on purpose"):
        launch_groups(make_cfg(tmp_path), tmp_path / "run", "run-broken", None, actor_cls=BrokenActor)
    assert [g.name for g in groups] == ["env", "rollout", "actor"]
    assert all(g._hosts == [] for g in groups)  # each group's rank actors were killed
    assert channel_actors() == before
    assert ray.is_initialized()  # the session's cluster, attached to, is left running


def test_a_resumed_run_continues_the_elapsed_time(ray_session, tmp_path):
    # time_s (metrics.jsonl, the console) of a resumed run goes on from the run it resumes,
    # as stored with the checkpoint; the time between the two commands is not counted
    from rlinf_embodied.metrics import read_history

    run = tmp_path / "run"
    EmbodiedRunner(make_cfg(tmp_path, iterations=2), run).run()
    before = read_history(run)
    ckpt = latest_checkpoint(run) / "runner_state.json"
    state = json.loads(ckpt.read_text())
    assert state["iteration"] == 2 and state["elapsed_s"] >= before[-1]["time_s"] > 0
    EmbodiedRunner(make_cfg(tmp_path, iterations=3), run, resume=True).run()
    after = read_history(run)[len(before):]
    assert [r["iteration"] for r in after] == [3]
    assert after[0]["time_s"] >= state["elapsed_s"] >= before[-1]["time_s"]
    third = json.loads((latest_checkpoint(run) / "runner_state.json").read_text())
    assert third["iteration"] == 3 and third["elapsed_s"] >= after[0]["time_s"]
    # the elapsed time is the checkpoint's: one that says 1000 s goes on from 1000 s
    ckpt = latest_checkpoint(run) / "runner_state.json"
    ckpt.write_text(json.dumps({**third, "elapsed_s": 1000.0}))
    EmbodiedRunner(make_cfg(tmp_path, iterations=4), run, resume=True).run()
    last = read_history(run)[-1]
    assert last["iteration"] == 4 and 1000.0 <= last["time_s"] < 1000.0 + 600
