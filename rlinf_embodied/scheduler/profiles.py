"""Component profiles: measured (or analytic) time and memory per micro-batch, as data.

A :class:`ComponentProfile` holds what the scheduler needs to know about one worker group
(paper section 3.4, "the scheduler profiles component time and memory"): the wall time of one
call on a micro-batch of ``b`` items on one device, the peak device memory of that call, the
memory that stays resident between calls, onload/offload costs (context switching, section 3.3)
and how the component scales data-parallel. A :class:`WorkflowProfile` bundles the components of
one workflow with the device memory, the weight-sync cost and the link speed of the hardware it
was measured on.

Interpolation (the cost model's only view of a profile): time and peak memory are piecewise
linear in the batch size between profiled points and extended linearly past the end segments
(proportionally from the origin when only one point was profiled, and never below proportional
under the first point); results are clamped at 0.

Data-parallel scaling: on ``d`` devices each device processes ``ceil(items / d)`` items and its
time is multiplied by ``dp_efficiency ** -log2(d)`` (a fixed efficiency loss per doubling). ``dp_efficiency = 1`` is perfect scaling (simulators, inference);
training pays for the gradient all-reduce (default analytic value 0.97 per doubling, an
assumption, not a paper number).

CPU cores (CPU-only clusters): CPU device slots are shares of one node's cores, so groups on
different slots are not independent devices. :attr:`WorkflowProfile.cpu_cores` records the cores
the slots share (0 on accelerators, where nothing below applies), each component its busy threads
(``cpu_threads``), the extra cost per call of alternating with its ring partner on those cores
(``ring_s``: the partner's idle OpenMP threads spin for milliseconds after each of its calls),
and every component what the real training loop adds beyond its profiled calls (``loop_s``,
``loop_dp_s``). All of them are measured by running the real loop on the profiling groups
(:func:`~rlinf_embodied.scheduler.auto.measure_profile`).

Messages (paper section 3.5): every channel message between two worker groups costs a fixed
per-message time (the channel's protocol: queue, serialisation, process wake-ups) plus a
per-byte time, and both depend on where producer and consumer run. A :class:`MessageProfile`
holds the seconds of one message (one ``put`` until the matching ``get`` returns) at measured
payload sizes per relation (:data:`RELATIONS`); it is interpolated like component times.
"""

from __future__ import annotations

import bisect
import json
import math
from collections.abc import Mapping
import dataclasses
from dataclasses import asdict, dataclass, replace

__all__ = [
    "ANALYTIC_POLICY_PARAMS",
    "LORA_TRAINABLE_PER_RANK",
    "RELATIONS",
    "ComponentProfile",
    "GiB",
    "MessageProfile",
    "WorkflowProfile",
    "affine_profile",
    "analytic_default_profile",
]

GiB = float(1 << 30)

RELATIONS = ("same_process", "same_node", "cross_node")
"""Where the two ends of a channel message run: one process, two processes of one node, two
nodes. The runtime runs every worker group in its own processes, so messages between groups are
``same_node`` unless the groups sit on different nodes."""


def _interp(xs: tuple[int, ...], ys: tuple[float, ...], x: float) -> float:
    """Piecewise-linear interpolation with linear extrapolation; below the first point never
    less than proportional (``y0 * x / x0``), so small batches never cost nothing."""
    if len(xs) == 1:
        return max(0.0, ys[0] * x / xs[0])
    i = bisect.bisect_left(xs, x)
    i = min(max(i, 1), len(xs) - 1)
    x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
    y = y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    if x < x0:
        y = max(y, y0 * x / x0)
    return max(0.0, y)


