"""Ctrl-C during a reasoning run (tiny model, real Ray workers, FSDP2 on gloo): the current step
finishes, the model is saved to run_dir/model (trainer.save_every=0 notwithstanding), and
results.json and the CLI's last lines say what was saved. Mirrors the embodied runner's
handling (tests/e2e/test_interrupt_signals.py, tests/e2e/test_interrupt.py)."""

import json
import os
import signal

import pytest
import torch
from safetensors.torch import load_file

from rlinf_embodied.config import load_config
from rlinf_embodied.reasoning.cli import report_lines
from rlinf_embodied.reasoning.config import ReasoningJobConfig
from rlinf_embodied.reasoning.runner import ReasoningRunner
from rlinf_embodied.runners.signals import StopSignals

JOB = ["trainer.iterations=4", "trainer.sft_steps=4", "trainer.sft_batch_size=8", "trainer.eval_every=0",
       "trainer.save_every=0", "trainer.num_minibatches=1", "trainer.micro_batch_size=8",
       "task.num_train=40", "task.num_test=4", "rollout.prompts_per_step=2",
       "algorithm.group_size=4", "algorithm.dynamic_sampling=false",
       "algorithm.entropy_coef=0.01", "logging.console=false", "logging.tensorboard=false",
       "placement=collocated"]


def test_sigint_finishes_the_step_saves_the_model_and_reports_it(ray_session, tmp_path, capsys):
    cfg = load_config("configs/reasoning_grpo_tiny.yaml", JOB, schema=ReasoningJobConfig)
    run_dir = tmp_path / "run"
    runner = ReasoningRunner(cfg, run_dir)
    sample = runner._sample

    def sample_then_ctrl_c(step):
        if step == 1:  # Ctrl-C while step 1 is running (the handler runs in this thread)
            os.kill(os.getpid(), signal.SIGINT)
        return sample(step)

    runner._sample = sample_then_ctrl_c
    before = signal.getsignal(signal.SIGINT)
    res = runner.run(StopSignals(duplicate_s=3600))
    assert signal.getsignal(signal.SIGINT) is before  # the runner restored the handlers
    assert "finishing this iteration" in capsys.readouterr().out
    assert [s["step"] for s in res["steps"]] == [1, 2]  # step 1 finished, step 2 never ran
    assert res["interrupted"] and not res["aborted"]
    assert res["model"] == {"path": str(run_dir / "model"), "step": 2}
    assert json.loads((run_dir / "results.json").read_text())["model"] == res["model"]
    assert json.loads((run_dir / "model" / "step.json").read_text()) == {"step": 2}
    assert not list(run_dir.glob(".model.*"))  # no temporary directory left
    saved = load_file(str(run_dir / "model" / "model.safetensors"))
    init = load_file(str(run_dir / "tiny_model" / "model.safetensors"))
    assert saved.keys() == init.keys()
    assert any(not torch.equal(init[k], saved[k]) for k in init)  # the trained weights
    lines = report_lines(res, run_dir, cfg.trainer.iterations)
    assert lines[0].startswith("interrupted: 2 of 4 steps")
    assert lines[1] == f"model: {run_dir / 'model'} (step 2, HF layout)"
    assert "cannot be resumed" in lines[2] and "model.path" in lines[2]


def test_report_gives_a_reward_change_only_between_two_evaluations(tmp_path):
    res = {"eval": [{"step": 0, "reward": 0.25}], "steps": [{"step": 1}], "backend": "hf",
           "interrupted": True, "aborted": False, "model": None}
    first = report_lines(res, tmp_path, 4)[0]
    assert "held-out reward 0.250 at step 0, no later evaluation ran;" in first
    assert "->" not in first  # one evaluation measures no change
    res["eval"].append({"step": 4, "reward": 0.5})
    assert "held-out reward 0.250 (step 0) -> 0.500 (step 4);" in report_lines(res, tmp_path, 4)[0]


def _ctrl_c_while_workers_start(monkeypatch, run_dir, capsys):
    """``train_reasoning`` with a real SIGINT delivered while the worker groups launch."""
    import rlinf_embodied.reasoning.runner as runner_mod
    from rlinf_embodied.reasoning.cli import train_reasoning

    def launch(cfg, path, run_id):
        assert (path / "config.yaml").is_file()  # the runner has written into the run dir
        os.kill(os.getpid(), signal.SIGINT)  # StopSignals in its startup phase: interrupt now
        raise AssertionError("the Ctrl-C did not interrupt the startup")

    monkeypatch.setattr(runner_mod, "launch_reasoning_groups", launch)
    signals = StopSignals(duplicate_s=3600).install()
    try:
        code = train_reasoning("configs/reasoning_grpo_tiny.yaml", [f"run.dir={run_dir}"],
                               fail=pytest.fail, short_error=str, signals=signals)
    finally:
        signals.restore()
    return code, capsys.readouterr().out.strip().splitlines()[-1]


