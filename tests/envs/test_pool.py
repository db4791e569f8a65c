"""Process pool: crashes and hangs end episodes as truncated with env_error; the run continues."""

from __future__ import annotations

import os
import signal
import threading
import time

import numpy as np
import psutil
import pytest

from rlinf_embodied.envs import EnvError, make_env
from rlinf_embodied.envs.configuration_gym import GymEnvConfig
from rlinf_embodied.envs.pool import MAX_STEP_FAILURES, assign_device, visible_cuda_devices
from rlinf_embodied.omp import OMP_WAIT_VARS

from .conftest import env_children


def pooled_countdown(num_envs=2, **fields):
    kwargs = {"length": 50, **fields.pop("kwargs", {})}
    fields.setdefault("num_processes", num_envs)
    return make_env("toy/Countdown-v0", num_envs=num_envs, vectorization="async", kwargs=kwargs,
                    **fields)


def test_pool_matches_in_process_and_closes_cleanly(no_leaked_children):
    pooled = pooled_countdown(num_envs=3, num_processes=2)
    local = make_env("toy/Countdown-v0", num_envs=3, kwargs={"length": 50})
    pids = pooled.worker_pids()
    assert len(pids) == 2 and set(pids) <= env_children()
    a, _ = pooled.reset(seed=3)
    b, _ = local.reset(seed=3)
    assert np.array_equal(a["states"].numpy(), b["states"].numpy())
    acts = np.array([[0.1], [0.2], [0.3]], np.float32)
    a, ra, *_ = pooled.step(acts)
    b, rb, *_ = local.step(acts)
    assert np.array_equal(a["states"].numpy(), b["states"].numpy()) and ra.tolist() == rb.tolist()
    pooled.close()
    pooled.close()  # idempotent
    local.close()
    assert not set(pids) & env_children()


def test_workers_start_with_a_passive_openmp_wait_policy(no_leaked_children):
    """The fork server (it imports torch, so libgomp reads its wait policy there) and the workers
    start with OMP_WAIT_POLICY=PASSIVE; the parent's own environment is left as it was."""
    if any(v in os.environ for v in OMP_WAIT_VARS):
        pytest.skip("this environment sets its own OpenMP wait policy (forwarded as is)")
    env = pooled_countdown(num_envs=1)
    try:
        started = psutil.Process(env.worker_pids()[0]).environ()  # as at exec: what libgomp read
    finally:
        env.close()
    assert started.get("OMP_WAIT_POLICY") == "PASSIVE" and "GOMP_SPINCOUNT" not in started
    assert not any(v in os.environ for v in OMP_WAIT_VARS)


def test_worker_killed_mid_step_is_restarted(no_leaked_children):
    env = pooled_countdown(num_envs=2)
    env.reset(seed=0, options={"step_sleep_s": [1.0, 0.0]})
    env.step(np.zeros((2, 1)))  # warm: both at t=1
    victim = env.worker_pids()[0]
    threading.Timer(0.3, os.kill, (victim, signal.SIGKILL)).start()
    obs, r, te, tr, info = env.step(np.zeros((2, 1)))
    assert info["env_error"].tolist() == [True, False]
    assert tr.tolist() == [True, False] and r.tolist() == [0.0, 2.0]
    assert obs["states"][0, 0] == 1  # the last good observation is kept as the final one
    assert env.num_env_errors == 1
    obs, r, te, tr, info = env.step(np.zeros((2, 1)))  # NEXT_STEP: env 0 restarts its episode
    assert info["autoreset"].tolist() == [True, False] and obs["states"][:, 0].tolist() == [0, 3]
    obs, *_ = env.step(np.zeros((2, 1)))
    assert obs["states"][:, 0].tolist() == [1, 4]
    assert victim not in env.worker_pids()
    env.close()


def test_crash_inside_step_is_an_env_error(no_leaked_children):
    env = pooled_countdown(num_envs=2)
    env.reset(seed=0, options={"crash_at_step": [None, 2]})
    env.step(np.zeros((2, 1)))
    _, _, _, tr, info = env.chunk_step(np.zeros((2, 3, 1)))
    assert info["env_error"].tolist() == [False, True]
    assert tr[1].tolist() == [True, False, False] and info["num_substeps"].tolist() == [3, 1]
    env.close()