@dataclass(frozen=True)
class ComponentProfile:
    """Time and memory of one component (one worker group's per-call work) on one device.

    Attributes:
        name: Worker group name (``env``, ``rollout``, ``actor``, ...).
        batch_sizes: Profiled micro-batch sizes in items (envs stepped, observations forwarded,
            samples trained), strictly increasing.
        time_s: Seconds per call at each batch size on one device.
        peak_bytes: Peak device memory in bytes during a call at each batch size (includes
            ``static_bytes``).
        static_bytes: Device memory resident between calls (weights, optimizer state, simulator
            assets), bytes.
        shard_static: True when ``static_bytes`` is sharded over data-parallel devices (FSDP
            actor); False when each device holds a replica.
        onload_s: Seconds to bring the component onto its device (context switch in).
        offload_s: Seconds to move it off (context switch out).
        dp_efficiency: Throughput factor per doubling of data-parallel devices, in (0, 1].
        stateful_items: True when memory grows with the items *hosted* on a device rather than
            with the call's batch (a GPU simulator keeps every env's state resident; section
            5.1.2, ManiSkill's memory-limited env scaling); ``peak_bytes`` is then per hosted
            envs, and micro-batching does not reduce it.
        cpu_threads: Threads one rank keeps busy while it computes (env processes of an env
            pool; torch intra-op threads of a policy worker); 0 when unknown. Used only where
            device slots share a node's CPU cores (:attr:`WorkflowProfile.cpu_cores` > 0).
        cpu_threads_per_rank: True when every rank brings ``cpu_threads`` threads of its own
            (env pools); False when the runtime divides the node's cores among the group's
            ranks (torch threads: ``node CPUs // ranks``), so the group's demand stays
            ``cpu_threads`` however many ranks it has.
        ring_s: Extra seconds per call when the component alternates with its ring partner on
            shared CPU cores (measured in the real interaction loop: after each call the
            partner's idle OpenMP threads keep spinning on the cores for milliseconds, libgomp's
            ``GOMP_SPINCOUNT``); 0 on real accelerators.
        loop_s: Seconds the real training loop adds per call of a cycle member (per micro-batch
            and round: trajectory bookkeeping, episode resets spread over the rounds) or per
            round of a leaf (per optimizer step: the optimizer update, gradient clipping and
            advantage estimation that the profiled forward + backward leaves out).
        loop_dp_s: Seconds ``loop_s`` grows per doubling of data-parallel ranks (the real
            update's collectives: gradient-norm and metric all-reduces, on ranks that may share
            the cores).

    Raises:
        ValueError: on empty or unsorted batch sizes, mismatched lengths or out-of-range values.
    """

    name: str
    batch_sizes: tuple[int, ...]
    time_s: tuple[float, ...]
    peak_bytes: tuple[float, ...]
    static_bytes: float = 0.0
    shard_static: bool = False
    onload_s: float = 0.0
    offload_s: float = 0.0
    dp_efficiency: float = 1.0
    stateful_items: bool = False
    cpu_threads: float = 0.0
    cpu_threads_per_rank: bool = True
    ring_s: float = 0.0
    loop_s: float = 0.0
    loop_dp_s: float = 0.0

    def __post_init__(self):
        object.__setattr__(self, "batch_sizes", tuple(int(b) for b in self.batch_sizes))
        object.__setattr__(self, "time_s", tuple(float(t) for t in self.time_s))
        object.__setattr__(self, "peak_bytes", tuple(float(m) for m in self.peak_bytes))
        n = len(self.batch_sizes)
        if n == 0 or len(self.time_s) != n or len(self.peak_bytes) != n:
            raise ValueError(
                f"Profile {self.name!r}: batch_sizes, time_s and peak_bytes need the same "
                f"non-zero length (got {n}, {len(self.time_s)}, {len(self.peak_bytes)})."
            )
        if any(b <= 0 for b in self.batch_sizes) or list(self.batch_sizes) != sorted(
            set(self.batch_sizes)
        ):
            raise ValueError(
                f"Profile {self.name!r}: batch_sizes must be positive and strictly increasing "
                f"(got {self.batch_sizes})."
            )
        if not 0.0 < self.dp_efficiency <= 1.0:
            raise ValueError(
                f"Profile {self.name!r}: dp_efficiency must be in (0, 1] (got {self.dp_efficiency})."
            )
        if min(self.cpu_threads, self.ring_s, self.loop_s, self.loop_dp_s) < 0:
            raise ValueError(
                f"Profile {self.name!r}: cpu_threads, ring_s, loop_s and loop_dp_s must be >= 0 "
                f"(got {self.cpu_threads}, {self.ring_s}, {self.loop_s}, {self.loop_dp_s}); "
                "re-profile."
            )

    def time(self, batch: float) -> float:
        """Seconds for one call on ``batch`` items on one device (interpolated)."""
        return 0.0 if batch <= 0 else _interp(self.batch_sizes, self.time_s, batch)

    def activation_bytes(self, batch: float) -> float:
        """Peak bytes above the static footprint for a call on ``batch`` items."""
        if batch <= 0:
            return 0.0
        return max(0.0, _interp(self.batch_sizes, self.peak_bytes, batch) - self.static_bytes)

    def memory(self, batch: float, devices: int, hosted: float | None = None) -> float:
        """Peak bytes per device running data-parallel on ``devices`` devices.

        Args:
            batch: Items per device per call.
            devices: Data-parallel devices (shards ``static_bytes`` when ``shard_static``).
            hosted: Items resident per device (envs); used instead of ``batch`` when
                ``stateful_items``.
        """
        static = self.static_bytes / devices if self.shard_static else self.static_bytes
        items = hosted if (self.stateful_items and hosted is not None) else batch
        return static + self.activation_bytes(items)

    def loop_time(self, devices: int = 1) -> float:
        """``loop_s`` on ``devices`` data-parallel ranks (plus ``loop_dp_s`` per doubling)."""
        return self.loop_s + (self.loop_dp_s * math.log2(devices) if devices > 1 else 0.0)

    def demand(self, devices: int) -> float:
        """CPU threads the group keeps busy on ``devices`` device slots while it computes."""
        return self.cpu_threads * (devices if self.cpu_threads_per_rank else 1)

    def scale(self, devices: int) -> float:
        """Multiplier of per-device time on ``devices`` data-parallel devices (>= 1)."""
        return self.dp_efficiency ** (-math.log2(devices)) if devices > 1 else 1.0

    def scaled(self, time_factor: float = 1.0, memory_factor: float = 1.0) -> ComponentProfile:
        """This profile on other hardware: times and memory multiplied (section 5.2 style
        planning of clusters this machine cannot hold)."""
        return replace(
            self,
            time_s=tuple(t * time_factor for t in self.time_s),
            peak_bytes=tuple(m * memory_factor for m in self.peak_bytes),
            static_bytes=self.static_bytes * memory_factor,
            onload_s=self.onload_s * time_factor,
            offload_s=self.offload_s * time_factor,
            ring_s=self.ring_s * time_factor,
            loop_s=self.loop_s * time_factor,
            loop_dp_s=self.loop_dp_s * time_factor,
        )


