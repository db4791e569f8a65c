"""Worker (one Ray actor per rank) and WorkerGroup (fan-out calls returning handles).

Paper section 3.2: a role is a class; a runner launches groups of them and calls their methods
asynchronously, synchronising with ``wait()``; data flows through channels, not return values.
Section 4: every remotely invoked method is timed per rank and the times are reachable through
the handle (:mod:`rlinf_embodied.runtime.calls`), which is what the scheduler's profiler reads.

Example::

    class Rollout(Worker):
        def __init__(self, model_path):
            self.model = load(model_path, device=self.torch_device)

        def generate(self, n):
            with self.device_lock(consumes=["obs"]):
                ...

    group = WorkerGroup(cluster, Rollout, "rollout", devices="0-3", init_args=("ckpt",))
    handle = group.generate(8)          # fans out to 4 ranks, returns at once
    results = handle.wait()             # [rank0_result, ..., rank3_result]
    print(handle.timing.max, handle.timing.mean)
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import os
import socket
import time
from typing import Any, Callable, Sequence

import ray
from ray import cloudpickle
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from rlinf_embodied.omp import omp_wait_env
from rlinf_embodied.runtime import device as dev
from rlinf_embodied.runtime.calls import CallHandle, Outcome, RemoteError, WorkerDiedError
from rlinf_embodied.runtime.cluster import Cluster, raylet_gone
from rlinf_embodied.runtime.device_lock import DeviceLock
from rlinf_embodied.runtime.inflight import flush_puts, release_prefetched, take_recent_puts
from rlinf_embodied.runtime.placement import PlacementPlan, parse_device_ids

SIDE_CONCURRENCY = 8
"""Threads for calls made with ``group.on(concurrent=True)``; they run beside the ordered
default lane (one thread), e.g. to query a worker while a long method runs."""


@dataclasses.dataclass(frozen=True)
class WorkerContext:
    """What a worker knows about its place (set before the subclass ``__init__`` runs)."""

    group: str
    rank: int
    world_size: int
    devices: tuple[dev.Device, ...]
    context_switch: bool
    torch_threads: int
    offload: bool = True


class Worker:
    """Base class of a role. Subclass it; ``__init__`` takes your own arguments only.

    ``rank``, ``world_size``, ``devices`` and ``torch_device`` are available inside
    ``__init__`` already. Override :meth:`onload` / :meth:`offload` to move state onto / off the
    device when the group context-switches with other groups on its devices.
    """

    _ctx: WorkerContext
    _holding_lock = False
    _loaded = False
    _switch_s = 0.0
    _lock_service: DeviceLock | None = None

    @property
    def rank(self) -> int:
        return self._ctx.rank

    @property
    def world_size(self) -> int:
        return self._ctx.world_size

    @property
    def group_name(self) -> str:
        return self._ctx.group

    @property
    def name(self) -> str:
        """``"<group>[<rank>]"``, the worker's name in lock traces and errors."""
        return f"{self._ctx.group}[{self._ctx.rank}]"

    @property
    def devices(self) -> tuple[dev.Device, ...]:
        return self._ctx.devices

    @property
    def context_switch(self) -> bool:
        """Whether this worker takes turns on its devices with other groups."""
        return self._ctx.context_switch

    @property
    def torch_device(self) -> str:
        """torch device string of the worker's first device (``"cuda:0"`` or ``"cpu"``)."""
        return dev.torch_device(self._ctx.devices)

    @property
    def offloads(self) -> bool:
        """Whether a context switch moves this worker's state off its devices (placement
        ``offload``, default true); false keeps it resident and only takes turns."""
        return self._ctx.context_switch and self._ctx.offload

    def onload(self) -> None:
        """Move state (weights, optimizer, caches) onto the device. Default: nothing."""

    def offload(self) -> None:
        """Move state off the device so another group can use it. Default: nothing."""

    @contextlib.contextmanager
    def device_lock(
        self, consumes: Sequence[str] = (), timeout: float | None = None, share: str | None = None
    ):
        """Hold this worker's devices: acquire, ``onload()``, run the block, ``offload()``, release.

        The release reports the channels this process put into inside the block, so waiters
        that consume them go next (paper section 3.3). When the group does not context-switch
        (its devices are its own), no lock is taken: the first use calls ``onload()`` once and
        the state stays on the device. With placement ``offload: false`` the lock is taken but
        the state stays on the device too (``onload()`` once, no ``offload()``): the planner
        chooses that when every group fits in device memory at once. Nested uses are
        pass-through.

        Args:
            consumes: Names of the channels the block reads.
            timeout: Seconds to wait for the devices; None waits forever.
            share: Sharing party (see :meth:`DeviceLock.acquire`): workers of different groups
                that must run together on the same devices (env and rollout during a rollout)
                pass the same name and hold the devices jointly.

        Raises:
            TimeoutError: If the devices stayed busy for ``timeout`` seconds.
        """
        if self._holding_lock:
            yield
            return
        if not self._ctx.context_switch:
            if not self._loaded:
                self.onload()
                self._loaded = True
            yield
            return
        if self._lock_service is None:
            self._lock_service = DeviceLock.connect()
        ids = [d.global_id for d in self._ctx.devices]
        t0 = time.perf_counter()
        self._lock_service.acquire(self.name, ids, consumes, timeout, share)
        take_recent_puts()  # only puts made while holding the devices count
        self._holding_lock = True
        t1 = None
        try:
            if self.offloads or not self._loaded:
                self.onload()
                self._loaded = True
            self._switch_s += time.perf_counter() - t0
            try:
                yield
            finally:
                t1 = time.perf_counter()
                if self.offloads:
                    self.offload()
                    self._loaded = False
        finally:
            self._holding_lock = False
            flush_puts()  # the consumer that gets the devices next finds the data in place
            self._lock_service.release(self.name, ids, take_recent_puts())
            if t1 is not None:
                self._switch_s += time.perf_counter() - t1

    def context_switch_seconds(self) -> float:
        """Seconds spent acquiring, onloading, offloading and releasing devices since the last
        call (including any wait while another worker held them); resets the counter."""
        s, self._switch_s = self._switch_s, 0.0
        return s

    # ---- runtime internals, called through WorkerGroup ---------------------------------------

    def _rt_ping(self) -> int:
        return os.getpid()

    def _rt_free_port(self) -> tuple[str, int]:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("", 0))
            return ray.util.get_node_ip_address(), sock.getsockname()[1]

    def _rt_init_process_group(self, addr: str, port: int, backend: str, timeout_s: float) -> None:
        import torch.distributed as dist

        dev.bind_torch_device(self._ctx.devices)
        dist.init_process_group(
            backend,
            init_method=f"tcp://{addr}:{port}",
            rank=self.rank,
            world_size=self.world_size,
            timeout=datetime.timedelta(seconds=timeout_s),
        )