def test_ctrl_c_while_workers_start_removes_only_a_new_run_dir(monkeypatch, tmp_path, capsys):
    run_dir = tmp_path / "run"
    code, last = _ctrl_c_while_workers_start(monkeypatch, run_dir, capsys)
    assert code == 130 and not run_dir.exists()
    assert last == ("interrupted before training started: nothing was trained; removed the "
                    f"new run directory {run_dir}.")
    run_dir.mkdir()  # a directory the user made (no results.json, so the run goes into it)
    (run_dir / "notes.txt").write_text("mine")
    code, last = _ctrl_c_while_workers_start(monkeypatch, run_dir, capsys)
    assert code == 130 and (run_dir / "notes.txt").read_text() == "mine"
    assert last.endswith(f"; {run_dir} holds no results.")


def _train_with_ctrl_c_in_step_0_eval(monkeypatch, run_dir, sft_steps):
    """``train_reasoning`` (real workers) with a real SIGINT during the step-0 evaluation, so
    the run stops before step 1."""
    from rlinf_embodied.reasoning.cli import train_reasoning

    evaluate = ReasoningRunner.evaluate

    def ctrl_c_in_step_0_eval(self, step):
        if step == 0:
            os.kill(os.getpid(), signal.SIGINT)
        return evaluate(self, step)

    monkeypatch.setattr(ReasoningRunner, "evaluate", ctrl_c_in_step_0_eval)
    job = [o for o in JOB if not o.startswith(("trainer.sft_steps", "trainer.eval_every"))]
    job += ["trainer.eval_every=1", "eval.max_new_tokens=4", f"trainer.sft_steps={sft_steps}",
            f"run.dir={run_dir}"]
    signals = StopSignals(duplicate_s=3600).install()
    try:
        return train_reasoning("configs/reasoning_grpo_tiny.yaml", job, fail=pytest.fail,
                               short_error=str, signals=signals)
    finally:
        signals.restore()


def test_ctrl_c_before_step_1_with_nothing_trained_removes_the_new_run_dir(
        ray_session, monkeypatch, tmp_path, capsys):
    run_dir = tmp_path / "run"  # no SFT warm-up: nothing trained, as after a Ctrl-C in startup
    assert _train_with_ctrl_c_in_step_0_eval(monkeypatch, run_dir, 0) == 130
    assert not run_dir.exists()
    out = capsys.readouterr().out
    assert "interrupted after step 0: nothing trained, nothing to save" in out
    assert out.strip().endswith(f"removed the new run directory {run_dir}.")


@pytest.mark.slow  # a second real run (about 40 s on 2 idle cores)
def test_ctrl_c_after_the_sft_warm_up_saves_its_model(ray_session, monkeypatch, tmp_path, capsys):
    run_dir = tmp_path / "run"
    assert _train_with_ctrl_c_in_step_0_eval(monkeypatch, run_dir, 2) == 130
    out = capsys.readouterr().out
    assert "interrupted after step 0: saving the SFT warm-up model" in out
    res = json.loads((run_dir / "results.json").read_text())
    assert res["steps"] == [] and res["model"] == {"path": str(run_dir / "model"), "step": 0}
    assert json.loads((run_dir / "model" / "step.json").read_text()) == {"step": 0}
    assert "no later evaluation ran" in out and f"model: {run_dir / 'model'} (step 0" in out


def test_an_error_mid_run_is_one_message_with_what_was_saved(ray_session, monkeypatch, tmp_path):
    """An error during step 2 (after step 1's model was saved): ``train_reasoning`` reports it
    through ``fail`` with exit code 1, in the error's one line plus where results and model
    are; results.json is written; no traceback reaches the user."""
    from rlinf_embodied.reasoning.cli import train_reasoning
    from rlinf_embodied.runners.errors import short_error

    sample = ReasoningRunner._sample

    def fails_at_step_1(self, step):
        if step == 1:
            raise RuntimeError("the reward worker died (simulated)")
        return sample(self, step)

    monkeypatch.setattr(ReasoningRunner, "_sample", fails_at_step_1)
    failures = []

    def fail(msg, code=2):
        failures.append((msg, code))
        raise SystemExit(code)

    run_dir = tmp_path / "run"
    job = [o for o in JOB if not o.startswith(("trainer.sft_steps", "trainer.save_every"))]
    job += ["trainer.sft_steps=0", "trainer.save_every=1", f"run.dir={run_dir}"]
    with pytest.raises(SystemExit):
        train_reasoning("configs/reasoning_grpo_tiny.yaml", job, fail=fail, short_error=short_error)
    ((msg, code),) = failures
    assert code == 1
    lines = msg.splitlines()
    assert lines[0] == "the reward worker died (simulated)"
    assert lines[1] == f"failed: 1 of 4 steps (hf backend); results in {run_dir}"
    assert lines[2] == f"model: {run_dir / 'model'} (step 1, HF layout)"
    res = json.loads((run_dir / "results.json").read_text())
    assert len(res["steps"]) == 1 and res["model"]["step"] == 1
