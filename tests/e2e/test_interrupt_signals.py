"""StopSignals in this process: the first Ctrl-C asks for a stop, its duplicate is ignored, a
later one aborts; before training starts the first one interrupts at once."""

import os
import signal

import pytest

from rlinf_embodied.runners.signals import StopSignals


def _send(sig=signal.SIGINT):
    os.kill(os.getpid(), sig)  # Python runs the handler before the next bytecode


def test_duplicate_is_ignored_then_a_later_signal_aborts(capsys):
    before = signal.getsignal(signal.SIGINT)
    s = StopSignals(duplicate_s=3600).install()
    try:
        s.phase = "training"
        _send()
        _send()  # the same Ctrl-C delivered to the process group
        assert s.requested and not s.aborted
        assert capsys.readouterr().out.count("finishing this iteration") == 1
        s.duplicate_s = 0.0  # now the next one counts as a second Ctrl-C
        with pytest.raises(KeyboardInterrupt):
            _send()
        assert s.aborted
    finally:
        s.restore()
    assert signal.getsignal(signal.SIGINT) is before


def test_startup_signal_interrupts_at_once_and_sigterm_stops_too(capsys):
    s = StopSignals(duplicate_s=3600).install()
    try:
        with pytest.raises(KeyboardInterrupt):
            _send()
        _send()  # its duplicate does not interrupt the cleanup
        assert "stopping before training started" in capsys.readouterr().out
    finally:
        s.restore()
    s = StopSignals().install()
    try:
        s.phase = "training"
        _send(signal.SIGTERM)
        assert s.requested and "SIGTERM: finishing this iteration" in capsys.readouterr().out
    finally:
        s.restore()


def test_signal_while_a_restart_waits_for_capacity_ends_the_wait_at_once(capsys):
    """A restart after a node loss waits up to trainer.restart_wait_s for capacity; Ctrl-C then
    ends the run at once (no iteration runs that could finish), not when the wait ends."""
    import threading
    import time

    from rlinf_embodied.runners.restarts import wait_for_capacity

    class NoCapacity:  # what Cluster.refresh sees while the lost node has not come back
        num_devices = 1

        def refresh(self, exclude):
            pass

    s = StopSignals(duplicate_s=3600).install()
    try:
        s.phase = "waiting"
        threading.Timer(0.5, _send).start()
        t0 = time.monotonic()
        with pytest.raises(KeyboardInterrupt):
            wait_for_capacity(NoCapacity(), lambda n: None, {"env": 2}, 120.0, [],
                              log=lambda m: None)
        assert time.monotonic() - t0 < 30  # not the 120 s wait
        assert "stopping the wait for capacity" in capsys.readouterr().out
        assert s.requested and not s.aborted
    finally:
        s.restore()


def test_a_ctrl_c_a_library_swallows_in_startup_still_stops_train_before_ray(monkeypatch, tmp_path):
    """trimesh (imported with mani_skill while the job is validated) catches BaseException
    around its optional imports, so the KeyboardInterrupt of a Ctrl-C there was lost and
    start-up went on for a minute; ``train`` now stops before it starts Ray."""
    from typer.testing import CliRunner

    import rlinf_embodied.runners.setup as setup
    from rlinf_embodied.cli import app

    real = setup.validate_job

    def swallowing(cfg):
        try:
            _send()
        except BaseException:  # noqa: BLE001 - what trimesh's optional imports do with it
            pass
        real(cfg)

    monkeypatch.setattr(setup, "validate_job", swallowing)
    before = signal.getsignal(signal.SIGINT)  # SIG_IGN in a background job of a script (CI)
    r = CliRunner().invoke(app, ["train", "configs/gym_pointreach_ppo_mlp.yaml",
                                 f"run.dir={tmp_path / 'run'}"])
    assert r.exit_code == 130, r.output
    assert "Ctrl-C: stopping before training started" in r.output
    assert "interrupted before training started: nothing was trained" in r.output
    assert "cluster:" not in r.output and "run directory:" not in r.output  # no Ray started
    assert signal.getsignal(signal.SIGINT) == before  # the CLI's handlers are restored
