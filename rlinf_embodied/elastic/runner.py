"""The embodied runner with elastic rollout: shards on a pool of reserved and preemptible
workers instead of the placed env + rollout groups (which still run evaluations).

Trajectories of finished shards come back to the driver (on the reserved node) and go to the
actor ranks in shard order, so a result survives the loss of the node that produced it and the
batch is the same whoever ran which shard.
"""

from __future__ import annotations

import dataclasses
import time
import uuid
from pathlib import Path
from typing import Dict, List, Optional

from rlinf_embodied.checkpoint import atomic_write_json
from rlinf_embodied.config import JobConfig
from rlinf_embodied.runners.embodied import EmbodiedRunner
from rlinf_embodied.runners.setup import Groups
from rlinf_embodied.runtime import PerRank
from rlinf_embodied.workers.actor_worker import ActorWorker
from rlinf_embodied.workers.common import cat_env_axis

__all__ = ["ElasticActorWorker", "ElasticEmbodiedRunner", "ElasticGroups", "load_records", "loss_note"]


class ElasticActorWorker(ActorWorker):
    """An actor rank that receives its shards' trajectories as call arguments."""

    def train_parts(self, iteration: int, parts: List[dict]) -> Dict[str, float]:
        """One policy update on ``parts`` (this rank's shard trajectories, in shard order)."""
        with self.device_lock():
            lr = self.optimizer.param_groups[0]["lr"]  # the rate this update trained at
            metrics = self._update(cat_env_axis(parts), iteration)
            self.scheduler.step()
            self.version += 1
        metrics["train/lr"] = lr
        return metrics


@dataclasses.dataclass
class ElasticGroups(Groups):
    """:class:`~rlinf_embodied.runners.setup.Groups` plus the elastic pool (stopped first) and
    its weight store."""

    pool: object = None
    store: object = None

    def shutdown(self, keep_cluster: bool = False, close_timeout: float = 60.0) -> None:
        if self.pool is not None:
            self.pool.shutdown()
        if self.store is not None:
            import ray

            ray.kill(self.store, no_restart=True)
            self.store = None
        super().shutdown(keep_cluster, close_timeout)


class ElasticEmbodiedRunner(EmbodiedRunner):
    """:class:`~rlinf_embodied.runners.embodied.EmbodiedRunner` with ``cfg.elastic`` rollout.

    A lost elastic worker (or preemptible node) costs only its shard's re-run; a lost rank of
    the placed groups restarts them, pool included, from the newest checkpoint
    (``trainer.max_restarts``).

    Args:
        cfg: the job config (``cfg.elastic.enabled`` need not be set: this runner is elastic).
        run_dir: the run directory (``elastic/iter_<i>.json`` records go there).
        resume: resume from the latest checkpoint.
        node_provider: kills/restores nodes for ``elastic.preemption.target: node``.
        **kwargs: ``signals``, ``checkpoint`` as for the embodied runner.
    """

    actor_cls = ElasticActorWorker

    def __init__(self, cfg: JobConfig, run_dir: Path, resume: bool = False, node_provider=None,
                 **kwargs):
        self.node_provider = node_provider
        super().__init__(cfg, run_dir, resume, **kwargs)

    def _launch(self, ckpt, cluster=None, plan=None) -> ElasticGroups:
        """The placed groups, then the weight store and the pool (its workers joined)."""
        from rlinf_embodied.elastic.pool import ElasticRolloutPool
        from rlinf_embodied.elastic.weights import ElasticWeightSync, weight_store

        g = super()._launch(ckpt, cluster, plan)
        eg = ElasticGroups(**{f.name: getattr(g, f.name) for f in dataclasses.fields(g)})
        try:
            name = f"elastic-weights:{self.run_dir.name}:{uuid.uuid4().hex[:8]}"
            eg.store = weight_store(name, create=True)
            spec = g.env.on([0]).space_spec().wait()[0]
            eg.pool = ElasticRolloutPool(g.cfg, spec, name, g.actor.world_size, self.node_provider)
            eg.sync = ElasticWeightSync(g.actor, g.rollout, eg.store)
            eg.pool.start()
        except BaseException:
            eg.shutdown(keep_cluster=cluster is not None)
            raise
        return eg

    def _rollout_and_train(self, it: int, m: dict):
        """Rollout through the pool, then train each actor rank on its shards."""
        g = self.g
        t0 = time.perf_counter()
        res = g.pool.collect(it, g.sync.version)
        m["time/rollout_s"] = time.perf_counter() - t0
        m["time/env_step_s"] = max(s["env_time_s"] for s in res.stats)
        m.update(res.metrics)
        note = loss_note(it, res.record["events"], res.metrics)
        if note:
            print(note, flush=True)
        if self.cfg.elastic.records:
            atomic_write_json(self.run_dir / "elastic" / f"iter_{it:06d}.json", res.record)
        t0 = time.perf_counter()
        tm = g.actor.train_parts(it, PerRank(res.parts)).wait()
        m["time/train_s"] = time.perf_counter() - t0
        return res.stats, tm


def loss_note(it: int, events: List[dict], metrics: Dict[str, float]) -> Optional[str]:
    """The console line of an iteration that lost elastic workers (None if none was lost):
    which, how many shards ran again, what serves now."""
    lost = [e for e in events if e["event"] == "lost"]
    if not lost:
        return None
    nodes = sorted({e["node"][:8] for e in events if e["event"] == "node_lost"})
    shards = sum(e["shard"] is not None for e in lost)
    promoted = sum(e["event"] == "promote" for e in events)
    return (f"elastic: iteration {it + 1} lost {len(lost)} worker(s) "
            f"({', '.join(e['worker'] for e in lost)})"
            + (f" with node(s) {', '.join(nodes)}" if nodes else "")
            + f"; {shards} shard(s) ran again on the others"
            + (f", {promoted} spare(s) took over" if promoted else "")
            + f"; {metrics['elastic/workers_reserved']:.0f} reserved and "
            f"{metrics['elastic/workers_preemptible']:.0f} preemptible worker(s) serve now")


def load_records(run_dir: Path) -> List[dict]:
    """Every ``elastic/iter_<i>.json`` record of a run, in iteration order."""
    import json

    return [json.loads(p.read_text()) for p in sorted(Path(run_dir, "elastic").glob("iter_*.json"))]

