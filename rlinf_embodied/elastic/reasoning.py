"""Elastic, preemptible rollout for the reasoning workflow: token-level response migration.

The step's responses (``prompts_per_step * group_size``, ordered by (group, sample)) are split
into shards of ``elastic.shard_responses``; each shard runs on the
:class:`~rlinf_embodied.elastic.pool.ElasticRolloutPool` as a *resumable* shard: a worker
generates ``elastic.chunk_tokens`` tokens of each of the shard's unfinished responses and
reports the partial tokens back (RLBoost's token-level collection). A preempted worker loses at
most that one piece; the shard continues on another worker from prompt + generated prefix.

Exactness: every response decodes alone with a per-(response, token position) seeded sampler
(:meth:`~rlinf_embodied.reasoning.hf_backend.HFBackend.continue_response`) and pieces always
start at multiples of ``chunk_tokens``, so a continued response is bit-identical (tokens and
log-probs) to one that was never preempted, whichever worker ran which piece; training on them
then matches the run without preemptions exactly. Responses differ from the placed rollout
group's batched sampling (another sampling stream), not between elastic runs.

The finished responses go into the run's ``responses`` channel as the placed rollout group
would send them, so the reward and actor workers are the usual ones. Weights: every version is
published to a :class:`~rlinf_embodied.elastic.weights.WeightStore` and pulled by the workers.
Only the HF backend can continue a response from its prefix.
"""

from __future__ import annotations

import concurrent.futures as cf
import dataclasses
import time
from pathlib import Path
from typing import Dict, List, Optional

from rlinf_embodied.checkpoint import atomic_write_json
from rlinf_embodied.runners.reasoning import ReasoningRunner
from rlinf_embodied.runtime import Worker

__all__ = ["ElasticReasoningRunner", "ElasticReasoningWorker", "response_seed", "shard_items"]


def response_seed(run_seed: int, step: int, group: int, sample: int) -> int:
    """Sampling seed of response ``sample`` of prompt group ``group`` at ``step``: a pure
    function of these (never of the worker), so any worker reproduces the response."""
    return (run_seed * 1_000_003 + step * 100_019 + group * 1_009 + sample) % (2**31 - 1)


