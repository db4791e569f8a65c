"""Fast vs upstream VLA image preprocessing: how far apart, and what each costs.

Compares ``policy.image_preprocessing`` ``fast`` (batched bilinear resize + integer centre crop
in torch) with ``upstream`` (JPEG q95, Lanczos-3, TF ``crop_and_resize``;
policies/preprocessing.py) on 256 x 256 frames resized to 224 with the 0.9-area centre crop:
the per-pixel difference in grey levels (0-255) of the image fed to the backbones (mean, p99,
max over pixels and channels), and the time per image of each mode at N = 8.

Frames: LIBERO-Spatial task 0 agentview renders after reset (rotated 180 degrees as the
openvla_v1 protocol does) when LIBERO is installed, else a synthetic frame with edges
(``--synthetic`` forces it).

Usage: ``python benchmarks/bench_preprocessing.py [--quick] [--synthetic]``; the last line
printed is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from rlinf_embodied.policies.preprocessing import ImagePreprocessor  # noqa: E402

MEANS, STDS = [[0.0, 0.0, 0.0]], [[1.0, 1.0, 1.0]]  # identity normalisation: grey levels / 255


def libero_frames(n: int) -> np.ndarray:
    from rlinf_embodied.envs.configuration_libero import LiberoEnvConfig
    from rlinf_embodied.envs.registry import make_env

    cfg = LiberoEnvConfig(suite="libero_spatial", task_ids=[0], num_envs=n, num_processes=0,
                          obs_mode="rgb", image_size=256, flip_images=True, seed=None)
    env = make_env(cfg)
    try:
        obs, _ = env.reset(options={"task_ids": [0] * n, "init_state_ids": list(range(n))})
        return np.asarray(obs["main_images"])
    finally:
        env.close()


def synthetic_frames(n: int) -> np.ndarray:
    rng = np.random.default_rng(0)
    yy, xx = np.mgrid[0:256, 0:256] / 256.0
    base = np.stack([200 * xx + 30, 150 * yy + 50, 120 * xx * yy + 60], -1)
    out = []
    for i in range(n):
        img = base.copy()
        img[40 + 8 * i : 128, 64:128] = [250, 20, 20]
        img += rng.normal(0, 6, img.shape)
        out.append(np.clip(np.round(img), 0, 255).astype(np.uint8))
    return np.stack(out)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--synthetic", action="store_true")
    args = ap.parse_args()
    n = 2 if args.quick else 8
    source = "synthetic"
    t0 = time.perf_counter()
    if not args.synthetic:
        try:
            frames, source = libero_frames(n), "libero_spatial task 0 agentview"
        except Exception as e:  # noqa: BLE001 - no LIBERO here: fall back, say so
            print(f"LIBERO frames unavailable ({type(e).__name__}: {e}); using synthetic", file=sys.stderr)
            frames = synthetic_frames(n)
    else:
        frames = synthetic_frames(n)
    render_s = time.perf_counter() - t0
    x = torch.from_numpy(frames)
    modes = {m: ImagePreprocessor(224, MEANS, STDS, center_crop=True, mode=m) for m in ("fast", "upstream")}
    out, per_image_ms = {}, {}
    reps = 1 if args.quick else 3
    for m, pre in modes.items():
        pre(x)  # warm up
        t = time.perf_counter()
        for _ in range(reps):
            out[m] = pre(x)
        per_image_ms[m] = 1000 * (time.perf_counter() - t) / (reps * n)
    diff = ((out["fast"] - out["upstream"]).abs() * 255).flatten().numpy()
    # The same without the crop: resize + JPEG alone.
    nocrop = {m: ImagePreprocessor(224, MEANS, STDS, center_crop=False, mode=m)(x) for m in modes}
    d2 = ((nocrop["fast"] - nocrop["upstream"]).abs() * 255).flatten().numpy()
    print(json.dumps({
        "bench": "preprocessing", "frames": source, "n": n,
        "grey_level_diff_fast_vs_upstream": {"mean": round(float(diff.mean()), 3),
                                             "p99": round(float(np.percentile(diff, 99)), 2),
                                             "max": round(float(diff.max()), 2)},
        "grey_level_diff_without_crop": {"mean": round(float(d2.mean()), 3),
                                         "p99": round(float(np.percentile(d2, 99)), 2)},
        "ms_per_image": {k: round(v, 3) for k, v in per_image_ms.items()},
        "breakdown_s": {"frames": round(render_s, 2)},
        "loadavg": open("/proc/loadavg").read().split()[:3],
    }))


if __name__ == "__main__":
    main()