class _WorkerHost:
    """The Ray actor behind one rank: sets up the process, then runs the role's methods."""

    def __init__(self, ctx: WorkerContext, cls_blob: bytes, args: tuple, kwargs: dict) -> None:
        os.environ.update(dev.visibility_env(ctx.devices))
        dev.set_cpu_threads(ctx.torch_threads)  # before the role's module can import torch
        dev.set_process_devices(ctx.devices)
        self._instance = None
        self._init_failure = None
        start = time.perf_counter()
        try:
            cls = cloudpickle.loads(cls_blob)
            dev.set_cpu_threads(ctx.torch_threads)  # again, in case loading imported torch
            instance = cls.__new__(cls)
            instance._ctx = ctx
            instance.__init__(*args, **kwargs)
            self._instance = instance
        except Exception as exc:  # reported by the group's first call, naming __init__
            self._init_failure = Outcome.failure(exc, time.perf_counter() - start, "__init__")

    def call(self, method: str, /, *args, **kwargs) -> Outcome:
        if self._init_failure is not None:
            return self._init_failure
        start = time.perf_counter()
        try:
            value = getattr(self._instance, method)(*args, **kwargs)
            flush_puts()  # a method's puts are in their channels when it returns
        except Exception as exc:
            return Outcome.failure(exc, time.perf_counter() - start)
        finally:
            release_prefetched()  # no read-ahead outlives the method that made it
        return Outcome(value, time.perf_counter() - start)


_HostActor = ray.remote(concurrency_groups={"side": SIDE_CONCURRENCY})(_WorkerHost)


class PerRank:
    """Wrap an argument to give each called rank its own value (one per rank, in call order)."""

    def __init__(self, values: Sequence[Any]) -> None:
        self.values = list(values)


class _Selection:
    """A set of ranks (and a lane) to call methods on: ``group.on([0, 2]).method(...)``."""

    def __init__(self, group: "WorkerGroup", ranks: list[int], concurrent: bool) -> None:
        self._group, self._ranks, self._concurrent = group, ranks, concurrent

    def __getattr__(self, method: str) -> Callable[..., CallHandle]:
        if method.startswith("__"):
            raise AttributeError(method)
        self._group._check_method(method)

        def invoke(*args, **kwargs) -> CallHandle:
            return self._group._dispatch(method, args, kwargs, self._ranks, self._concurrent)

        return invoke