def shard_items(requests, group_size: int, run_seed: int, step: int, shard_responses: int) -> Dict[int, dict]:
    """The step's resumable shard states: shard id -> ``{"items": [...]}``.

    Args:
        requests: the step's P :class:`~rlinf_embodied.reasoning.messages.PromptRequest`.
        group_size: G responses per prompt.
        run_seed, step: seed the responses (:func:`response_seed`).
        shard_responses: responses per shard S (divides P * G).

    Returns:
        P * G / S shards in (group, sample) order; an item holds ``group, sample, uid, answer,
        prompt_ids, seed`` and the progress ``response_ids, logprobs, finish_reason`` (None
        while unfinished) and ``workers`` (who generated each piece).
    """
    items = [{"group": q.group, "sample": k, "uid": q.uid, "answer": q.answer,
              "prompt_ids": list(q.prompt_ids), "seed": response_seed(run_seed, step, q.group, k),
              "response_ids": [], "logprobs": [], "finish_reason": None, "workers": []}
             for q in requests for k in range(group_size)]
    S = shard_responses
    return {s: {"items": items[s * S:(s + 1) * S]} for s in range(len(items) // S)}


class ElasticReasoningWorker(Worker):
    """One elastic reasoning rollout instance: an HF backend with its own weights copy.

    Args:
        cfg: :class:`~rlinf_embodied.reasoning.config.ReasoningJobConfig`.
        model_dir: local HF model directory.
        store_name: the run's WeightStore actor.
        chunk_tokens: tokens per response per call (the reporting period).
        token_cost_s: seconds slept per generated token (0; benchmarks set a controlled cost).
        kind: ``"reserved"`` or ``"preemptible"``.
    """

    def __init__(self, cfg, model_dir: str, store_name: str, chunk_tokens: int,
                 token_cost_s: float, kind: str):
        import ray
        import torch

        from rlinf_embodied.reasoning.hf_backend import HFBackend

        torch.manual_seed(cfg.run.seed)
        rc = cfg.rollout
        if rc.device is None:
            rc = dataclasses.replace(rc, device=self.torch_device)
        self.cfg, self.kind, self.chunk, self.cost = cfg, kind, int(chunk_tokens), float(token_cost_s)
        self.backend = HFBackend(model_dir, rc)
        self.store = ray.get_actor(store_name)
        self.version = -1
        self.pulls = 0
        latest = ray.get(self.store.latest.remote())
        if latest >= 0:  # a joining worker provisions itself with the current weights
            self._pull(latest)

    def _pull(self, version: int) -> None:
        import ray

        payload = ray.get(self.store.get.remote(version))
        if payload is None:
            raise RuntimeError(f"weights version {version} is not in the store; publish it "
                               f"before the rollout.")
        self.backend.update_weights(ray.get(payload[0]), version)
        self.version = int(version)
        self.pulls += 1

    def run_shard(self, step: int, shard: int, version: int, state: dict) -> dict:
        """Generate the next ``chunk_tokens`` tokens of each unfinished response of ``state``.

        Returns:
            ``{"partial": state}`` (progress appended) while a response is unfinished, else
            ``{"shard", "version", "kind", "traj": items, "stats"}`` with ``stats`` =
            ``responses, tokens, truncated`` sums.
        """
        if self.version != version:
            self._pull(version)
        r = self.cfg.rollout
        for it in state["items"]:
            if it["finish_reason"] is not None:
                continue
            new, lps, fin = self.backend.continue_response(
                it["prompt_ids"], it["response_ids"], num_tokens=self.chunk,
                max_new_tokens=r.max_new_tokens, temperature=r.temperature, top_p=r.top_p,
                seed=it["seed"])
            if self.cost:
                time.sleep(self.cost * len(new))
            it["response_ids"] += new
            it["logprobs"] += lps
            it["finish_reason"] = fin
            it["workers"].append(self.name)
        items = state["items"]
        if any(it["finish_reason"] is None for it in items):
            return {"partial": state}
        stats = {"responses": float(len(items)), "tokens": float(sum(len(i["response_ids"]) for i in items)),
                 "truncated": float(sum(i["finish_reason"] == "length" for i in items))}
        return {"shard": shard, "version": self.version, "kind": self.kind, "traj": items,
                "stats": stats}


class _Background:
    """A driver-side call with the interface :func:`~rlinf_embodied.runtime.wait_all` polls."""

    def __init__(self, fn, method: str) -> None:
        self.group, self.method = "elastic", method
        self._ex = cf.ThreadPoolExecutor(max_workers=1, thread_name_prefix="elastic-gen")
        self._fut = self._ex.submit(fn)

    def done(self) -> bool:
        return self._fut.done()

    def poll(self) -> bool:
        if self._fut.done():
            self._fut.result()  # raise the failure
            return True
        return False

    def wait(self):
        try:
            return [self._fut.result()]
        finally:
            self._ex.shutdown(wait=False)


class ElasticGeneration:
    """Stands in for the placed rollout group in :class:`ReasoningRunner`: ``generate`` runs
    the step on the elastic pool (in a driver thread, so reward and actor start at once) and
    streams each shard's responses into the ``responses`` channel; everything else (evaluation,
    weight loading) goes to the placed group.

    Args:
        group: the placed rollout WorkerGroup.
        pool: the started ElasticRolloutPool of ElasticReasoningWorker.
        runner: the :class:`ElasticReasoningRunner` (config, sync, run directory, channel).
    """

    def __init__(self, group, pool, runner: "ElasticReasoningRunner") -> None:
        self._group, self.pool, self._runner = group, pool, runner
        self.records: List[dict] = []

    def __getattr__(self, name):
        return getattr(self._group, name)

    def generate(self, step: int, per_rank) -> _Background:
        requests = [q for part in per_rank.values for q in part]
        return _Background(lambda: self._generate(step, requests), "generate")

    def _generate(self, step: int, requests) -> dict:
        from rlinf_embodied.reasoning.messages import EndOfStream, Response, ResponseBatch
        from rlinf_embodied.runtime import flush_puts

        run, cfg = self._runner, self._runner.cfg
        t0 = time.perf_counter()
        init = shard_items(requests, cfg.algorithm.group_size, cfg.run.seed, step, run.shard_responses)
        version = run.g.sync.version
        res = self.pool.collect(step, version, init)
        items = [it for part in res.parts[0] for it in part]
        n_roll, n_rew = self._group.world_size, run.num_reward_ranks
        mb = cfg.rollout.micro_batch_size
        sent = [0] * n_roll  # the placed ranks' EndOfStreams, as the reward ranks expect
        for k in range(n_roll):
            mine = items[k::n_roll]
            for i in range(0, len(mine), mb):
                batch = [Response(it["group"], it["uid"], it["answer"], it["sample"], it["prompt_ids"],
                                  it["response_ids"], it["logprobs"], it["finish_reason"], version)
                         for it in mine[i:i + mb]]
                run.responses.put(ResponseBatch(step, batch), key=f"w{k % n_rew}")
                sent[k] += len(batch)
            run.responses.put(EndOfStream(step, f"elastic-{k}", sent[k]), key=f"w{k % n_rew}")
        flush_puts()
        record = self._record(step, res, items)
        self.records.append(record)
        if run.records:
            atomic_write_json(Path(run.run_dir) / "elastic" / f"iter_{step:06d}.json", record)
        return {"responses": float(len(items)), "tokens": float(sum(len(i["response_ids"]) for i in items)),
                "truncated": float(sum(i["finish_reason"] == "length" for i in items)),
                "generate_s": time.perf_counter() - t0}

    def _record(self, step: int, res, items: List[dict]) -> dict:
        chunk = self._runner.elastic.chunk_tokens
        lost = [e for e in res.record["events"] if e["event"] == "lost" and e["shard"] is not None]
        migrated = [it for it in items if len(set(it["workers"])) > 1]
        metrics = dict(res.metrics)
        metrics["elastic/migrated_responses"] = float(len(migrated))
        # prefix tokens a continuing worker did not regenerate
        metrics["elastic/resumed_tokens"] = float(sum(
            chunk * next(i for i, w in enumerate(it["workers"]) if w != it["workers"][0])
            for it in migrated))
        metrics["elastic/lost_token_bound"] = float(chunk * len(lost) * self._runner.shard_responses)
        return {"iteration": step, "num_shards": res.record["num_shards"], "shards": res.record["shards"],
                "events": res.record["events"], "metrics": metrics,
                "responses": [{k: it[k] for k in ("group", "sample", "uid", "response_ids", "logprobs",
                                                   "finish_reason", "workers")} for it in items]}

    def shutdown(self) -> None:
        """Stop the pool's workers, then the placed group."""
        self.pool.shutdown()
        self._group.shutdown()


class ElasticReasoningRunner(ReasoningRunner):
    """:class:`~rlinf_embodied.runners.reasoning.ReasoningRunner` whose training rollout runs
    on an elastic pool of reserved and preemptible reasoning workers (evaluation keeps the
    placed rollout group).

    Args:
        cfg: the reasoning job config (``rollout.backend`` must be ``hf``).
        run_dir: the run directory (``elastic/iter_<step>.json`` records go there).
        elastic: the :class:`~rlinf_embodied.elastic.ElasticConfig` (default: ``cfg.elastic``
            if the config has one, else one reserved worker).
        node_provider: kills/restores nodes for ``elastic.preemption.target: node``.
        token_cost_s: seconds each worker sleeps per generated token (benchmarks).

    Raises:
        ConfigError: for another backend, or a shard size that does not divide the responses.
    """

    def __init__(self, cfg, run_dir: Path, elastic=None, node_provider=None,
                 token_cost_s: float = 0.0) -> None:
        from rlinf_embodied.config import ConfigError
        from rlinf_embodied.elastic.config import ElasticConfig
        from rlinf_embodied.elastic.pool import ElasticRolloutPool
        from rlinf_embodied.elastic.weights import ElasticWeightSync, weight_store
        from rlinf_embodied.runtime import Channel

        e = elastic if elastic is not None else (getattr(cfg, "elastic", None) or ElasticConfig())
        if cfg.rollout.backend != "hf":
            raise ConfigError(f"elastic reasoning rollout continues responses with the HF backend; "
                              f"set rollout.backend=hf (got {cfg.rollout.backend!r}).")
        G = cfg.algorithm.group_size
        self.shard_responses = e.shard_responses or G
        super().__init__(cfg, run_dir)
        total = min(cfg.rollout.prompts_per_step, len(self.sets["train"])) * G
        g = self.g
        try:
            if total % self.shard_responses:
                raise ConfigError(f"Set elastic.shard_responses to a divisor of the step's "
                                  f"{total} responses (got {self.shard_responses}).")
            self.elastic, self.records = e, e.records
            self.num_reward_ranks = g.reward.world_size
            self.responses = Channel.connect(g.rollout.on([0]).responses_channel().wait()[0])
            name = f"elastic-weights:{self.run_dir.name}:{id(self):x}"
            self._store = weight_store(name, create=True)
            g.sync = ElasticWeightSync(g.actor, g.rollout, self._store)
            pool = ElasticRolloutPool(cfg, None, name, 1, node_provider, elastic=e,
                                      num_shards=total // self.shard_responses,
                                      worker_cls=ElasticReasoningWorker,
                                      init_args=(cfg, g.model_dir, name, e.chunk_tokens, token_cost_s))
            g.rollout = ElasticGeneration(g.rollout, pool, self)
            pool.start()
        except BaseException:
            g.shutdown()
            raise

    @property
    def elastic_records(self) -> List[dict]:
        """Every step's record (also in ``elastic/iter_<step>.json`` when ``records``)."""
        return self.g.rollout.records if isinstance(self.g.rollout, ElasticGeneration) else []
