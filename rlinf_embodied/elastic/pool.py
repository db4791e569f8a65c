"""ElasticRolloutPool: reserved and preemptible rollout workers that join and leave at any time.

Per iteration the pool runs every shard exactly once as far as the results go: a shard is in
flight on at most one worker; a worker that dies (preempted, its node lost, crashed) has its
shard put back at the head of the queue, and the first completed result of each shard id is the
one kept. Replacement workers start in the background (``elastic.preemption.restart``) and take
work as soon as they are up, pulling the current weights themselves
(:class:`~rlinf_embodied.elastic.weights.WeightStore`). Who takes the next shard is decided by
:class:`~rlinf_embodied.elastic.offload.OffloadPlanner` from measured throughput.

Resumable shards (``collect(..., initial_state=...)``): each call gets the shard's state and may
return ``{"partial": new_state}`` after a piece of the work; the same worker is handed the next
piece at once, and a worker lost mid-piece has its shard re-queued with the last reported state,
so at most one piece of work is lost (the reasoning workflow's token-level migration).
"""

from __future__ import annotations

import collections
import concurrent.futures as cf
import dataclasses
import itertools
import time
import warnings
from typing import Any, Dict, List, Optional, Protocol, Tuple

import ray

from rlinf_embodied.config import ConfigError, JobConfig
from rlinf_embodied.elastic.offload import PREEMPTIBLE, RESERVED, OffloadPlanner
from rlinf_embodied.elastic.preemption import PreemptionSimulator
from rlinf_embodied.elastic.worker import ElasticRolloutWorker
from rlinf_embodied.runtime import RemoteError, WorkerDiedError, WorkerGroup
from rlinf_embodied.runtime.cluster import raylet_gone
from rlinf_embodied.runtime.device import CPU, GPU, RAY_GPU_RESOURCE, Device

__all__ = ["ElasticRolloutPool", "NodeProvider", "RolloutResult", "UnplacedWorkersWarning"]


class UnplacedWorkersWarning(UserWarning):
    """Configured preemptible workers have no node to run on (none advertises the resource)."""

IDLE_POLL_S = 0.05
"""Seconds the dispatch loop waits for a call to finish when nothing changed (a finished or
failed call wakes it at once; this bounds how late a timed kill or a joined worker is seen)."""
NODE_PROBE_S = 0.25
"""Seconds between checks of the members' nodes (a refused raylet port: the node is gone)."""


class NodeProvider(Protocol):
    """What the preemption simulator needs to preempt whole nodes (``target: node``)."""

    def kill_node(self, node_id: str) -> None:
        """Kill the node ``node_id`` and every process on it."""

    def restore_node(self) -> None:
        """Bring one preemptible node (back) up; may block while it starts."""


@dataclasses.dataclass
class _Member:
    name: str
    kind: str
    group: WorkerGroup
    node_id: str
    spawned_at: float
    ready_at: float
    first_done_at: Optional[float] = None
    shard: Optional[int] = None
    handle: Any = None
    started: float = 0.0
    kill_at: Optional[float] = None
    doomed: bool = False  # killed by the simulator (its restart policy applies)
    standby: bool = False  # a spare: takes no shard until it replaces a lost preemptible worker


@dataclasses.dataclass
class RolloutResult:
    """One iteration's rollout as the runner consumes it."""

    parts: List[List[dict]]
    """Per actor rank, the trajectories of its shards in shard order."""
    stats: List[dict]
    """Per shard, episode sums and timings (the env workers' ``rollout`` return format)."""
    metrics: Dict[str, float]
    """``elastic/...`` metrics of the iteration."""
    record: dict
    """What ``elastic/iter_<i>.json`` holds: episodes, shard placement and attempts, events."""


class _OneDevice:
    """The cluster view a single-rank WorkerGroup needs: one device on a chosen node."""

    def __init__(self, device: Device) -> None:
        self._device = device
        self.num_devices = 1

    def device(self, _i: int) -> Device:
        return self._device

    def node_cpus(self, _node_id: str) -> int:
        return 1