@dataclass(frozen=True)
class MessageProfile:
    """Measured cost of one channel message by payload size and placement relation.

    Attributes:
        payload_bytes: Payload sizes measured, bytes (tensor bytes of the message), strictly
            increasing.
        hop_s: Relation (one of :data:`RELATIONS`) -> seconds per message at each size: from
            the producer's ``put`` until the consumer's ``get`` returns the item (half of a
            measured ping-pong round trip between two processes; a put then get within one
            process for ``same_process``).
        source: How the numbers were obtained (``measured ...`` or ``analytic ...``).
        per_tensor_s: Relation -> extra seconds per tensor beyond the first in one message
            (``hop_s`` is measured with one tensor; every tensor is serialised on its own).

    Raises:
        ValueError: on unsorted sizes, an unknown relation or mismatched lengths.
    """

    payload_bytes: tuple[float, ...]
    hop_s: Mapping[str, tuple[float, ...]]
    source: str = "measured"
    per_tensor_s: Mapping[str, float] = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        object.__setattr__(self, "payload_bytes", tuple(float(b) for b in self.payload_bytes))
        object.__setattr__(
            self, "hop_s", {k: tuple(float(t) for t in v) for k, v in sorted(self.hop_s.items())}
        )
        xs = self.payload_bytes
        if not xs or list(xs) != sorted(set(xs)) or xs[0] < 0:
            raise ValueError(
                f"MessageProfile.payload_bytes must be non-negative and strictly increasing "
                f"(got {xs})."
            )
        for rel, ts in self.hop_s.items():
            if rel not in RELATIONS:
                raise ValueError(f"Unknown message relation {rel!r}; use one of {RELATIONS}.")
            if len(ts) != len(xs):
                raise ValueError(
                    f"MessageProfile.hop_s[{rel!r}] has {len(ts)} times for {len(xs)} sizes; "
                    "give one time per payload size."
                )

    def time(self, nbytes: float, relation: str, tensors: int = 1) -> float:
        """Seconds for one message of ``nbytes`` payload bytes in ``tensors`` tensors between
        ends in ``relation``.

        Piecewise linear in bytes between measured sizes, the smallest size's time below it (a
        message never costs less than its fixed part), the last segment's slope (>= 0) above;
        constant when only one size was measured.
        ``cross_node`` falls back to ``same_node`` when not measured (the caller adds the link
        transfer, see :meth:`WorkflowProfile.message_s`); ``same_process`` falls back likewise.

        Raises:
            KeyError: if neither ``relation`` nor ``same_node`` was measured.
        """
        rel = relation if relation in self.hop_s else "same_node"
        extra = max(0, tensors - 1) * self.per_tensor_s.get(rel, 0.0)
        return self._interp(nbytes, rel) + extra

    def _interp(self, nbytes: float, relation: str) -> float:
        ts = self.hop_s.get(relation)
        if ts is None:
            raise KeyError(
                f"No message cost for {relation!r} (measured: {sorted(self.hop_s)}); re-profile "
                "the channel."
            )
        xs = self.payload_bytes
        if nbytes <= xs[0] or len(xs) == 1:
            return ts[0]
        i = min(bisect.bisect_left(xs, nbytes), len(xs) - 1)
        slope = (ts[i] - ts[i - 1]) / (xs[i] - xs[i - 1])
        if nbytes > xs[-1]:
            slope = max(0.0, slope)
        return max(0.0, ts[i - 1] + slope * (nbytes - xs[i - 1]))

    def measured(self, relation: str) -> bool:
        """Whether ``relation`` has its own numbers (not a fallback)."""
        return relation in self.hop_s