class WorkerGroup:
    """One Ray actor per rank of a role class, pinned to its node and device(s).

    Ranks are laid out device by device: with devices [d0, d1] and 2 processes per device,
    ranks 0, 1 run on d0 and ranks 2, 3 on d1.

    Args:
        cluster: The cluster whose global device ids ``devices`` refers to.
        worker_cls: A subclass of :class:`Worker`.
        name: Group name (in errors, traces and ``describe()``).
        devices: ``"all"``, ``"0-3"``, ``"0,2"`` or a list of global device ids.
        procs_per_device: Worker processes per device (>= 1).
        init_args: Positional arguments of ``worker_cls.__init__``.
        init_kwargs: Keyword arguments of ``worker_cls.__init__``.
        context_switch: Make ``Worker.device_lock()`` take the shared device lock (set it when
            other groups share these devices; :meth:`from_plan` does).
        offload: With ``context_switch``, call ``offload()`` / ``onload()`` at every switch
            (default); False keeps the state on the device and only takes turns.
        torch_threads: CPU threads per worker process; None divides the node's CPUs among this
            group's ranks on that node (groups sharing devices take turns, so they do not
            oversubscribe).
        startup_timeout: Seconds to wait for every rank's ``__init__``.

    Raises:
        TypeError: If ``worker_cls`` is not a Worker subclass.
        ValueError: If ``devices`` names ids outside the cluster.
        RemoteError: If a rank's ``__init__`` raised.
    """

    def __init__(
        self,
        cluster: Cluster,
        worker_cls: type[Worker],
        name: str,
        devices: str | Sequence[int] = "all",
        procs_per_device: int = 1,
        *,
        init_args: tuple = (),
        init_kwargs: dict | None = None,
        context_switch: bool = False,
        offload: bool = True,
        torch_threads: int | None = None,
        startup_timeout: float = 300.0,
    ) -> None:
        if not (isinstance(worker_cls, type) and issubclass(worker_cls, Worker)):
            raise TypeError(
                f"WorkerGroup {name!r} needs a subclass of rlinf_embodied.runtime.Worker "
                f"(got {worker_cls!r}); declare it as `class MyRole(Worker): ...`."
            )
        if procs_per_device < 1:
            raise ValueError(f"Set procs_per_device to at least 1 (got {procs_per_device}).")
        self.name = name
        self.worker_cls = worker_cls
        ids = parse_device_ids(devices, cluster.num_devices, where=f"WorkerGroup {name!r} devices")
        self.rank_devices: list[tuple[dev.Device, ...]] = [
            (cluster.device(i),) for i in ids for _ in range(procs_per_device)
        ]
        self._context_switch = context_switch
        if context_switch:
            DeviceLock.connect()  # created here so the driver owns the service
        blob = cloudpickle.dumps(worker_cls)
        self._hosts = [
            self._start_rank(cluster, rank, blob, init_args, init_kwargs or {}, context_switch,
                             torch_threads, offload)
            for rank in range(self.world_size)
        ]
        try:
            self.on()._rt_ping().wait(startup_timeout)
        except BaseException:
            self.shutdown()
            raise

    @classmethod
    def from_plan(
        cls, cluster: Cluster, plan: PlacementPlan, name: str, worker_cls: type[Worker], **kwargs
    ) -> "WorkerGroup":
        """Launch group ``name`` where ``plan`` puts it, context-switching if it shares devices.

        Raises:
            PlacementError: If the plan is invalid for this cluster or has no group ``name``.
        """
        plan.validate(cluster.num_devices)
        spec = plan.group(name)
        return cls(
            cluster,
            worker_cls,
            name,
            spec.devices,
            spec.procs_per_device,
            context_switch=plan.shares_devices(name, cluster.num_devices),
            offload=plan.offload,
            **kwargs,
        )

    def _start_rank(self, cluster, rank, blob, args, kwargs, context_switch, torch_threads, offload=True):
        devices = self.rank_devices[rank]
        node_id = devices[0].node_id
        if torch_threads is None:
            same_node = sum(d[0].node_id == node_id for d in self.rank_devices)
            torch_threads = max(1, cluster.node_cpus(node_id) // same_node)
        ctx = WorkerContext(self.name, rank, self.world_size, devices, context_switch, torch_threads, offload)
        # set at process start: libgomp reads its wait policy when torch loads it
        env = {**omp_wait_env(), **dev.visibility_env(devices)}
        return _HostActor.options(
            num_cpus=0,  # devices, not Ray's CPU count, decide placement
            scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False),
            runtime_env={"env_vars": env},
        ).remote(ctx, blob, args, kwargs)

    @property
    def world_size(self) -> int:
        return len(self.rank_devices)

    def on(self, ranks: Sequence[int] | None = None, concurrent: bool = False) -> _Selection:
        """Select ranks (default all) and lane for the next call: ``group.on([0]).method()``.

        Args:
            ranks: Ranks to call, in the order results are returned.
            concurrent: Run in the side lane (``SIDE_CONCURRENCY`` threads) instead of the
                ordered default lane, so the call can overlap a running method.

        Raises:
            ValueError: If a rank is outside 0..world_size-1.
        """
        chosen = list(range(self.world_size)) if ranks is None else list(ranks)
        bad = [r for r in chosen if not 0 <= r < self.world_size]
        if bad:
            raise ValueError(
                f"WorkerGroup {self.name!r} has ranks 0-{self.world_size - 1}; got {bad}."
            )
        return _Selection(self, chosen, concurrent)

    def __getattr__(self, method: str) -> Callable[..., CallHandle]:
        if method.startswith("_"):
            raise AttributeError(method)
        return getattr(self.on(), method)

    def _check_method(self, method: str) -> None:
        if not callable(getattr(self.worker_cls, method, None)):
            raise AttributeError(
                f"WorkerGroup {self.name!r} ({self.worker_cls.__name__}) has no method "
                f"{method!r}; define it on {self.worker_cls.__name__}."
            )

    def _dispatch(self, method, args, kwargs, ranks, concurrent) -> CallHandle:
        per_rank = any(isinstance(a, PerRank) for a in (*args, *kwargs.values()))
        refs = []
        for i, rank in enumerate(ranks):
            call = self._hosts[rank].call
            if concurrent:
                call = call.options(concurrency_group="side")
            if per_rank:
                rank_args = tuple(_pick(a, i, len(ranks), method) for a in args)
                rank_kwargs = {k: _pick(v, i, len(ranks), method) for k, v in kwargs.items()}
                refs.append(call.remote(method, *rank_args, **rank_kwargs))
            else:
                refs.append(call.remote(method, *args, **kwargs))
        return CallHandle(self.name, method, ranks, refs)

    def init_process_group(self, timeout_s: float = 300.0) -> str:
        """Join all ranks in a ``torch.distributed`` default process group.

        The rendezvous uses a free TCP port on rank 0's node. Backend: nccl when every rank
        owns a GPU, else gloo.

        Returns:
            The backend used.

        Raises:
            RemoteError: If a rank failed to join (e.g. timeout, port taken).
        """
        addr, port = self.on([0])._rt_free_port().wait(timeout_s)[0]
        backend = dev.collective_backend([d for devs in self.rank_devices for d in devs])
        self.on()._rt_init_process_group(addr, port, backend, timeout_s).wait(timeout_s + 30)
        return backend

    def lost_ranks(self, timeout: float = 30.0) -> list[int]:
        """Ranks whose process is gone: its node's raylet refuses connections or Ray reports
        the node dead, its actor died, or it does not answer a ping (on the side lane, so a
        busy rank answers) within ``timeout`` seconds."""
        nodes = {n["NodeID"]: n for n in ray.nodes()}
        gone_nodes = {nid for nid, n in nodes.items() if not n.get("Alive") or raylet_gone(n)}
        lost = [r for r, devs in enumerate(self.rank_devices)
                if devs[0].node_id in gone_nodes or devs[0].node_id not in nodes]
        pings = {r: self.on([r], concurrent=True)._rt_ping()
                 for r in range(self.world_size) if r not in lost}
        deadline = time.monotonic() + timeout
        for r, handle in pings.items():
            try:
                handle.wait(max(0.0, deadline - time.monotonic()))
            except (WorkerDiedError, RemoteError, TimeoutError):
                lost.append(r)
        return sorted(lost)

    def shutdown(self) -> None:
        """Kill every rank's actor (idempotent); a context-switching group's device locks are
        released for it (a killed rank may have held them)."""
        for host in self._hosts:
            ray.kill(host, no_restart=True)
        if self._hosts and self._context_switch:
            try:
                DeviceLock.connect().evict([f"{self.name}[{r}]" for r in range(self.world_size)])
            except Exception:  # noqa: BLE001 - Ray going down: nothing is waiting any more
                pass
        self._hosts = []

    def __repr__(self) -> str:
        ids = sorted({d.global_id for devs in self.rank_devices for d in devs})
        return f"WorkerGroup({self.name!r}, {self.worker_cls.__name__}, ranks={self.world_size}, devices={ids})"


def _pick(value: Any, index: int, count: int, method: str) -> Any:
    if not isinstance(value, PerRank):
        return value
    if len(value.values) != count:
        raise ValueError(
            f"PerRank argument of {method}() has {len(value.values)} values but the call targets "
            f"{count} ranks; pass one value per called rank."
        )
    return value.values[index]
