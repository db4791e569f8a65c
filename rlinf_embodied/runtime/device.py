"""Everything accelerator-specific lives here: device kinds, torch device strings, the
collective backend, accelerator visibility and moving tensors between host and device.

The rest of the runtime is device-agnostic and calls these helpers, so every code path also
runs on CPU-only machines (gloo backend, CPU "device slots"; DESIGN.md "Device-agnostic core").
torch is imported lazily so that the runtime's control plane never pays for it.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Callable, Mapping, Sequence

GPU = "gpu"
"""Device kind of an accelerator (one CUDA GPU)."""
CPU = "cpu"
"""Device kind of a CPU device slot: a share of a GPU-less node that placement treats like a GPU."""

RAY_GPU_RESOURCE = "GPU"
"""Name of the Ray node resource that counts a node's GPUs."""

_VISIBILITY_VAR = "CUDA_VISIBLE_DEVICES"


@dataclasses.dataclass(frozen=True)
class Device:
    """One global device of the cluster (paper section 4: workers are placed on global ids).

    Attributes:
        global_id: Index in the cluster-wide device list, 0..num_devices-1.
        node_id: Ray node id (hex) of the node that holds the device.
        node_ip: IP address of that node.
        kind: ``"gpu"`` or ``"cpu"`` (a CPU device slot).
        local_index: Index of the device on its node (CUDA ordinal for GPUs).
    """

    global_id: int
    node_id: str
    node_ip: str
    kind: str
    local_index: int

    def __str__(self) -> str:
        return f"{self.kind}:{self.global_id}@{self.node_ip}#{self.local_index}"


def collective_backend(devices: Sequence[Device]) -> str:
    """torch.distributed backend for a process group over ``devices``.

    Returns:
        ``"nccl"`` when every rank owns a GPU, else ``"gloo"``.
    """
    return "nccl" if devices and all(d.kind == GPU for d in devices) else "gloo"


def visibility_env(devices: Sequence[Device]) -> dict[str, str]:
    """Environment variables that restrict a worker process to its own accelerators.

    Args:
        devices: The worker's devices, all on one node.

    Returns:
        ``{"CUDA_VISIBLE_DEVICES": "<local indices>"}`` for GPU workers; empty for CPU slots,
        which have nothing to hide.
    """
    gpus = [str(d.local_index) for d in devices if d.kind == GPU]
    return {_VISIBILITY_VAR: ",".join(gpus)} if gpus else {}


def torch_device(devices: Sequence[Device]) -> str:
    """torch device string of a worker's first device, inside the worker process.

    After :func:`visibility_env` the worker's first GPU is ordinal 0.

    Returns:
        ``"cuda:0"`` for GPU workers, ``"cpu"`` otherwise.
    """
    return "cuda:0" if devices and devices[0].kind == GPU else "cpu"


def bind_torch_device(devices: Sequence[Device]) -> None:
    """Make the worker's first GPU the current CUDA device (no-op on CPU slots)."""
    if devices and devices[0].kind == GPU:
        import torch

        torch.cuda.set_device(0)


_process_devices: tuple[Device, ...] = ()


def set_process_devices(devices: Sequence[Device]) -> None:
    """Record the devices of the current worker process (set once by the worker host)."""
    global _process_devices
    _process_devices = tuple(devices)


def process_devices() -> tuple[Device, ...]:
    """Devices of the current worker process; empty in the driver."""
    return _process_devices


def map_tensors(tree: Any, fn: Callable[[Any], Any]) -> Any:
    """Apply ``fn`` to every torch tensor in a nested dict/list/tuple/dataclass structure.

    Containers are rebuilt (tuples and named tuples keep their type; dataclass instances are
    copied with ``dataclasses.replace``, so the channel messages of
    :mod:`rlinf_embodied.workers.messages` are staged like dicts); other leaves are returned as
    they are.
    """
    torch = _torch_if_loaded()
    if torch is None:
        return tree
    return _map(tree, fn, torch.Tensor)