@dataclass(frozen=True)
class WorkflowProfile:
    """Profiles of all components of a workflow plus hardware facts.

    Attributes:
        components: Worker group name -> its profile.
        device_memory_bytes: Usable memory of one device, bytes.
        weight_sync_s: Seconds to push the actor's weights to the rollout group once per
            iteration.
        link_bandwidth_Bps: Bytes per second between device groups (channel transfers of a
            spatial plan; collocated groups transfer for free).
        link_latency_s: Fixed seconds per transfer.
        hardware: Free-text description of the machine the profile was measured on.
        source: Where the numbers come from (``measured``, ``cached``, ``analytic default``).
        messages: Cost of one channel message (see :class:`MessageProfile`), or None: then
            messages between groups on shared devices are free and those between disjoint
            device groups cost :meth:`transfer_s` (the model before messages were profiled).
        devices_per_node: Devices of one node (0: all devices on one node); groups whose
            devices together exceed it exchange ``cross_node`` messages.
        cpu_cores: Physical CPU cores that the device slots of a node share (CPU device slots
            are shares of one node, not devices of their own), or 0 when the devices are real
            accelerators. With cores > 0 the cost model charges the CPU: ring members pay
            their :attr:`ComponentProfile.ring_s`, and groups that run at the same time (a
            pipelined ring, a chunked spatial pipeline) can go no faster than their core-seconds
            over ``cpu_cores``.
    """

    components: Mapping[str, ComponentProfile]
    device_memory_bytes: float
    weight_sync_s: float = 0.0
    link_bandwidth_Bps: float = 10e9
    link_latency_s: float = 0.0
    hardware: str = "unknown"
    source: str = "measured"
    messages: MessageProfile | None = None
    devices_per_node: int = 0
    cpu_cores: int = 0

    def __getitem__(self, name: str) -> ComponentProfile:
        try:
            return self.components[name]
        except KeyError:
            raise KeyError(
                f"No profile for component {name!r}; profiled: {sorted(self.components)}. "
                "Re-run the profiler with that worker group."
            ) from None

    def transfer_s(self, nbytes: float) -> float:
        """Seconds to move ``nbytes`` between two device groups."""
        return 0.0 if nbytes <= 0 else self.link_latency_s + nbytes / self.link_bandwidth_Bps

    def message_s(self, nbytes: float, apart: bool, devices: int = 1, tensors: int = 1) -> float:
        """Seconds one channel message of ``nbytes`` takes between two worker groups.

        Args:
            nbytes: Payload bytes.
            apart: True when the two groups run on disjoint devices, False when they share
                devices (collocated: different processes on the same devices).
            devices: Devices the two groups span together (decides same node vs cross node).
            tensors: Tensors in the message.

        Without :attr:`messages` this is the pre-message model: 0 on shared devices,
        :meth:`transfer_s` between disjoint ones. With it: the measured ``same_node`` message,
        or ``cross_node`` when the groups cannot fit on one node (measured, else ``same_node``
        plus :meth:`transfer_s`).
        """
        if self.messages is None:
            return self.transfer_s(nbytes) if apart else 0.0
        cross = apart and 0 < self.devices_per_node < devices
        if not cross:
            return self.messages.time(nbytes, "same_node", tensors)
        if self.messages.measured("cross_node"):
            return self.messages.time(nbytes, "cross_node", tensors)
        return self.messages.time(nbytes, "same_node", tensors) + self.transfer_s(nbytes)

    def scaled(
        self, time_factor: float = 1.0, device_memory_bytes: float | None = None
    ) -> WorkflowProfile:
        """The same workflow on other hardware: every time multiplied by ``time_factor``,
        optionally another device memory (paper section 5.2 scale studies)."""
        return replace(
            self,
            components={k: c.scaled(time_factor) for k, c in self.components.items()},
            weight_sync_s=self.weight_sync_s * time_factor,
            device_memory_bytes=device_memory_bytes or self.device_memory_bytes,
            source=f"{self.source}, scaled x{time_factor:g}",
        )

    def to_json(self) -> str:
        """Canonical JSON text (sorted keys) of this profile."""
        d = asdict(self)
        d["components"] = {k: asdict(v) for k, v in sorted(self.components.items())}
        d["messages"] = None if self.messages is None else asdict(self.messages)
        return json.dumps(d, sort_keys=True, indent=1)

    @classmethod
    def from_json(cls, text: str) -> WorkflowProfile:
        """Inverse of :meth:`to_json`.

        Raises:
            ValueError: if the text is not a profile written by :meth:`to_json`.
        """
        try:
            d = json.loads(text)
            comps = {k: ComponentProfile(**v) for k, v in d.pop("components").items()}
            msgs = d.pop("messages", None)
            return cls(
                components=comps, messages=None if msgs is None else MessageProfile(**msgs), **d
            )
        except (KeyError, TypeError, json.JSONDecodeError) as e:
            raise ValueError(
                f"Not a workflow profile ({e}); delete the cached file to re-profile."
            ) from e


