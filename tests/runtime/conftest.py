"""One Ray instance for the whole runtime test session (Ray start costs ~5 s on 2 cores)."""

import pytest
from ray import cloudpickle

from rlinf_embodied.runtime import Cluster


@pytest.fixture(scope="session")
def cluster(ray_session):
    yield Cluster()  # attaches to the session's Ray (tests/conftest.py)


@pytest.fixture(scope="module", autouse=True)
def _ship_test_classes_by_value(request):
    """Worker classes defined in test modules travel by value: workers cannot import tests/."""
    cloudpickle.register_pickle_by_value(request.module)
    yield
    cloudpickle.unregister_pickle_by_value(request.module)
