"""The SFT process's OpenMP spin (rlinf_embodied.omp.load_openmp_for_compute): set while torch
loads libgomp, gone from the environment the processes it starts inherit; the user's choice
and an already imported torch are left alone. Each case runs in a fresh interpreter (libgomp
reads its variables once per process)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from rlinf_embodied.omp import COMPUTE_SPIN_COUNT, OMP_WAIT_VARS

_PROBE = """
import json, os, sys
pre = sys.argv[1] == "torch-first"
if pre:
    import torch
seen = {}
import rlinf_embodied.omp as omp
real_import = __builtins__.__import__
def spy(name, *a, **k):  # the environment at the moment torch is imported
    if name == "torch" and "torch" not in sys.modules:
        seen.update({v: os.environ.get(v) for v in omp.OMP_WAIT_VARS})
    return real_import(name, *a, **k)
__builtins__.__import__ = spy
loaded = omp.load_openmp_for_compute()
__builtins__.__import__ = real_import
print(json.dumps({"loaded": loaded, "at_import": seen, "torch": "torch" in sys.modules,
                  "after": {v: os.environ.get(v) for v in omp.OMP_WAIT_VARS},
                  "children": omp.omp_wait_env()}))
"""


def _probe(order: str = "plain", **env: str) -> dict:
    base = {k: v for k, v in os.environ.items() if k not in OMP_WAIT_VARS}
    out = subprocess.run([sys.executable, "-c", _PROBE, order], env={**base, **env},
                         capture_output=True, text=True, timeout=120, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_torch_loads_with_the_compute_spin_and_children_stay_passive():
    r = _probe()
    assert r["loaded"] is True and r["torch"] is True
    assert r["at_import"] == {"OMP_WAIT_POLICY": None, "GOMP_SPINCOUNT": COMPUTE_SPIN_COUNT}
    assert r["after"] == {"OMP_WAIT_POLICY": None, "GOMP_SPINCOUNT": None}
    assert r["children"] == {"OMP_WAIT_POLICY": "PASSIVE"}


def test_the_users_choice_is_kept_for_this_process_and_its_children():
    r = _probe(OMP_WAIT_POLICY="PASSIVE")
    assert r["loaded"] is False and r["at_import"] == {}  # torch not imported by it
    assert r["after"] == {"OMP_WAIT_POLICY": "PASSIVE", "GOMP_SPINCOUNT": None}
    assert r["children"] == {"OMP_WAIT_POLICY": "PASSIVE"}
    r = _probe(GOMP_SPINCOUNT="500")
    assert r["loaded"] is False and r["children"] == {"GOMP_SPINCOUNT": "500"}


def test_too_late_once_torch_is_imported():
    r = _probe("torch-first")
    assert r["loaded"] is False and r["at_import"] == {}
    assert r["after"] == {"OMP_WAIT_POLICY": None, "GOMP_SPINCOUNT": None}
