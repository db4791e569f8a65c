"""Workflow graph: worker groups as nodes, channels as edges (paper section 3.4).

Nodes carry the work of one iteration (``items`` per round, ``rounds`` sequential rounds);
edges carry the data volume per item. For partitioning, strongly connected components over data
edges (the env <-> rollout interaction loop) collapse into one :class:`Stage`, and the stages are
put in topological order: every cut of that order is a valid two-way partition of the graph
(all data flows left to right), which is what the planner recurses over. Edges of kind
``weights`` (actor -> rollout weight sync) are an iteration barrier, not a data flow, and are
ignored for cycles and cuts.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["Edge", "Node", "Stage", "WorkflowGraph", "chain_graph", "embodied_graph"]


@dataclass(frozen=True)
class Node:
    """One worker group and its work per iteration.

    Attributes:
        name: Worker group name; must match a component profile.
        items: Items processed per round (envs stepped, observations forwarded, samples trained).
        rounds: Sequential rounds per iteration (T env steps for env/rollout; 1 for the actor).
        shards: Units the runtime splits evenly over the group's ranks (the job's envs, or its
            GRPO groups): its rank count, times the micro-batches in a cycle, must divide it
            (``runners.setup.check_divisibility``); None allows any split.
    """

    name: str
    items: int
    rounds: int = 1
    shards: int | None = None

    def __post_init__(self):
        if self.shards is not None and self.shards < 1:
            raise ValueError(f"Node {self.name!r} needs shards >= 1 or None (got {self.shards}).")
        if self.items < 1 or self.rounds < 1:
            raise ValueError(
                f"Node {self.name!r} needs items >= 1 and rounds >= 1 "
                f"(got {self.items} and {self.rounds})."
            )


@dataclass(frozen=True)
class Edge:
    """A channel between two worker groups.

    Attributes:
        src: Producer node name.
        dst: Consumer node name.
        bytes_per_item: Bytes sent per item of the producer per round.
        kind: ``data`` (a channel inside the iteration) or ``weights`` (a barrier between
            iterations, never a reason to collapse or a cut constraint).
        tensors: Tensors per message (each one is serialised on its own, so a message of many
            small tensors costs more than one tensor of the same bytes).
    """

    src: str
    dst: str
    bytes_per_item: float = 0.0
    kind: str = "data"
    tensors: int = 1


@dataclass(frozen=True)
class Stage:
    """A node of the collapsed graph: one worker group or a cycle of them.

    Attributes:
        members: Node names in ring order (a single name for an acyclic node).
        items: Items per round, shared by the members of a cycle.
        rounds: Rounds per iteration.
        in_bytes: Bytes per iteration entering this stage from earlier stages.
        ring_bytes: For a cycle, bytes per item passed along each ring edge, in member order
            (``ring_bytes[i]`` goes from ``members[i]`` to the next member).
        in_tensors: Tensors of the message(s) entering from earlier stages.
        ring_tensors: For a cycle, tensors per message along each ring edge (member order).
        shards: :attr:`Node.shards` of every member, in member order.
    """

    members: tuple[str, ...]
    items: int
    rounds: int
    in_bytes: float = 0.0
    ring_bytes: tuple[float, ...] = ()
    in_tensors: int = 1
    ring_tensors: tuple[int, ...] = ()
    shards: tuple[int | None, ...] = ()

    @property
    def is_cycle(self) -> bool:
        return len(self.members) > 1

    @property
    def label(self) -> str:
        return "+".join(self.members)


@dataclass(frozen=True)
class WorkflowGraph:
    """Worker groups and channels of one workflow.

    Raises:
        ValueError: for duplicate node names, edges to unknown nodes, or cycle members with
            different ``items``/``rounds`` (a cycle exchanges one item per member per round).
    """

    nodes: tuple[Node, ...]
    edges: tuple[Edge, ...] = ()

    def __post_init__(self):
        names = [n.name for n in self.nodes]
        if len(set(names)) != len(names):
            raise ValueError(f"Duplicate node names in workflow graph: {names}.")
        for e in self.edges:
            for end in (e.src, e.dst):
                if end not in names:
                    raise ValueError(f"Edge {e.src}->{e.dst}: unknown node {end!r}; nodes: {names}.")
        self.stages()  # validates cycles

    def node(self, name: str) -> Node:
        for n in self.nodes:
            if n.name == name:
                return n
        raise KeyError(f"No node {name!r}; nodes: {[n.name for n in self.nodes]}.")

    def _data_edges(self) -> list[Edge]:
        return [e for e in self.edges if e.kind == "data"]

    def _components(self) -> list[list[str]]:
        """Strongly connected components (Tarjan), members in declaration order."""
        order = {n.name: i for i, n in enumerate(self.nodes)}
        succ: dict[str, list[str]] = {n.name: [] for n in self.nodes}
        for e in self._data_edges():
            succ[e.src].append(e.dst)
        index: dict[str, int] = {}
        low: dict[str, int] = {}
        stack: list[str] = []
        on_stack: set = set()
        comps: list[list[str]] = []

        def visit(v: str) -> None:
            index[v] = low[v] = len(index)
            stack.append(v)
            on_stack.add(v)
            for w in succ[v]:
                if w not in index:
                    visit(w)
                    low[v] = min(low[v], low[w])
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                comps.append(sorted(comp, key=order.__getitem__))

        for n in self.nodes:
            if n.name not in index:
                visit(n.name)
        return comps

    def stages(self) -> tuple[Stage, ...]:
        """Collapsed graph in topological order (ties broken by declaration order)."""
        comps = self._components()
        where = {m: i for i, c in enumerate(comps) for m in c}
        preds: dict[int, set] = {i: set() for i in range(len(comps))}
        for e in self._data_edges():
            a, b = where[e.src], where[e.dst]
            if a != b:
                preds[b].add(a)
        decl = {n.name: i for i, n in enumerate(self.nodes)}
        done: list[int] = []
        while len(done) < len(comps):
            ready = [i for i in preds if i not in done and preds[i] <= set(done)]
            done.append(min(ready, key=lambda i: decl[comps[i][0]]))
        return tuple(self._stage(comps[i], where, i) for i in done)

    def _stage(self, members: Sequence[str], where: dict[str, int], idx: int) -> Stage:
        nodes = [self.node(m) for m in members]
        if len({(n.items, n.rounds) for n in nodes}) > 1:
            raise ValueError(
                f"Cycle {members} mixes items/rounds {[(n.items, n.rounds) for n in nodes]}; "
                "give every member of an interaction loop the same items and rounds."
            )
        in_bytes = sum(
            e.bytes_per_item * self.node(e.src).items * self.node(e.src).rounds
            for e in self._data_edges()
            if where[e.dst] == idx and where[e.src] != idx
        )
        in_tensors = sum(
            e.tensors for e in self._data_edges() if where[e.dst] == idx and where[e.src] != idx
        )
        ring: tuple[float, ...] = ()
        ring_tensors: tuple[int, ...] = ()
        if len(members) > 1:
            inner = {(e.src, e.dst): e for e in self._data_edges()}
            nxt = [inner.get((m, members[(i + 1) % len(members)])) for i, m in enumerate(members)]
            ring = tuple(e.bytes_per_item if e else 0.0 for e in nxt)
            ring_tensors = tuple(e.tensors if e else 1 for e in nxt)
        return Stage(tuple(members), nodes[0].items, nodes[0].rounds, in_bytes, ring,
                     max(1, in_tensors), ring_tensors, tuple(n.shards for n in nodes))


def embodied_graph(
    num_envs: int,
    rollout_steps: int,
    update_epochs: int = 1,
    num_minibatches: int = 1,
    obs_bytes: float = 0.0,
    action_bytes: float = 0.0,
    sample_bytes: float = 0.0,
    obs_tensors: int = 1,
    action_tensors: int = 1,
    sample_tensors: int = 1,
    shards: int | None = None,
) -> WorkflowGraph:
    """The embodied PPO/GRPO workflow of the paper (section 2.2, Figure 14 workloads).

    Each of the T rounds the rollout group forwards N observations and the env group steps N envs
    (a cycle); then the actor trains on ``N * T * update_epochs`` samples in
    ``update_epochs * num_minibatches`` optimizer steps of one minibatch each (the actor node's
    rounds; its items are one minibatch, so no micro-batch is ever planned larger than the
    minibatch an optimizer step sees).

    Args:
        num_envs: N, parallel environments per iteration.
        rollout_steps: T, policy queries per env per iteration.
        update_epochs: Passes of the actor over the iteration's samples.
        num_minibatches: Optimizer steps per pass (``trainer.num_minibatches``).
        obs_bytes: Bytes of one observation (env -> rollout).
        action_bytes: Bytes of one action chunk (rollout -> env).
        sample_bytes: Bytes of one env step's training sample (rollout -> actor).
        obs_tensors: Tensors in one observation message.
        action_tensors: Tensors in one action-chunk reply.
        sample_tensors: Tensors in the trajectory message.
        shards: When given (the job's ``env.num_envs / algorithm.group_size``), the env and
            actor groups only get rank counts that split it evenly, as the runtime requires
            (:attr:`Node.shards`); None plans any split (the cost model averages uneven shares).

    Returns:
        Graph with nodes ``env``, ``rollout`` (the cycle) and ``actor``. The ring is entered at
        ``env`` in the simulator; for a two-member ring the entry point does not change the
        iteration time (``T * m * max + min`` either way).
    """
    return WorkflowGraph(
        nodes=(
            Node("env", num_envs, rollout_steps, shards),
            Node("rollout", num_envs, rollout_steps),
            Node("actor", -(-num_envs * rollout_steps // max(1, num_minibatches)),
                 update_epochs * max(1, num_minibatches), shards),
        ),
        edges=(
            Edge("rollout", "env", action_bytes, tensors=action_tensors),
            Edge("env", "rollout", obs_bytes, tensors=obs_tensors),
            Edge("rollout", "actor", sample_bytes, tensors=sample_tensors),
            Edge("actor", "rollout", 0.0, kind="weights"),
        ),
    )


def chain_graph(items: dict[str, int], bytes_per_item: float = 0.0) -> WorkflowGraph:
    """A linear workflow ``a -> b -> c`` (e.g. reasoning: rollout -> inference -> actor).

    Args:
        items: Node name -> items per iteration, in flow order.
        bytes_per_item: Bytes per item on every edge.
    """
    names = list(items)
    return WorkflowGraph(
        nodes=tuple(Node(n, int(items[n])) for n in names),
        edges=tuple(Edge(a, b, bytes_per_item) for a, b in zip(names, names[1:])),
    )
