"""Synthetic profiles for the planner tests (numbers chosen so the expected mode is clear)."""

from rlinf_embodied.scheduler.graph import chain_graph, embodied_graph
from rlinf_embodied.scheduler.profiles import GiB, WorkflowProfile, affine_profile


def balanced_memory_heavy():
    """rollout -> actor, equal work, each needs most of a device: temporal should win."""
    comps = {
        "rollout": affine_profile("rollout", 0.0, 0.01, 60 * GiB, 0.01 * GiB,
                                  onload_s=0.05, offload_s=0.05),
        "actor": affine_profile("actor", 0.0, 0.01, 400 * GiB, 0.02 * GiB, shard_static=True,
                                onload_s=0.05, offload_s=0.05),
    }
    prof = WorkflowProfile(comps, device_memory_bytes=80 * GiB, weight_sync_s=0.01)
    return chain_graph({"rollout": 800, "actor": 800}), prof


def light_separable():
    """pre -> train; pre is cheap but cannot share a device with train without swapping."""
    comps = {
        "pre": affine_profile("pre", 0.0, 0.002, 30 * GiB, 0.001 * GiB, onload_s=0.5, offload_s=0.5),
        "train": affine_profile("train", 0.0, 0.02, 60 * GiB, 0.01 * GiB, onload_s=1.0, offload_s=1.0),
    }
    prof = WorkflowProfile(comps, device_memory_bytes=80 * GiB, weight_sync_s=0.0)
    return chain_graph({"pre": 800, "train": 800}), prof


def embodied_maniskill_like():
    """GPU simulator whose env state fills device memory (paper 5.1.2), a VLA rollout replica and
    an FSDP actor: env and rollout cannot share a device, the actor needs all devices."""
    comps = {
        "env": affine_profile("env", 0.005, 2e-4, 2 * GiB, 0.6 * GiB, stateful_items=True,
                              onload_s=1.0, offload_s=1.0),
        "rollout": affine_profile("rollout", 0.02, 5e-4, 60 * GiB, 0.02 * GiB,
                                  onload_s=2.0, offload_s=2.0),
        "actor": affine_profile("actor", 0.05, 2e-3, 400 * GiB, 0.05 * GiB, shard_static=True,
                                onload_s=4.0, offload_s=4.0, dp_efficiency=0.97),
    }
    prof = WorkflowProfile(comps, device_memory_bytes=80 * GiB, weight_sync_s=0.5)
    return embodied_graph(num_envs=256, rollout_steps=50), prof
