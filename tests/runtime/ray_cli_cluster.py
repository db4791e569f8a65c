"""A Ray cluster started with the ``ray`` CLI on this machine, the way docs/elastic.md tells a
user to start one on several machines: ``ray start --head`` and ``ray start --address=...``
with token authentication, each raylet on ports of its own (two raylets on one machine), for
the multi-node tests.

Every process it starts carries the cluster's own temp dir (``--temp-dir``, one per node) or
its GCS port on its command line; :meth:`RayCliCluster.shutdown` kills exactly those by pid,
so other Ray sessions on the machine (other tests, other users) are never touched. ``ray stop``
is not used: it stops every Ray process of the machine.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Optional

RAY = str(Path(sys.executable).with_name("ray"))
PORT_KEYS = ("node-manager-port", "object-manager-port", "dashboard-agent-listen-port",
             "dashboard-agent-grpc-port", "metrics-export-port", "runtime-env-agent-port")


def _free_ports(n: int, used: set) -> List[int]:
    """``n`` ports free now and not in ``used`` (added to it)."""
    socks, out = [], []
    try:
        while len(out) < n:
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("", 0))
            socks.append(s)
            if s.getsockname()[1] not in used:
                out.append(s.getsockname()[1])
    finally:
        for s in socks:
            s.close()
    used.update(out)
    return out


def _free_range(width: int, used: set) -> int:
    """First port of ``width`` consecutive ports free now and not in ``used`` (added to it):
    a node's worker port range, which must not overlap another node's ports."""
    for _ in range(200):
        first = 20000 + secrets.randbelow(30000)
        if used & set(range(first, first + width)):
            continue
        socks = []
        try:
            for p in range(first, first + width):
                s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                socks.append(s)
                s.bind(("", p))
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
        used.update(range(first, first + width))
        return first
    raise RuntimeError("no free port range")


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


class RayCliCluster:
    """A head node and worker nodes made with ``ray start``, token authentication on.

    The token is written to ``root/auth_token`` and reaches every ``ray start`` and the driver
    through ``RAY_AUTH_MODE=token`` and ``RAY_AUTH_TOKEN_PATH`` (:attr:`env`), as it would on
    real machines after copying the head's token file.

    Args:
        root: a short directory for the nodes' temp dirs (Unix socket paths are limited to
            about 100 characters).
        head_cpus: Ray CPUs of the head.
        system_config: the head's ``--system-config`` (e.g. faster node-death detection).
        start_timeout_s: seconds one ``ray start`` may take (a loaded machine is slow).
    """

    def __init__(self, root: Optional[Path] = None, head_cpus: int = 2,
                 system_config: Optional[dict] = None, start_timeout_s: float = 240.0,
                 start_retries: int = 3) -> None:
        self._own_root = root is None
        self.root = Path(root or tempfile.mkdtemp(prefix="rlc", dir="/tmp"))
        self.root.mkdir(parents=True, exist_ok=True)
        token = self.root / "auth_token"
        token.write_text(secrets.token_hex(32))
        token.chmod(0o600)
        self.env = {**os.environ, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token),
                    "RAY_USAGE_STATS_ENABLED": "0"}
        self.env.pop("RAY_ADDRESS", None)
        self.timeout, self.retries = start_timeout_s, start_retries
        self._used: set = set()  # ports handed out: no two raylets share one
        self.gcs_port = _free_ports(1, self._used)[0]
        self.address = f"127.0.0.1:{self.gcs_port}"
        self.nodes: Dict[str, dict] = {}  # name -> {"dir", "ports", "resources", "cpus"}
        self._serial = self._starts = 0
        self.log: List[str] = []
        try:
            self._start("head", head_cpus, {}, head=True, system_config=system_config)
        except BaseException:
            self.shutdown()
            raise

    # -- nodes --------------------------------------------------------------------------------
    def _start(self, name: str, cpus: int, resources: dict, head: bool = False,
               system_config: Optional[dict] = None) -> None:
        """``ray start`` node ``name``; on a loaded machine a raylet may miss Ray's fixed 30 s
        registration wait: the attempt's processes are killed and it is retried on new ports."""
        for attempt in range(self.retries + 1):
            self._starts += 1  # every start gets its own temp dir: a dead node's leftovers differ
            node_dir = self.root / f"{name}.{self._starts}"
            try:
                return self._start_once(name, cpus, resources, head, system_config, node_dir)
            except (RuntimeError, subprocess.TimeoutExpired):
                self._kill_marks([str(node_dir)] + ([f":{self.gcs_port}"] if head else []))
                if attempt == self.retries:
                    raise
                if head:
                    self.gcs_port = _free_ports(1, self._used)[0]
                    self.address = f"127.0.0.1:{self.gcs_port}"
                time.sleep(2.0)

    def _start_once(self, name, cpus, resources, head, system_config, node_dir: Path) -> None:
        node_dir.mkdir(exist_ok=True)
        ports = dict(zip(PORT_KEYS, _free_ports(len(PORT_KEYS), self._used)))
        first = _free_range(40, self._used)
        cmd = [RAY, "start", f"--num-cpus={cpus}", f"--temp-dir={node_dir}",
               "--disable-usage-stats", f"--min-worker-port={first}", f"--max-worker-port={first + 39}",
               *(f"--{k}={v}" for k, v in ports.items())]
        if head:
            cmd += ["--head", f"--port={self.gcs_port}", "--include-dashboard=false",
                    f"--ray-client-server-port={_free_ports(1, self._used)[0]}",
                    f"--dashboard-port={_free_ports(1, self._used)[0]}",
                    "--node-ip-address=127.0.0.1"]
            if system_config:
                cmd.append(f"--system-config={json.dumps(system_config)}")
        else:
            cmd += [f"--address={self.address}", "--node-ip-address=127.0.0.1"]
        if resources:
            cmd.append(f"--resources={json.dumps(resources)}")
        self.log.append(" ".join(cmd))
        t0 = time.monotonic()
        proc = subprocess.run(cmd, env=self.env, capture_output=True, text=True, timeout=self.timeout)
        if proc.returncode != 0:
            raise RuntimeError(f"`{' '.join(cmd)}` failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
        self.nodes[name] = {"dir": str(node_dir), "ports": ports, "resources": resources, "cpus": cpus,
                            "start_s": time.monotonic() - t0}

    def add_node(self, cpus: int = 1, resources: Optional[dict] = None, name: Optional[str] = None) -> str:
        """``ray start --address=...`` one more node; returns its name (``n<k>``)."""
        if name is None:
            self._serial += 1
            name = f"n{self._serial}"
        self._start(name, cpus, dict(resources or {}))
        return name

    def restore_node(self, name: str) -> None:
        """Start a killed node again with its resources (a new raylet, a new node id)."""
        spec = self.nodes.pop(name)
        self._start(name, spec["cpus"], spec["resources"])

    def pids(self, name: Optional[str] = None) -> List[int]:
        """Pids of the processes of node ``name`` (None: of the whole cluster)."""
        marks = ([self.nodes[name]["dir"]] + [f"={p}" for p in self.nodes[name]["ports"].values()]
                 if name else [str(self.root), f":{self.gcs_port}"])
        return self._pids_marked(marks)

    @staticmethod
    def _pids_marked(marks: List[str]) -> List[int]:
        own = os.getpid()
        out = []
        for d in Path("/proc").iterdir():
            if d.name.isdigit() and int(d.name) != own:
                c = _cmdline(int(d.name))
                if c and any(m in c for m in marks):
                    out.append(int(d.name))
        return out

    def raylet_pid(self, name: str) -> int:
        """Pid of node ``name``'s raylet."""
        port = self.nodes[name]["ports"]["node-manager-port"]
        for pid in self.pids(name):
            c = _cmdline(pid)
            if "/raylet " in c.split(" --")[0] + " " and f"--node_manager_port={port}" in c:
                return pid
        raise RuntimeError(f"no raylet of node {name} (port {port}) found")

    def kill_raylet(self, name: str) -> float:
        """SIGKILL node ``name``'s raylet (what a preemption or a crashed machine does to it);
        its workers exit when they lose it. Returns the monotonic time of the kill."""
        pid = self.raylet_pid(name)
        os.kill(pid, signal.SIGKILL)
        return time.monotonic()

    def kill_node(self, name: str) -> None:
        """SIGKILL every process of node ``name`` (raylet, agents, workers)."""
        for pid in self.pids(name):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def shutdown(self) -> None:
        """Kill every process of the cluster by pid (SIGTERM, then SIGKILL); remove its
        directory when the cluster made it."""
        self._kill_marks([str(self.root), f":{self.gcs_port}"])
        if self._own_root:
            import shutil

            shutil.rmtree(self.root, ignore_errors=True)

    def _kill_marks(self, marks: List[str]) -> None:
        for sig in (signal.SIGTERM, signal.SIGKILL):
            pids = self._pids_marked(marks)
            for pid in pids:
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
            deadline = time.monotonic() + 5
            while pids and time.monotonic() < deadline:
                time.sleep(0.2)
                pids = [p for p in pids if Path(f"/proc/{p}").exists() and _cmdline(p)]
            if not pids:
                break

    def __enter__(self) -> "RayCliCluster":
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()
