"""One Ray instance for the whole runtime test session (Ray start costs ~5 s on 2 cores)."""

import pytest
import ray
from ray import cloudpickle

from rlinf_embodied.runtime import Cluster


@pytest.fixture(scope="session")
def cluster():
    # 4 CPUs even on a 2-core CI machine: workers use num_cpus=0, this only sizes Ray's pool.
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False, namespace="rlinf_tests")
    yield Cluster()  # attaches to the instance above: 2 CPU device slots
    ray.shutdown()


@pytest.fixture(scope="module", autouse=True)
def _ship_test_classes_by_value(request):
    """Worker classes defined in test modules travel by value: workers cannot import tests/."""
    cloudpickle.register_pickle_by_value(request.module)
    yield
    cloudpickle.unregister_pickle_by_value(request.module)


def wait_until(predicate, timeout=60.0, interval=0.02, what="condition"):
    """Poll ``predicate`` until true; generous timeout for loaded CI machines."""
    import time

    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)
