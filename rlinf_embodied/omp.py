"""OpenMP wait settings for the processes the framework starts (Ray workers, env pool workers).

It sits in the ground layer and imports nothing from the package, so that the env pool
(:mod:`rlinf_embodied.envs.pool`) and the runtime (:mod:`rlinf_embodied.runtime.worker`) share
one policy and envs still run without the runtime.
"""

from __future__ import annotations

import os

OMP_WAIT_VARS = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")
"""The OpenMP variables that decide how idle OpenMP threads wait (GCC libgomp manual)."""


def omp_wait_env() -> dict[str, str]:
    """OpenMP wait settings for a process the framework starts: passive unless the user chose.

    torch's CPU kernels run on libgomp, whose idle threads busy-wait after each parallel region
    before they sleep: 300,000 spins when ``OMP_WAIT_POLICY`` is unset (GCC libgomp manual,
    "GOMP_SPINCOUNT"), milliseconds of a core per torch call. A worker with 2 intra-op threads
    thus takes a core from the env processes after every policy forward (measured on the 2-core
    dev machine: an env step that follows a forward lost 11 ms to it). ``OMP_WAIT_POLICY=PASSIVE``
    makes them sleep at once (spin count 0); results do not change, only how threads wait.

    libgomp reads these variables once, when it is loaded (with torch), so they must be in a
    process's environment before it imports torch: Ray workers get them through their
    ``runtime_env`` (:class:`~rlinf_embodied.runtime.WorkerGroup`), env pool processes from
    their parent (:class:`~rlinf_embodied.envs.pool.ProcessPool`).

    Escape hatch: set ``OMP_WAIT_POLICY`` (e.g. ``ACTIVE``) or ``GOMP_SPINCOUNT`` in the
    launching process's environment; those values are forwarded instead.

    Returns:
        The launching environment's ``OMP_WAIT_POLICY`` / ``GOMP_SPINCOUNT`` entries when it has
        any, else ``{"OMP_WAIT_POLICY": "PASSIVE"}``.
    """
    chosen = {k: os.environ[k] for k in OMP_WAIT_VARS if k in os.environ}
    return chosen or {"OMP_WAIT_POLICY": "PASSIVE"}


COMPUTE_SPIN_COUNT = "10000"
"""libgomp spin count (``GOMP_SPINCOUNT``) of a process that trains alone on its cores (the SFT
stage). Measured on the 2-core dev machine, one SFT step of the tiny OpenVLA-OFT (batch 64,
2 threads, nothing else running): 0.36-0.41 s passive (spin count 0), 0.37 s at 1,000 spins,
0.27 s at 10,000, 0.26 s at 30,000, 0.25-0.30 s ``ACTIVE``; the tiny models' many short
parallel regions pay a sleep and a wake-up each when the threads do not spin. The SFT
pipeline's evaluations in that process took 59 / 66 s at 10,000 spins and 78 / 66 s passive
(token OpenVLA, 20 trials, load 1.4-1.9)."""


def load_openmp_for_compute() -> bool:
    """Load torch's OpenMP runtime in this process with :data:`COMPUTE_SPIN_COUNT`, while the
    processes it starts later (env pool, Ray workers) keep :func:`omp_wait_env`'s passive
    default: the variable is in the environment only while torch is imported (libgomp reads
    it once, when it is loaded), then removed again.

    Nothing changes when torch is already imported (too late) or when the environment sets
    ``OMP_WAIT_POLICY`` / ``GOMP_SPINCOUNT`` (the user's choice, kept for every process; e.g.
    ``OMP_WAIT_POLICY=PASSIVE`` when other jobs share the cores: spinning threads whose
    partner is descheduled waste the spin on every parallel region).

    Returns:
        True when torch was loaded with :data:`COMPUTE_SPIN_COUNT`.
    """
    import sys

    if "torch" in sys.modules or any(k in os.environ for k in OMP_WAIT_VARS):
        return False
    os.environ["GOMP_SPINCOUNT"] = COMPUTE_SPIN_COUNT
    try:
        import torch  # noqa: F401  (loads libgomp, which reads GOMP_SPINCOUNT now)
    finally:
        del os.environ["GOMP_SPINCOUNT"]
    return True
