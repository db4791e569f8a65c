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