def _map(tree: Any, fn: Callable[[Any], Any], tensor_type: type) -> Any:
    if isinstance(tree, tensor_type):
        return fn(tree)
    if isinstance(tree, Mapping):
        return type(tree)((k, _map(v, fn, tensor_type)) for k, v in tree.items())
    if isinstance(tree, list):
        return [_map(v, fn, tensor_type) for v in tree]
    if isinstance(tree, tuple):
        items = [_map(v, fn, tensor_type) for v in tree]
        return type(tree)(*items) if hasattr(tree, "_fields") else tuple(items)
    if dataclasses.is_dataclass(tree) and not isinstance(tree, type):
        return dataclasses.replace(tree, **{f.name: _map(getattr(tree, f.name), fn, tensor_type)
                                            for f in dataclasses.fields(tree) if f.init})
    return tree


def accelerator_initialized() -> bool:
    """Whether this process has initialised an accelerator runtime (CUDA), i.e. could hold an
    accelerator tensor at all. A C call, unlike walking an item's tensors."""
    torch = _torch_if_loaded()
    return torch is not None and torch.cuda.is_initialized()


def staged_to_host(tree: Any) -> tuple[Any, bool]:
    """(``tree`` with every accelerator tensor copied to CPU memory, whether any was). One walk
    of the tree, none in a process that never initialised an accelerator (a CPU worker's every
    channel message: the walk cost about 20 us per policy query); CPU tensors are not copied."""
    if not accelerator_initialized():
        return tree, False
    moved = []

    def host(t):
        if t.device.type == "cpu":
            return t
        moved.append(True)
        return t.cpu()

    out = map_tensors(tree, host)
    return (out, True) if moved else (tree, False)


def to_host(tree: Any) -> Any:
    """Copy every accelerator tensor in ``tree`` to CPU memory (CPU tensors are not copied)."""
    return staged_to_host(tree)[0]


def to_worker_device(tree: Any, devices: Sequence[Device]) -> Any:
    """Move every tensor in ``tree`` onto the calling worker's own device."""
    target = torch_device(devices)
    if target == "cpu":
        return tree
    return map_tensors(tree, lambda t: t.to(target, non_blocking=True))


def payload_nbytes(tree: Any, unknown: int) -> int:
    """Estimate the bytes of a nested structure of tensors, arrays and scalars.

    Args:
        tree: The item.
        unknown: Bytes to count for a leaf of unknown type (an arbitrary object).

    Returns:
        Sum of tensor/array buffer sizes plus string/bytes lengths; scalars count 8 bytes.
    """
    if isinstance(tree, (bool, int, float, type(None))):
        return 8
    if isinstance(tree, (str, bytes, bytearray)):
        return len(tree)
    if isinstance(tree, Mapping):
        return sum(payload_nbytes(k, unknown) + payload_nbytes(v, unknown) for k, v in tree.items())
    if isinstance(tree, (list, tuple)):
        return sum(payload_nbytes(v, unknown) for v in tree)
    if dataclasses.is_dataclass(tree) and not isinstance(tree, type):
        return sum(payload_nbytes(getattr(tree, f.name), unknown) for f in dataclasses.fields(tree))
    nbytes = getattr(tree, "nbytes", None)  # numpy arrays and torch tensors (torch >= 2.1)
    return nbytes if isinstance(nbytes, int) else unknown


def set_cpu_threads(num_threads: int) -> None:
    """Limit a worker process's intra-op CPU threads (OpenMP/MKL and, if loaded, torch).

    Call it before the worker's code imports torch so the environment variables take effect;
    torch is only adjusted here when it is already imported (importing it costs seconds).
    """
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = str(num_threads)
    torch = _torch_if_loaded()
    if torch is not None:
        torch.set_num_threads(num_threads)


def _torch_if_loaded():
    import sys

    return sys.modules.get("torch")