# --------------------------------------------------------------------------------------------
# Analytic default profile
# --------------------------------------------------------------------------------------------
def affine_profile(
    name: str,
    fixed_s: float,
    per_item_s: float,
    static_bytes: float = 0.0,
    per_item_bytes: float = 0.0,
    batch_sizes: tuple[int, ...] = (1, 8, 64, 256, 1024),
    **kwargs,
) -> ComponentProfile:
    """A profile with time ``fixed_s + per_item_s * b`` and peak memory ``static_bytes +
    per_item_bytes * b`` sampled at ``batch_sizes`` (analytic defaults, tests, what-ifs).

    ``kwargs`` are the remaining :class:`ComponentProfile` fields (``shard_static``,
    ``onload_s``, ``offload_s``, ``dp_efficiency``, ``stateful_items``).
    """
    return ComponentProfile(
        name=name,
        batch_sizes=batch_sizes,
        time_s=tuple(fixed_s + per_item_s * b for b in batch_sizes),
        peak_bytes=tuple(static_bytes + per_item_bytes * b for b in batch_sizes),
        static_bytes=static_bytes,
        **kwargs,
    )


@dataclass(frozen=True)
class _Analytic:
    """Affine time model ``fixed_s + per_item_s * b`` and memory ``static + per_item * b``."""

    fixed_s: float
    per_item_s: float
    static_gib: float
    per_item_gib: float
    shard_static: bool = False
    onload_s: float = 0.0
    dp_efficiency: float = 1.0
    stateful_items: bool = False

    def profile(self, name: str) -> ComponentProfile:
        return affine_profile(
            name,
            self.fixed_s,
            self.per_item_s,
            self.static_gib * GiB,
            self.per_item_gib * GiB,
            shard_static=self.shard_static,
            onload_s=self.onload_s,
            offload_s=self.onload_s,
            dp_efficiency=self.dp_efficiency,
            stateful_items=self.stateful_items,
        )


