"""Profiler: run each component alone at several batch sizes and record time and memory.

Paper section 3.4: "the scheduler profiles component time and memory". A component is anything
that can run one micro-batch of ``b`` items and say how long it took and how much device memory
it peaked at (:class:`Component`); :class:`FunctionComponent` wraps a plain callable and
:class:`WorkerGroupComponent` wraps a runtime worker-group method, whose per-rank call timings
(paper section 4, worker-group timers) are the measured time. :func:`profile_messages` measures
what one channel message costs (paper section 3.5) with a real round trip through the runtime's
:class:`~rlinf_embodied.runtime.Channel` between two worker processes, at the payload sizes the job
sends. Profiles are cached per (config, hardware) key in the run directory as JSON, written
atomically (temp file + rename).
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from rlinf_embodied.scheduler.profiles import ComponentProfile, MessageProfile, WorkflowProfile

__all__ = [
    "PROFILE_FILE",
    "Component",
    "FunctionComponent",
    "Measurement",
    "WorkerGroupComponent",
    "cache_key",
    "hardware_fingerprint",
    "load_profile",
    "message_payload",
    "profile_component",
    "profile_messages",
    "profile_workflow",
    "save_profile",
]

PROFILE_FILE = "scheduler_profile.json"
"""Name of the cached profile inside a run directory."""


@dataclass(frozen=True)
class Measurement:
    """One call of a component.

    Attributes:
        time_s: Seconds the call took (on the slowest device for a group).
        peak_bytes: Peak device memory during the call, bytes (0 when unknown).
    """

    time_s: float
    peak_bytes: float = 0.0


@runtime_checkable
class Component(Protocol):
    """What the profiler needs from a worker group (or anything else).

    ``run(b)`` processes one micro-batch of ``b`` items on one device. The optional methods
    default to "free": ``onload``/``offload`` return their seconds, ``static_bytes`` the memory
    resident between calls.
    """

    name: str

    def run(self, batch: int) -> Measurement: ...


class FunctionComponent:
    """A component from callables.

    Args:
        name: Worker group name the profile is for.
        run: ``run(batch) -> Measurement | float | None``; a float is taken as peak bytes, None
            as unknown memory; the wall time of the call is the time unless a Measurement says
            otherwise.
        onload: Callable moving state onto the device (timed), or None.
        offload: Callable moving state off the device (timed), or None.
        static_bytes: Resident memory between calls, bytes.
        shard_static: Whether the static memory shards over data-parallel devices.
        dp_efficiency: Throughput factor per doubling of devices (see ``profiles``).
    """

    def __init__(
        self,
        name: str,
        run: Callable[[int], Any],
        onload: Callable[[], Any] | None = None,
        offload: Callable[[], Any] | None = None,
        static_bytes: float = 0.0,
        shard_static: bool = False,
        dp_efficiency: float = 1.0,
    ):
        self.name = name
        self._run, self._onload, self._offload = run, onload, offload
        self.static_bytes = static_bytes
        self.shard_static = shard_static
        self.dp_efficiency = dp_efficiency

    def run(self, batch: int) -> Measurement:
        t0 = time.perf_counter()
        out = self._run(batch)
        wall = time.perf_counter() - t0
        if isinstance(out, Measurement):
            return out
        return Measurement(wall, float(out or 0.0))

    def onload(self) -> float:
        return _timed(self._onload)

    def offload(self) -> float:
        return _timed(self._offload)


def _timed(fn: Callable[[], Any] | None) -> float:
    if fn is None:
        return 0.0
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


class WorkerGroupComponent:
    """A runtime worker-group method as a component (launch the group on one device).

    The method is called as ``group.<method>(batch)``; each rank returns its peak device memory
    in bytes (or None). The time is the slowest rank's timing from the call handle (the
    worker-group timer of paper section 4), or with ``include_dispatch`` the driver's wall time
    of the call, which adds the Ray dispatch cost a driver-orchestrated runner pays per call
    (use it when calls are short, a few milliseconds).

    Args:
        name: Worker group name.
        group: A started ``WorkerGroup``.
        method: Name of the method running one micro-batch.
        onload_method: Method moving state onto the device, or None.
        offload_method: Method moving state off the device, or None.
        static_bytes: Resident memory between calls, bytes.
        shard_static: Whether the static memory shards over data-parallel devices.
        dp_efficiency: Throughput factor per doubling of devices.
        include_dispatch: Time calls from the driver instead of inside the workers.
    """

    def __init__(
        self,
        name: str,
        group: Any,
        method: str,
        onload_method: str | None = None,
        offload_method: str | None = None,
        static_bytes: float = 0.0,
        shard_static: bool = False,
        dp_efficiency: float = 1.0,
        include_dispatch: bool = False,
    ):
        self.name, self.group, self.method = name, group, method
        self.include_dispatch = include_dispatch
        self._on, self._off = onload_method, offload_method
        self.static_bytes = static_bytes
        self.shard_static = shard_static
        self.dp_efficiency = dp_efficiency

    def _call(self, method: str, *args) -> tuple[float, list]:
        t0 = time.perf_counter()
        handle = getattr(self.group, method)(*args)
        values = handle.wait()
        wall = time.perf_counter() - t0
        return (wall if self.include_dispatch else handle.timing.max), values

    def run(self, batch: int) -> Measurement:
        t, values = self._call(self.method, batch)
        return Measurement(t, float(max((v or 0.0) for v in values)))

    def onload(self) -> float:
        return self._call(self._on)[0] if self._on else 0.0

    def offload(self) -> float:
        return self._call(self._off)[0] if self._off else 0.0


def profile_component(
    component: Component, batch_sizes: Sequence[int], repeats: int = 3, warmup: int = 1
) -> ComponentProfile:
    """Run ``component`` alone at each batch size and summarise.

    Args:
        component: The component (see :class:`Component`).
        batch_sizes: Micro-batch sizes to measure, in items.
        repeats: Timed calls per batch size; the median is recorded.
        warmup: Untimed calls per batch size first (compilation, caches, allocator).

    Returns:
        A :class:`ComponentProfile` with median time and maximum peak memory per size, plus the
        median of three offload/onload cycles when the component has them.

    Raises:
        ValueError: for no batch sizes or ``repeats`` < 1.
    """
    sizes = sorted(set(int(b) for b in batch_sizes))
    if not sizes or sizes[0] < 1 or repeats < 1:
        raise ValueError(
            f"Profile with positive batch sizes and repeats >= 1 (got {batch_sizes}, {repeats})."
        )
    times, peaks = [], []
    for b in sizes:
        for _ in range(warmup):
            component.run(b)
        ms = [component.run(b) for _ in range(repeats)]
        times.append(statistics.median(m.time_s for m in ms))
        peaks.append(max(m.peak_bytes for m in ms))
    static = float(getattr(component, "static_bytes", 0.0))
    onload = offload = 0.0
    if hasattr(component, "offload") and hasattr(component, "onload"):
        cycles = [(component.offload(), component.onload()) for _ in range(3)]
        offload = statistics.median(c[0] for c in cycles)
        onload = statistics.median(c[1] for c in cycles)
    return ComponentProfile(
        name=component.name,
        batch_sizes=tuple(sizes),
        time_s=tuple(times),
        peak_bytes=tuple(max(p, static) for p in peaks),
        static_bytes=static,
        shard_static=bool(getattr(component, "shard_static", False)),
        onload_s=onload,
        offload_s=offload,
        dp_efficiency=float(getattr(component, "dp_efficiency", 1.0)),
    )


def profile_workflow(
    components: Sequence[Component],
    batch_sizes: Mapping[str, Sequence[int]],
    device_memory_bytes: float,
    weight_sync: Callable[[], Any] | None = None,
    repeats: int = 3,
    warmup: int = 1,
    link_bandwidth_Bps: float = 10e9,
    hardware: str | None = None,
    messages: MessageProfile | None = None,
) -> WorkflowProfile:
    """Profile every component and the weight sync.

    Args:
        components: One per worker group.
        batch_sizes: Group name -> batch sizes to measure.
        device_memory_bytes: Usable memory per device.
        weight_sync: Callable performing one actor -> rollout weight sync (timed, median of 3).
        repeats: See :func:`profile_component`.
        warmup: See :func:`profile_component`.
        link_bandwidth_Bps: Bytes per second between device groups.
        hardware: Description; defaults to :func:`hardware_fingerprint`.
        messages: Channel message costs (:func:`profile_messages`), or None.

    Raises:
        KeyError: if a component has no entry in ``batch_sizes``.
    """
    profiles = {}
    for c in components:
        if c.name not in batch_sizes:
            raise KeyError(f"No batch sizes for component {c.name!r}; add batch_sizes[{c.name!r}].")
        profiles[c.name] = profile_component(c, batch_sizes[c.name], repeats, warmup)
    sync = statistics.median(_timed(weight_sync) for _ in range(3)) if weight_sync else 0.0
    return WorkflowProfile(
        components=profiles,
        device_memory_bytes=device_memory_bytes,
        weight_sync_s=sync,
        link_bandwidth_Bps=link_bandwidth_Bps,
        hardware=hardware or hardware_fingerprint(),
        source="measured",
        messages=messages,
    )


# --------------------------------------------------------------------------------------------
# Channel messages
# --------------------------------------------------------------------------------------------
def message_payload(nbytes: float, tensors: int = 1) -> dict:
    """A message shaped like the job's (a dict of tensors plus small fields) carrying ``nbytes``
    tensor bytes in ``tensors`` float32 tensors: a policy request's ``obs`` dict, a seed, a reply
    key and flags.

    Args:
        nbytes: Tensor payload in bytes (rounded down to whole float32 values, at least one per
            tensor).
        tensors: Number of tensors the bytes are split over (>= 1).

    Returns:
        ``{"obs": {"t0": float32 (nbytes / 4 / tensors,), ...}, "seed": int, "reply": str,
        "mode": str, "values_only": bool}``.
    """
    import torch

    per = max(1, int(nbytes) // 4 // max(1, tensors))
    return {
        "obs": {f"t{i}": torch.zeros(per, dtype=torch.float32) for i in range(max(1, tensors))},
        "seed": 0,
        "reply": "probe",
        "mode": "sample",
        "values_only": False,
    }


def _probe_worker_cls():
    """The probe worker class (built lazily: importing the profiler must not import Ray)."""
    from rlinf_embodied.runtime import Channel, Worker

    class ChannelProbe(Worker):
        """One end of a channel round trip; ``there``/``back`` are channel names."""

        def __init__(self, there: str, back: str):
            self.there, self.back = Channel.connect(there), Channel.connect(back)
            if hasattr(Channel, "bind"):  # consumers that bind their keys get items directly
                if self.rank == 1:
                    self.there.bind("ping")
                else:
                    self.back.bind("pong")
                    self.there.bind("self")

        def echo(self, count: int) -> int:
            """Return ``count`` messages from ``there`` on ``back``, unchanged."""
            for _ in range(count):
                self.back.put(self.there.get(key="ping"), key="pong")
            return count

        def round_trips(self, payload: Any, count: int, echoed: bool = True) -> list:
            """Seconds of ``count`` round trips ``there`` -> echo -> ``back`` (``echoed``), or
            of put-then-get pairs on ``there`` within this process."""
            reply, key_in, key_out = (self.back, "pong", "ping") if echoed else (self.there, "self", "self")
            out = []
            for _ in range(count):
                t0 = time.perf_counter()
                self.there.put(payload, key=key_out)
                reply.get(key=key_in)
                out.append(time.perf_counter() - t0)
            return out

    return ChannelProbe


def profile_messages(
    cluster: Any,
    payload_bytes: Sequence[float],
    repeats: int = 20,
    warmup: int = 3,
    same_process: bool = True,
    tensor_probe: int = 8,
) -> MessageProfile:
    """Measure one channel message at each payload size between two real worker processes.

    Two probe workers (one process each, on devices 0 and 1 when the cluster has two devices,
    else both on device 0) exchange :func:`message_payload` items through two runtime channels:
    rank 0 puts, rank 1 gets and puts the same item back, rank 0 gets it. Half the median round
    trip is the ``same_node`` cost of one message (both processes are on the driver's node; the
    measurement goes through the public ``Channel`` API, consumers binding their keys as the
    job's workers do where the channel offers ``bind``, so it follows whatever transport the
    channel picks for that placement). With ``same_process`` rank 0 also times a put followed by
    its own get (``same_process``). A message of ``tensor_probe`` tensors at the smallest size
    gives the extra cost per tensor (each tensor is serialised on its own: a reply of actions,
    log-probs, values and forward inputs costs more than one tensor of the same bytes).
    ``cross_node`` is not measured here (one node).

    Args:
        cluster: A runtime ``Cluster`` (its devices place the probes).
        payload_bytes: Tensor bytes per message to measure (the job's observation, action-chunk
            and trajectory messages, see ``auto.message_sizes``).
        repeats: Timed round trips per size; the median is kept.
        warmup: Untimed round trips per size first.
        same_process: Also measure the within-process relation.
        tensor_probe: Tensors of the per-tensor measurement (<= 1: not measured).

    Returns:
        A :class:`MessageProfile` with ``same_node`` (and ``same_process``) times per size and
        the per-tensor cost of each relation.

    Raises:
        ValueError: for no sizes or ``repeats`` < 1.
    """
    import uuid

    from rlinf_embodied.runtime import Channel, WorkerGroup

    sizes = sorted({float(max(0.0, b)) for b in payload_bytes})
    if not sizes or repeats < 1:
        raise ValueError(
            f"Profile messages with at least one size and repeats >= 1 (got {payload_bytes}, "
            f"{repeats})."
        )
    tag = uuid.uuid4().hex[:8]
    there, back = Channel.create(f"probe-{tag}/there"), Channel.create(f"probe-{tag}/back")
    two = int(cluster.num_devices) >= 2
    group = None
    try:
        group = WorkerGroup(
            cluster, _probe_worker_cls(), "message_probe", devices=[0, 1] if two else [0],
            procs_per_device=1 if two else 2, init_args=(there.name, back.name), torch_threads=1,
        )

        def median_hops(payload) -> tuple[float, float]:
            n = warmup + repeats
            echo = group.on([1]).echo(n)
            rtt = group.on([0]).round_trips(payload, n).wait()[0][warmup:]
            echo.wait()
            node = statistics.median(rtt) / 2
            if not same_process:
                return node, 0.0
            loop = group.on([0]).round_trips(payload, n, False).wait()[0][warmup:]
            return node, statistics.median(loop)

        node, proc = zip(*(median_hops(message_payload(b)) for b in sizes))
        per_tensor = {}
        if tensor_probe > 1:
            many = median_hops(message_payload(sizes[0], tensor_probe))
            per_tensor = {"same_node": max(0.0, (many[0] - node[0]) / (tensor_probe - 1))}
            if same_process:
                per_tensor["same_process"] = max(0.0, (many[1] - proc[0]) / (tensor_probe - 1))
    finally:
        if group is not None:
            group.shutdown()
        there.delete()
        back.delete()
    hops = {"same_node": tuple(node)}
    if same_process:
        hops["same_process"] = tuple(proc)
    where = "devices 0 and 1" if two else "device 0"
    return MessageProfile(
        tuple(sizes), hops,
        source=f"measured: runtime Channel round trips between two worker processes ({where}), "
               f"median of {repeats}",
        per_tensor_s=per_tensor,
    )


# --------------------------------------------------------------------------------------------
# Cache
# --------------------------------------------------------------------------------------------
def hardware_fingerprint() -> str:
    """Stable description of this machine's devices (accelerator names or CPU model/count)."""
    try:
        import torch

        if torch.cuda.is_available():
            names = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
            return f"cuda x{len(names)}: {', '.join(sorted(set(names)))}"
    except ImportError:  # pragma: no cover - torch is a dependency
        pass
    return f"cpu x{os.cpu_count()}: {platform.machine()} {platform.processor() or ''}".strip()


