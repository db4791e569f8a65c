"""One Ray instance for every end-to-end training test (Cluster attaches to it)."""

import pytest


@pytest.fixture(scope="session")
def ray_session():
    import ray

    if not ray.is_initialized():
        ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False, namespace="rlinf_embodied")
    yield
    ray.shutdown()