def test_hung_step_times_out_within_the_limit(no_leaked_children):
    env = pooled_countdown(num_envs=2, step_timeout_s=1.0)
    env.reset(seed=0, options={"hang_at_step": [2, None]})
    env.step(np.zeros((2, 1)))
    start = time.monotonic()
    _, _, _, tr, info = env.step(np.zeros((2, 1)))
    elapsed = time.monotonic() - start
    assert elapsed < 3.0, f"a hung step took {elapsed:.1f} s to surface (timeout 1 s)"
    assert info["env_error"].tolist() == [True, False] and tr.tolist() == [True, False]
    obs, *_ = env.step(np.zeros((2, 1)))  # the replacement worker serves the next step
    assert obs["states"][:, 0].tolist() == [0, 3]
    env.close()


def test_lost_envs_of_a_partial_reset_are_reported(no_leaked_children):
    env = pooled_countdown(num_envs=2, num_processes=1)
    env.reset(seed=0)
    env.step(np.zeros((2, 1)))
    os.kill(env.worker_pids()[0], signal.SIGKILL)
    env.reset(env_ids=[0])  # worker died: restarted, env 0 reset on the retry, env 1 lost
    _, _, _, tr, info = env.step(np.zeros((2, 1)))
    assert info["env_error"].tolist() == [False, True] and tr.tolist() == [False, True]
    env.close()


@pytest.mark.parametrize("limit", [None, 1])
def test_env_that_cannot_step_raises_after_max_step_failures(no_leaked_children, caplog, limit):
    """Every step raises (tests/plugins/failing_env.py): the first env.max_step_failures - 1
    (default MAX_STEP_FAILURES) failures end the episodes as env errors, as any failure does;
    the next one raises, naming the error. The traceback is logged once, each later failure in
    one line. ``env.max_step_failures=1`` raises at the first failure: no episode cut short."""
    extra = {} if limit is None else {"max_step_failures": limit}
    limit = MAX_STEP_FAILURES if limit is None else limit
    env = make_env(GymEnvConfig(env_id="tests.plugins.failing_env:SingularStepEnv", num_envs=2,
                                vectorization="async", num_processes=1, **extra))
    env.reset(seed=0)
    tolerated = 0
    try:
        with caplog.at_level("WARNING", logger="rlinf_embodied.envs.pool"):
            with pytest.raises(EnvError, match=rf"env worker 0 \(envs 0..1\) failed "
                               rf"{limit} steps in a row.*numpy.linalg.LinAlgError: "
                               r"Singular matrix in its step.*fix the env") as raised:
                for _ in range(4 * limit):  # each failed step, then an autoreset
                    *_, info = env.step(np.zeros((2, 1)))
                    tolerated += int(info["env_error"].sum())
    finally:
        env.close()
    assert tolerated == 2 * (limit - 1)
    assert "\n" not in str(raised.value)  # the CLI's one line
    logged = [r.getMessage() for r in caplog.records]
    assert len(logged) == limit
    assert "Traceback" in logged[0] and not any("Traceback" in m for m in logged[1:])
    assert all("\n" not in m and "failed again" in m for m in logged[1:]), logged


def test_step_failures_between_good_steps_are_tolerated(no_leaked_children):
    """An env that crashes at step 2 of every episode fails more than MAX_STEP_FAILURES times,
    never twice in a row: every failure is an env error, and stepping goes on."""
    env = pooled_countdown(num_envs=1, kwargs={"crash_at_step": 2})
    env.reset(seed=0)
    errors = 0
    for _ in range(3 * (MAX_STEP_FAILURES + 1)):  # step 1, step 2 (crash), autoreset
        *_, info = env.step(np.zeros((1, 1)))
        errors += int(info["env_error"].sum())
    env.close()
    assert errors == MAX_STEP_FAILURES + 1 and env.num_env_errors == errors


def test_device_assignment_honours_visible_subset():
    assert assign_device(3, []) is None
    dev = assign_device(3, [2, 5])
    assert dev.ordinal == 1 and dev.physical_id == 5
    if not visible_cuda_devices():
        assert assign_device(0) is None


def test_fork_start_method_is_refused():
    from rlinf_embodied.envs.pool import ProcessPool

    with pytest.raises(ValueError, match="forkserver"):
        ProcessPool(lambda ids, dev: None, 2, 1, start_method="fork")