def cache_key(config: Mapping[str, Any], hardware: str | None = None) -> str:
    """Hex digest identifying (the profile-relevant config, hardware)."""
    blob = json.dumps({"config": config, "hardware": hardware or hardware_fingerprint()},
                      sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def save_profile(run_dir: str | os.PathLike, key: str, profile: WorkflowProfile) -> Path:
    """Write ``profile`` under ``key`` into ``run_dir/scheduler_profile.json`` atomically.

    Other keys already in the file are kept (one run directory may be planned for several
    configs or machines).
    """
    from rlinf_embodied.checkpoint import atomic_write_text

    path = Path(run_dir) / PROFILE_FILE
    entries = _read_entries(path)
    entries[key] = json.loads(profile.to_json())
    return atomic_write_text(path, json.dumps(entries, sort_keys=True, indent=1))


def load_profile(run_dir: str | os.PathLike, key: str) -> WorkflowProfile | None:
    """The profile cached under ``key`` in ``run_dir``, or None."""
    entry = _read_entries(Path(run_dir) / PROFILE_FILE).get(key)
    if entry is None:
        return None
    prof = WorkflowProfile.from_json(json.dumps(entry))
    return prof if prof.source.startswith("cached") else _as_cached(prof)


def _as_cached(prof: WorkflowProfile) -> WorkflowProfile:
    from dataclasses import replace

    return replace(prof, source=f"cached ({prof.source} on {prof.hardware})")


def _read_entries(path: Path) -> dict:
    if not path.exists():
        return {}
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"Profile cache {path} is corrupt ({e}); delete it to re-profile.") from e
    return data if isinstance(data, dict) else {}
