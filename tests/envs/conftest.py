"""Fixtures of the env tests: child-process accounting and small env builders."""

from __future__ import annotations

import importlib.util

import psutil
import pytest

HAS_MANISKILL = importlib.util.find_spec("mani_skill") is not None
HAS_LIBERO = importlib.util.find_spec("libero") is not None

def _helper_pids() -> set:
    """multiprocessing's forkserver and resource tracker: one per interpreter, by design."""
    from multiprocessing import forkserver, resource_tracker

    pids = {getattr(forkserver._forkserver, "_forkserver_pid", None),
            getattr(resource_tracker._resource_tracker, "_pid", None)}
    return {p for p in pids if p}


def env_children() -> set:
    """Pids of this process's descendants, except multiprocessing's helper processes."""
    out = set()
    for child in psutil.Process().children(recursive=True):
        try:
            if child.status() == psutil.STATUS_ZOMBIE:
                continue
        except psutil.NoSuchProcess:
            continue
        out.add(child.pid)
    return out - _helper_pids()


@pytest.fixture
def no_leaked_children():
    """Fails the test when it leaves child processes behind."""
    before = env_children()
    yield
    leaked = env_children() - before
    assert not leaked, f"child processes left behind: {leaked}"