# Order-of-magnitude guesses for an 80 GB accelerator, NOT measurements: they make `plan` give a
# sensible answer before anything has been profiled. Env entries are per env step of one env
# (ManiSkill GPU simulation is memory-hungry per env, section 5.1.2); policy entries are per
# observation (rollout) and per training sample (actor, forward + backward, FSDP-sharded state).
_ENV_ANALYTIC: dict[str, _Analytic] = {
    "maniskill": _Analytic(5e-3, 2e-4, 2.0, 0.05, onload_s=2.0, stateful_items=True),
    "libero": _Analytic(1e-3, 2e-2, 0.5, 0.01, onload_s=1.0, stateful_items=True),
    "gym": _Analytic(1e-4, 1e-5, 0.0, 0.0),
}
_ROLLOUT_ANALYTIC: dict[str, _Analytic] = {
    "mlp": _Analytic(5e-4, 1e-6, 0.01, 1e-5),
    "cnn": _Analytic(1e-3, 2e-5, 0.05, 2e-4),
    "openvla": _Analytic(0.1, 2e-3, 15.0, 0.02, onload_s=3.0),
    "openvla_oft": _Analytic(0.05, 1e-3, 15.0, 0.02, onload_s=3.0),
    # π0 / π0.5 (3.3B: bf16 weights ~7 GiB); times as the OFT's (one parallel chunk per query)
    "pi0": _Analytic(0.05, 1e-3, 7.0, 0.01, onload_s=1.5),
    "pi05": _Analytic(0.05, 1e-3, 7.0, 0.01, onload_s=1.5),
}
_ACTOR_ANALYTIC: dict[str, _Analytic] = {
    "mlp": _Analytic(1e-3, 3e-6, 0.03, 3e-5, shard_static=True, dp_efficiency=0.97),
    "cnn": _Analytic(2e-3, 6e-5, 0.15, 6e-4, shard_static=True, dp_efficiency=0.97),
    "openvla": _Analytic(
        0.2, 6e-3, 120.0, 0.3, shard_static=True, onload_s=8.0, dp_efficiency=0.97
    ),
    "openvla_oft": _Analytic(
        0.1, 3e-3, 120.0, 0.3, shard_static=True, onload_s=8.0, dp_efficiency=0.97
    ),
    # 3.3B x 16 bytes (weights, gradients, Adam's two moments) ~ 53 GiB, sharded
    "pi0": _Analytic(0.1, 3e-3, 55.0, 0.15, shard_static=True, onload_s=4.0, dp_efficiency=0.97),
    "pi05": _Analytic(0.1, 3e-3, 55.0, 0.15, shard_static=True, onload_s=4.0, dp_efficiency=0.97),
}

#: Parameters of the published model each VLA row above is guessed for (OpenVLA: 7.5B, the
#: Prismatic 7B of arXiv 2406.09246; π0 / π0.5: 3.3B, PaliGemma 3B + the 300M action expert of
#: arXiv 2410.24164). ``analytic_default_profile(policy_params=...)`` scales memory by the ratio.
ANALYTIC_POLICY_PARAMS: dict[str, float] = {
    "openvla": 7.5e9, "openvla_oft": 7.5e9, "pi0": 3.3e9, "pi05": 3.3e9}

#: LoRA's trainable share of the parameters per unit of rank: rank-r adapters on every linear
#: layer of OpenVLA's Llama-2 7B (q, k, v, o: 4096 x 4096; gate, up, down: 4096 x 11008) hold
#: r x 78,080 x 32 layers = r x 2.5M weights, 3.3e-4 x r of 7.5B (rank 32: 80M, 1.3 GB of
#: weights, gradients and Adam state).
LORA_TRAINABLE_PER_RANK = 3.3e-4