class ElasticRolloutPool:
    """The elastic rollout workers of one run.

    Args:
        cfg: the job config (``cfg.elastic`` configures the pool).
        spec: the env's SpaceSpec as a dict.
        store_name: name of the run's WeightStore actor.
        actor_ranks: ranks of the actor group (each trains a contiguous block of shards).
        node_provider: kills and restores nodes for ``elastic.preemption.target: node``.

    Raises:
        ConfigError: if the shard size does not divide the envs, or node preemption has no
            provider.
    """

    def __init__(self, cfg: JobConfig, spec: dict, store_name: str, actor_ranks: int = 1,
                 node_provider: Optional[NodeProvider] = None, *, elastic=None,
                 num_shards: Optional[int] = None, worker_cls=None,
                 init_args: Optional[tuple] = None) -> None:
        e = elastic if elastic is not None else cfg.elastic
        shards = num_shards if num_shards is not None else e.num_shards_for(cfg.env.num_envs, actor_ranks)
        if shards is None:
            raise ConfigError(
                f"Set elastic.shard_envs to a divisor of env.num_envs / actor ranks = "
                f"{cfg.env.num_envs} / {actor_ranks} (got {e.shard_envs}).")
        if e.preemption.mode != "off" and e.preemption.target == "node" and node_provider is None:
            raise ConfigError("elastic.preemption.target=node needs a node provider (e.g. "
                              "rlinf_embodied.elastic.LocalMultiNodeCluster); use target=worker.")
        self.cfg, self.e, self.spec, self.store_name = cfg, e, spec, store_name
        self.num_shards = shards
        self.shard_envs = cfg.env.num_envs // shards if num_shards is None else 0
        self.worker_cls = worker_cls or ElasticRolloutWorker
        self.init_args = init_args if init_args is not None else (cfg, spec, store_name, self.shard_envs)
        self.actor_ranks = actor_ranks
        self.provider = node_provider
        self.planner = OffloadPlanner(e.throughput_ema)
        self.sim = PreemptionSimulator(e.preemption, shards)
        self.members: List[_Member] = []
        self._joining: List[Tuple[str, str, str, float, cf.Future, bool]] = []  # name, kind, node, t, future, standby
        self._wanted = collections.Counter({RESERVED: e.reserved_workers, PREEMPTIBLE: e.preemptible_workers})
        self._deferred = collections.Counter()
        self._standby_wanted, self._refill = e.standby_workers, 0
        self._deferred_nodes = 0
        self._dead_nodes: set = set()
        self._restore_due = 0  # nodes to bring back (target: node); Ray starts them in the main thread
        self._pool = cf.ThreadPoolExecutor(max_workers=4, thread_name_prefix="elastic-join")
        self._serial = itertools.count()
        self._join_failures = 0  # consecutive; past elastic.max_attempts it is a bug, not bad luck
        self._driver_node = ray.get_runtime_context().get_node_id()
        self._nodes: List[dict] = []
        self._node_info: Dict[str, dict] = {}
        self._nodes_at = self._probed_at = -float("inf")
        self.events: List[dict] = []
        self._t0 = time.monotonic()

    # -- membership -------------------------------------------------------------------------
    def start(self) -> None:
        """Start the configured workers and wait until the reserved ones (and every preemptible
        one that has a node) are up."""
        self.wait_for_joins(standby=True)
        if not any(m.kind == RESERVED for m in self.members):
            raise RuntimeError(f"no reserved elastic worker started within "
                               f"elastic.join_timeout_s={self.e.join_timeout_s}; see the worker logs "
                               f"under /tmp/ray/session_latest/logs.")
        self._warn_unplaced()

    def _warn_unplaced(self) -> None:
        """Warn (and record an ``unplaced`` event) when preemptible workers are still waiting
        for a node: with ``elastic.preemptible_resource`` set, only nodes advertising that Ray
        resource take them, and a cluster without such a node would otherwise run
        reserved-only without a word."""
        missing = self._wanted[PREEMPTIBLE]
        if missing <= 0:
            return
        res = self.e.preemptible_resource
        self._event("unplaced", kind=PREEMPTIBLE, workers=missing, resource=res)
        placed = sum(m.kind == PREEMPTIBLE for m in self.members)
        warnings.warn(
            f"{missing} of {self.e.preemptible_workers} preemptible elastic workers have no node: "
            f"no alive Ray node advertises the resource {res!r} (start such nodes with "
            f"`ray start --resources='{{\"{res}\": 1}}'`, or set "
            f"elastic.preemptible_resource=\"\" to run them on the driver's node). The rollout "
            f"goes on with {sum(m.kind == RESERVED for m in self.members)} reserved and {placed} "
            f"preemptible workers and starts the others when such a node joins.",
            UnplacedWorkersWarning, stacklevel=3)

    def wait_for_joins(self, standby: bool = False) -> None:
        """Block until the workers being started (spares too with ``standby``) and nodes being
        restored have joined, for at most ``elastic.join_timeout_s``."""
        deadline = time.monotonic() + self.e.join_timeout_s
        self._spawn_wanted()
        self._restore_nodes()
        while any(standby or not j[5] for j in self._joining) and time.monotonic() < deadline:
            self._reap_joins()
            self._spawn_wanted()
            time.sleep(0.02)

    def _alive_nodes(self) -> List[dict]:
        """Ray's alive nodes, asked at most every :data:`NODE_PROBE_S` (a GCS round trip)."""
        now = time.monotonic()
        if now - self._nodes_at >= NODE_PROBE_S:
            self._nodes = [n for n in ray.nodes() if n.get("Alive")]
            self._node_info.update({n["NodeID"]: n for n in self._nodes})
            self._nodes_at = now
        return [n for n in self._nodes if n["NodeID"] not in self._dead_nodes]

    def _nodes_for(self, kind: str) -> List[dict]:
        alive = self._alive_nodes()
        if kind == RESERVED or not self.e.preemptible_resource:
            return [n for n in alive if n["NodeID"] == self._driver_node]
        return [n for n in alive if n["Resources"].get(self.e.preemptible_resource, 0) > 0]

    def _spawn_wanted(self) -> None:
        """Start the workers (then the spares) wanted, each on the least loaded node that may
        take it; with no such node they are retried on every tick (the node may come back)."""
        for kind, standby in ((RESERVED, False), (PREEMPTIBLE, False), (PREEMPTIBLE, True)):
            while (self._standby_wanted if standby else self._wanted[kind]) > 0:
                nodes = self._nodes_for(kind)
                if not nodes:
                    break
                load = collections.Counter(m.node_id for m in self.members)
                load.update(j[2] for j in self._joining)
                node = min(nodes, key=lambda n: (load[n["NodeID"]], n["NodeID"]))
                self._spawn(kind, node, load[node["NodeID"]], standby)
                if standby:
                    self._standby_wanted -= 1
                else:
                    self._wanted[kind] -= 1

    def _spawn(self, kind: str, node: dict, index_on_node: int, standby: bool = False) -> None:
        gpus = int(node["Resources"].get(RAY_GPU_RESOURCE, 0))
        device = Device(-1, node["NodeID"], node["NodeManagerAddress"], GPU if gpus else CPU,
                        index_on_node % gpus if gpus else 0)
        name = f"elastic-{'s' if standby else kind[0]}{next(self._serial)}"
        args = (*self.init_args, kind)
        fut = self._pool.submit(
            WorkerGroup, _OneDevice(device), self.worker_cls, name, [0], init_args=args,
            torch_threads=self.e.torch_threads, startup_timeout=self.e.join_timeout_s)
        self._joining.append((name, kind, node["NodeID"], time.monotonic(), fut, standby))

    def _reap_joins(self) -> bool:
        changed = False
        for item in [j for j in self._joining if j[4].done()]:
            self._joining.remove(item)
            name, kind, node, t_spawn, fut, standby = item
            changed = True
            try:
                group = fut.result()
            except Exception as exc:  # noqa: BLE001 - its node died while it started: retry
                error = f"{type(exc).__name__}: {exc}"
                self._event("join_failed", worker=name, error=error[:2000])
                self._join_failures += 1
                if self._join_failures > self.e.max_attempts:
                    raise RuntimeError(f"{self._join_failures} elastic workers in a row failed to "
                                       f"start; the last one, {name}:\n{error}") from exc
                self._respawn(kind, standby)
                continue
            self._join_failures = 0
            if node in self._dead_nodes:
                group.shutdown()
                self._respawn(kind, standby)
                continue
            self.members.append(_Member(name, kind, group, node, t_spawn, time.monotonic(),
                                        standby=standby))
            self._event("join", worker=name, kind=kind, start_s=time.monotonic() - t_spawn,
                        **({"standby": True} if standby else {}))
        return changed

    def _preempt(self, m: _Member, queue: collections.deque, done: dict) -> None:
        """The simulator's kill: the worker process, or its whole node. The pool knows its
        victims are dead, so their in-flight shards go back to the queue at once (a real
        preemption is found by :meth:`_check_nodes` or by the call reporting the death)."""
        m.kill_at = None
        self._event("preempt", worker=m.name, shard=m.shard, target=self.e.preemption.target)
        victims = [m]
        if self.e.preemption.target == "worker":
            m.group.shutdown()
        else:
            self._dead_nodes.add(m.node_id)
            victims = [o for o in self.members if o.node_id == m.node_id]
            self.provider.kill_node(m.node_id)
        for v in victims:
            v.doomed = True
            self._lost(v, queue, done)
        if self.e.preemption.target == "worker":
            return
        restart = self.e.preemption.restart
        if restart == "immediate":
            self._restore_due += 1
        elif restart == "next_iteration":
            self._deferred_nodes += 1

    def _check_nodes(self, queue: collections.deque, done: dict, now: float) -> bool:
        """Every :data:`NODE_PROBE_S`, ask each node hosting members whether its raylet still
        listens (:func:`~rlinf_embodied.runtime.cluster.raylet_gone`): a refused connection
        means the node is gone, seconds before Ray's own health checks say so, and its
        members' shards are re-queued at once. Returns whether a member was lost."""
        if now - self._probed_at < NODE_PROBE_S:
            return False
        self._probed_at = now
        lost = False
        for node_id in {m.node_id for m in self.members} - {self._driver_node}:
            info = self._node_info.get(node_id)
            if info is None or not raylet_gone(info):
                continue
            self._dead_nodes.add(node_id)
            self._event("node_lost", node=node_id, at=time.time())  # wall clock: vs the kill
            for m in [o for o in self.members if o.node_id == node_id]:
                self._lost(m, queue, done)
            lost = True
        return lost

    def _restore_nodes(self) -> None:
        """Bring killed nodes back (blocks the dispatch loop while the raylet starts; running
        shards go on)."""
        while self._restore_due > 0:
            self._restore_due -= 1
            try:
                node = self.provider.restore_node()
                self._event("node_restored", node=node)
            except Exception as exc:  # noqa: BLE001 - the run goes on reserved-only
                self._event("node_restore_failed", error=f"{type(exc).__name__}: {exc}")

    def _respawn(self, kind: str, standby: bool) -> None:
        if standby:
            self._standby_wanted += 1
        else:
            self._wanted[kind] += 1

    def _lost(self, m: _Member, queue: collections.deque, done: dict) -> None:
        """Take ``m`` out: its shard back to the head of the queue, a spare in its place (its
        own replacement starts when the iteration's rollout ends) or a replacement per the
        restart policy."""
        if m not in self.members:
            return
        self.members.remove(m)
        if m.shard is not None and m.shard not in done:
            queue.appendleft(m.shard)
        self._event("lost", worker=m.name, kind=m.kind, shard=m.shard,
                    **({"standby": True} if m.standby else {}))
        restart = self.e.preemption.restart if m.doomed else "immediate"
        spare = None if m.standby or m.kind == RESERVED else next(
            (o for o in self.members if o.standby and o.node_id not in self._dead_nodes), None)
        if spare is not None:
            spare.standby = False  # joined before it was needed: serves at once
            self._event("promote", worker=spare.name, replaces=m.name)
        if m.standby or spare is not None:
            self._refill += restart != "never"
        elif m.kind == RESERVED or restart == "immediate":
            self._wanted[m.kind] += 1
        elif restart == "next_iteration":
            self._deferred[m.kind] += 1
        try:
            m.group.shutdown()
        except Exception:  # noqa: BLE001 - already gone
            pass

    def clock(self) -> float:
        """Seconds on the events' clock (``t`` of :attr:`events`: since the pool was made)."""
        return time.monotonic() - self._t0

    def _event(self, what: str, **kw) -> None:
        self.events.append({"event": what, "t": round(self.clock(), 4), **kw})

    # -- one iteration ----------------------------------------------------------------------
    def collect(self, iteration: int, version: int,
                initial_state: Optional[Dict[int, Any]] = None) -> RolloutResult:
        """Run every shard of ``iteration`` with weights ``version`` on whoever is alive.

        Args:
            iteration: the iteration (seeds the shards).
            version: weights version the workers must hold.
            initial_state: resumable shards: shard id -> its starting state, passed as the
                call's fourth argument ``run_shard(iteration, shard, version, state)``; a call
                returning ``{"partial": state}`` made progress without finishing. None: one call
                per shard, ``run_shard(iteration, shard, version)``.

        Raises:
            RuntimeError: if a shard failed ``elastic.max_attempts`` times, or no worker is
                left and none can start.
        """
        self.sim.begin_iteration(iteration)
        self._wanted.update(self._deferred)
        self._deferred.clear()
        self._restore_due += self._deferred_nodes
        self._deferred_nodes = 0
        if self.e.wait_for_joins:
            self.wait_for_joins()
        first_event = len(self.events)
        queue = collections.deque(range(self.num_shards))
        done: Dict[int, dict] = {}
        placed: Dict[int, dict] = {}
        attempts: collections.Counter = collections.Counter()
        calls: collections.Counter = collections.Counter()
        state = dict(initial_state) if initial_state is not None else None
        seconds = {RESERVED: [], PREEMPTIBLE: []}
        live = lambda: [m for m in self.members if not m.doomed and not m.standby]  # noqa: E731
        planned = self.planner.planned_share(sum(m.kind == RESERVED for m in live()),
                                             sum(m.kind == PREEMPTIBLE for m in live()), self.num_shards)
        dispatch, t_start, stalled_since = 0, time.monotonic(), None
        while len(done) < self.num_shards:
            changed = self._reap_joins()
            self._spawn_wanted()
            now = time.monotonic()
            changed |= self._check_nodes(queue, done, now)
            for m in list(self.members):
                if m.kill_at is not None and now >= m.kill_at:
                    self._preempt(m, queue, done)
                    changed = True
                if m.handle is None or m not in self.members:
                    continue
                try:
                    finished = m.handle.poll()
                except WorkerDiedError:
                    self._lost(m, queue, done)
                    changed = True
                    continue
                except RemoteError as err:
                    if attempts[m.shard] >= self.e.max_attempts:
                        raise RuntimeError(f"shard {m.shard} of iteration {iteration} failed "
                                           f"{attempts[m.shard]} times, last on worker {m.name}; "
                                           f"last error:\n{err}") from err
                    self._event("shard_error", worker=m.name, shard=m.shard, error=str(err).splitlines()[0])
                    queue.appendleft(m.shard)
                    m.shard = m.handle = None
                    changed = True
                    continue
                if finished:
                    res = m.handle.wait()[0]
                    dt = now - m.started
                    if state is not None and "partial" in res and m.shard not in done:
                        state[m.shard] = res["partial"]
                        calls[m.shard] += 1
                        changed = True
                        # the same worker goes on at once
                        m.handle = m.group.run_shard(iteration, m.shard, version, state[m.shard])
                        dispatch = self._armed(m, dispatch, now)
                        continue
                    if m.shard not in done:
                        done[m.shard] = res
                        calls[m.shard] += 1
                        placed[m.shard] = {"shard": m.shard, "worker": m.name, "kind": m.kind,
                                           "attempts": attempts[m.shard], "calls": calls[m.shard],
                                           "seconds": round(dt, 4),
                                           "t_done": round(now - self._t0, 4)}
                        seconds[m.kind].append(dt)
                    m.first_done_at = m.first_done_at or now
                    m.shard = m.handle = None
                    changed = True
            now = time.monotonic()
            idle = sorted((m for m in live() if m.handle is None), key=lambda m: self.planner.estimate(m.kind))
            for m in idle:
                if not queue:
                    break
                others = [(o.kind, -1.0 if o.handle is None else now - o.started)
                          for o in live() if o is not m]
                if not self.planner.should_take(m.kind, len(queue), others):
                    continue
                shard = queue.popleft()
                attempts[shard] += 1
                m.shard, m.started = shard, now
                extra = () if state is None else (state[shard],)
                m.handle = m.group.run_shard(iteration, shard, version, *extra)
                dispatch = self._armed(m, dispatch, now)
                changed = True
            if self._restore_due:  # after dispatching: the re-queued shards run meanwhile
                self._restore_nodes()
                changed = True
            if changed:
                stalled_since = None
            else:
                if not self.members and not self._joining:
                    stalled_since = stalled_since or now
                    if now - stalled_since > self.e.join_timeout_s:
                        raise RuntimeError("every elastic worker is gone and none could start "
                                           "for elastic.join_timeout_s; check the cluster's nodes.")
                self._idle_wait(now)
        for m in self.members:
            m.kill_at = None  # a kill armed for a shard that already finished is dropped
        self._standby_wanted += self._refill  # spares used up start now, not during the rollout
        self._refill = 0
        self._spawn_wanted()
        for kind, s in seconds.items():
            self.planner.observe(kind, s)
        return self._result(iteration, done, placed, planned, first_event, time.monotonic() - t_start)

    def _idle_wait(self, now: float) -> None:
        """Wait until a call in flight finishes (or fails), at most :data:`IDLE_POLL_S` and
        never past the next armed kill or node check: no busy polling of the workers."""
        until = min([now + IDLE_POLL_S, self._probed_at + NODE_PROBE_S]
                    + [m.kill_at for m in self.members if m.kill_at is not None])
        refs = [r for m in self.members if m.handle is not None for r in m.handle.refs]
        timeout = max(0.0, until - time.monotonic())
        if refs:
            ray.wait(refs, num_returns=1, timeout=timeout)
        else:
            time.sleep(timeout)

    def _armed(self, m: _Member, dispatch: int, now: float) -> int:
        """Count a request sent to ``m`` (preemptible ones only) and arm the simulator's kill
        if it picks this one; returns the new preemptible request count."""
        if m.kind != PREEMPTIBLE:
            return dispatch
        if self.sim.on_dispatch(dispatch):
            m.kill_at = now + self.e.preemption.kill_delay_s
        return dispatch + 1

    def _result(self, iteration, done, placed, planned, first_event, wall) -> RolloutResult:
        order = range(self.num_shards)
        per_rank = self.num_shards // self.actor_ranks
        parts = [[done[s]["traj"] for s in order[a * per_rank:(a + 1) * per_rank]]
                 for a in range(self.actor_ranks)]
        events = self.events[first_event:]
        reserved = sum(p["kind"] == RESERVED for p in placed.values())
        episodes = [ep for s in order for ep in done[s].get("episodes", [])]
        record = {"iteration": iteration, "num_shards": self.num_shards,
                  "shards": [placed[s] for s in order], "episodes": episodes, "events": events}
        metrics = {
            "elastic/preemptions": float(sum(e["event"] == "preempt" for e in events)),
            "elastic/lost_shards": float(sum(e["event"] == "lost" and e["shard"] is not None for e in events)),
            "elastic/joins": float(sum(e["event"] == "join" for e in events)),
            "elastic/reserved_share": reserved / self.num_shards,
            "elastic/planned_reserved_share": planned,
            "elastic/workers_reserved": float(sum(m.kind == RESERVED for m in self.members)),
            "elastic/workers_preemptible": float(sum(m.kind == PREEMPTIBLE and not m.standby
                                                     for m in self.members)),
            "elastic/workers_standby": float(sum(m.standby for m in self.members)),
            "elastic/rollout_wall_s": wall,
        }
        return RolloutResult(parts, [done[s]["stats"] for s in order], metrics, record)

    def first_request_latency(self) -> List[float]:
        """Seconds from spawn to the first finished shard, per worker that finished one."""
        return [m.first_done_at - m.spawned_at for m in self.members if m.first_done_at]

    def shutdown(self) -> None:
        """Stop every worker (and the ones still starting)."""
        for *_, fut, _standby in self._joining:
            try:
                fut.result(timeout=self.e.join_timeout_s).shutdown()
            except Exception:  # noqa: BLE001 - it failed to start anyway
                pass
        self._joining.clear()
        for m in self.members:
            m.group.shutdown()
        self.members.clear()
        self._pool.shutdown(wait=False, cancel_futures=True)
