"""Shared test setup: headless rendering, deterministic seeds, small thread pools."""

import os

os.environ.setdefault("MUJOCO_GL", "egl")
os.environ.setdefault("PYOPENGL_PLATFORM", os.environ["MUJOCO_GL"])
os.environ.setdefault("RAY_DEDUP_LOGS", "0")


import pytest  # noqa: E402


@pytest.fixture(scope="session")
def ray_session():
    """One Ray instance for every test that needs one (Ray start costs seconds on 2 cores).

    4 CPUs even on a 2-core machine: workers use num_cpus=0, this only sizes Ray's pool.
    Tests must not call ``ray.shutdown()`` themselves.
    """
    import ray

    if not ray.is_initialized():
        ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False, namespace="rlinf_tests")
    yield
    ray.shutdown()
