"""Action throughput of the tiny OpenVLA, OpenVLA-OFT and pi0 policies on this machine.

Measures ``act`` (sample mode, no gradient) at N = 1, 8, 32 envs and reports env actions per
second (N x K per call: K = 1 for OpenVLA, 8 for OFT, the whole chunk of H = 50 for pi0 with
10 Euler denoising steps, LeRobot's defaults), the batching gain of OFT
(``oft_batch32_vs_batch1``: actions/s at N = 32 over actions/s at N = 1),
``oft_vs_openvla_actions_per_s`` and ``pi0_vs_oft_actions_per_s`` at N = 8. The OFT paper reports about 26x for the 7B models on
a GPU (parallel decoding + chunking); tiny models on CPU have different compute ratios (the
vision towers dominate), so the number is a sanity check, not a reproduction.

Usage: ``python benchmarks/bench_policy.py [--quick]``; the last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from rlinf_embodied.policies.base import SpaceSpec
from rlinf_embodied.policies.openvla import OpenVLAPolicy
from rlinf_embodied.policies.openvla_oft import OpenVLAOFTPolicy

from rlinf_embodied.policies.configuration_openvla import OpenVLAOFTPolicyConfig, OpenVLAPolicyConfig
from rlinf_embodied.policies.configuration_pi0 import Pi0PolicyConfig
from rlinf_embodied.policies.pi0 import Pi0Policy

IMAGE = 128
SPEC = SpaceSpec(action_low=[-1.0] * 7, action_high=[1.0] * 7, state_dim=8,
                 image_shape=(IMAGE, IMAGE, 3), wrist_image_shape=(IMAGE, IMAGE, 3))


def make_obs(n: int) -> dict:
    g = torch.Generator().manual_seed(n)
    return {
        "main_images": torch.randint(0, 256, (n, IMAGE, IMAGE, 3), dtype=torch.uint8, generator=g),
        "wrist_images": torch.randint(0, 256, (n, IMAGE, IMAGE, 3), dtype=torch.uint8, generator=g),
        "states": torch.randn(n, 8, generator=g),
        "task_descriptions": ["put the black bowl on the plate"] * n,
    }


def actions_per_s(policy, n: int, repeats: int) -> float:
    """Median env actions per second of ``policy.act`` on a batch of ``n`` observations."""
    obs = make_obs(n)
    policy.act(obs)  # warm-up
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = policy.act(obs)
        times.append(time.perf_counter() - t0)
    times.sort()
    k = out.actions.shape[1]
    return n * k / times[len(times) // 2]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="one timed call per point")
    args = ap.parse_args()
    repeats = 1 if args.quick else 3
    torch.manual_seed(0)
    policies = {
        "openvla": OpenVLAPolicy(OpenVLAPolicyConfig(), SPEC).eval(),
        "oft": OpenVLAOFTPolicy(OpenVLAOFTPolicyConfig(), SPEC).eval(),
        "pi0": Pi0Policy(Pi0PolicyConfig(action_horizon=50, action_chunk=50, num_steps=10), SPEC).eval(),
    }
    result = {"device": "cpu", "threads": torch.get_num_threads(), "quick": args.quick}
    for name, policy in policies.items():
        for n in (1, 8, 32):
            rate = actions_per_s(policy, n, repeats)
            result[f"{name}_actions_per_s_n{n}"] = round(rate, 2)
            print(f"{name} N={n}: {rate:.1f} actions/s", flush=True)
    result["oft_batch32_vs_batch1"] = round(result["oft_actions_per_s_n32"] / result["oft_actions_per_s_n1"], 2)
    result["openvla_batch32_vs_batch1"] = round(
        result["openvla_actions_per_s_n32"] / result["openvla_actions_per_s_n1"], 2
    )
    result["oft_vs_openvla_actions_per_s"] = round(
        result["oft_actions_per_s_n8"] / result["openvla_actions_per_s_n8"], 2
    )
    result["pi0_vs_oft_actions_per_s"] = round(
        result["pi0_actions_per_s_n8"] / result["oft_actions_per_s_n8"], 2
    )
    result["load_avg_1min"] = round(os.getloadavg()[0], 2)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
