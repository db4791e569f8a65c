"""A Ctrl-C while :class:`~rlinf_embodied.runtime.Cluster` starts an embedded Ray leaves no Ray
process behind (``train`` interrupted in its first seconds left ``ray::DashboardAgent`` and
``ray::RuntimeEnvAgent`` running for about a minute after it had exited).

The driver is a subprocess in a session of its own, so every process of its Ray (GCS, raylet,
agents, workers) is found by its session id and nothing else on the machine is looked at. The
Ctrl-C is a real SIGINT that the driver sends itself at the moment that leaked: when Ray's node
has started all its processes, before ``ray.init`` has recorded them for ``ray.shutdown`` (a
wrapper around ``ray._private.node.Node.__init__``; Ray itself runs unchanged).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")

ROOT = Path(__file__).resolve().parents[2]
LINGER_DEADLINE_S = 30.0
"""How long the driver's Ray processes may take to go after it exited. A clean shutdown takes a
second or two; the leaked agents stayed ~65 s (they retry the dead GCS for 60 s)."""

DRIVER = """
import os, signal, sys
import ray._private.node as node
from rlinf_embodied.runners.signals import StopSignals  # the train CLI's handler
from rlinf_embodied.runtime import Cluster

started = node.Node.__init__
def started_then_ctrl_c(self, *args, **kwargs):
    started(self, *args, **kwargs)
    print(f"ray node up: {self.session_name}", flush=True)
    os.kill(os.getpid(), signal.SIGINT)
node.Node.__init__ = started_then_ctrl_c

StopSignals().install()
try:
    Cluster(num_cpus=1, num_cpu_devices=1, log_to_driver=False)
except KeyboardInterrupt:
    print("interrupted", flush=True)
    sys.exit(130)
print("not interrupted", flush=True)
"""


def _session_processes(sid: int) -> list:
    """``(pid, command line)`` of the live (not zombie) processes of session ``sid``."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            cmd = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:  # gone meanwhile
            continue
        fields = stat.rsplit(")", 1)[1].split()  # state, ppid, pgrp, session, ...
        if int(fields[3]) == sid and fields[0] != "Z":
            found.append((int(entry), cmd.strip()[:120]))
    return found


@pytest.mark.timeout(300)
def test_ctrl_c_while_embedded_ray_starts_leaves_no_ray_process():
    env = dict(os.environ, RAY_DEDUP_LOGS="0")
    proc = subprocess.Popen([sys.executable, "-c", DRIVER], cwd=ROOT, env=env,
                            start_new_session=True, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    sid = proc.pid  # its own session: the session id of every process it starts
    try:
        out, _ = proc.communicate(timeout=240)
        assert "ray node up: session_" in out, out  # the Ctrl-C came while ray.init ran
        assert proc.returncode == 130 and "interrupted" in out.splitlines(), out
        assert out.count("Ctrl-C: stopping before training started") == 1, out
        deadline = time.monotonic() + LINGER_DEADLINE_S
        left = _session_processes(sid)
        while left and time.monotonic() < deadline:
            time.sleep(0.5)
            left = _session_processes(sid)
        assert not left, f"Ray processes outlived the interrupted driver: {left}"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for pid, _ in _session_processes(sid):  # only the processes this test started
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