# Guess, not a measurement: about 1 ms per channel message (a queue-actor round trip plus a
# process wake-up on an idle machine) and 5 GB/s for the payload (one host memory copy).
_MESSAGE_FIXED_S, _MESSAGE_BPS = 1e-3, 5e9
_ANALYTIC_MESSAGES = MessageProfile(
    payload_bytes=(0.0, float(64 << 20)),
    hop_s={"same_node": (_MESSAGE_FIXED_S, _MESSAGE_FIXED_S + (64 << 20) / _MESSAGE_BPS)},
    source="analytic guess (1 ms + bytes / 5 GB/s per message; not measured)",
)


def analytic_default_profile(env_type: str, policy_type: str, accelerator: bool = True,
                             policy_params: float | None = None, lora_rank: int = 0) -> WorkflowProfile:
    """The documented, unmeasured profile used by ``plan`` before any profile exists.

    Affine time and memory per component from the tables in this module (order-of-magnitude
    guesses for an 80 GiB accelerator with a 25 GB/s link; see the comments there) and a guessed
    channel message cost (1 ms + bytes / 5 GB/s). Use it to explore, then measure: plans on
    measured profiles replace it.

    Args:
        env_type: ``env.type`` of the job (unknown types fall back to ``gym``).
        policy_type: ``policy.type`` of the job (unknown types fall back to ``mlp``).
        accelerator: False for CPU devices: state already lives in host memory, so offload and
            onload move nothing and cost 0 s (the tables' onload seconds are for an
            accelerator's host link).
        policy_params: Parameters of the job's model (``policies.size.parameter_count``):
            the rollout's and actor's memory and the weight sync of a VLA row are scaled by its
            ratio to :data:`ANALYTIC_POLICY_PARAMS` (a tiny preset is not priced as the 7B
            model); times stay the published size's guesses. None keeps the published size.
        lora_rank: ``policy.lora_rank`` of a VLA row: the actor's static memory becomes the
            frozen bf16 weights (2 bytes per parameter) plus 16 bytes per trainable LoRA
            parameter (:data:`LORA_TRAINABLE_PER_RANK`) instead of full fine-tuning's 16 bytes
            per parameter; its activations are kept.

    Returns:
        A profile with components ``env``, ``rollout`` and ``actor``; ``source`` says it is the
        analytic default.
    """
    env = _ENV_ANALYTIC.get(env_type, _ENV_ANALYTIC["gym"])
    rollout = _ROLLOUT_ANALYTIC.get(policy_type, _ROLLOUT_ANALYTIC["mlp"])
    actor = _ACTOR_ANALYTIC.get(policy_type, _ACTOR_ANALYTIC["mlp"])
    ref = ANALYTIC_POLICY_PARAMS.get(policy_type)
    sync = 0.5 if ref else 0.01
    factor = policy_params / ref if (ref and policy_params) else 1.0
    if not accelerator:
        env, rollout, actor = (dataclasses.replace(a, onload_s=0.0) for a in (env, rollout, actor))
    if ref and policy_params is None:
        sized = f", {ref / 1e9:.2g}B parameters assumed (the published size)"
    else:
        sized = "" if factor == 1.0 else f", memory scaled to {policy_params / 1e6:.3g}M parameters"
    if ref and lora_rank > 0:  # frozen bf16 weights + the adapters' full training state
        share = min(1.0, LORA_TRAINABLE_PER_RANK * lora_rank)
        actor = dataclasses.replace(actor, static_gib=actor.static_gib * (2 + 16 * share) / 16)
        sized += f", LoRA rank {lora_rank}"
    return WorkflowProfile(
        components={
            "env": env.profile("env"),
            "rollout": rollout.profile("rollout").scaled(memory_factor=factor),
            "actor": actor.profile("actor").scaled(memory_factor=factor),
        },
        device_memory_bytes=80 * GiB,
        weight_sync_s=max(0.01, sync * factor),
        link_bandwidth_Bps=25e9,
        link_latency_s=1e-4,
        hardware="analytic 80 GiB accelerator" if accelerator else "analytic CPU devices (free offload)",
        messages=_ANALYTIC_MESSAGES,
        source=(f"analytic default (env={env_type}, policy={policy_type}{sized}"
                + ("" if accelerator else ", CPU devices: offload costs 0 s") + "; not measured)"),
    )

