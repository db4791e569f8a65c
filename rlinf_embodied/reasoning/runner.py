"""The reasoning-LLM RL main loop: sync weights -> generate | score | train (streamed) -> eval.

Rollout, reward and actor calls of a step are issued together and meet through channels: the
reward workers score responses as they arrive and the actor collects its groups (computing
reference log-probs per micro-batch), so with ``rollout.pipelining`` short responses are scored
while long ones still generate. Placement (collocated / disaggregated / hybrid) is data, read
by the runtime; this loop is the same under all three.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Optional

import numpy as np

from rlinf_embodied.checkpoint import atomic_dir, atomic_write_json
from rlinf_embodied.config import as_dict, save_config
from rlinf_embodied.metrics import MetricLogger
from rlinf_embodied.reasoning.launch import launch_reasoning_groups, split_evenly
from rlinf_embodied.llm.messages import PromptRequest
from rlinf_embodied.runners.budget import over_budget
from rlinf_embodied.runners.signals import StopSignals
from rlinf_embodied.runtime import PerRank, wait_all

__all__ = ["ReasoningRunner"]


MODEL_DIR = "model"
"""The run directory's model checkpoint (HF layout: config, safetensors, tokenizer)."""


class ReasoningRunner:
    """Runs one reasoning job (GRPO/DAPO) in ``run_dir``; results in ``run_dir/results.json``.

    Attributes (after :meth:`run`):
        interrupted: the run stopped early on a stop signal (or was aborted).
        saved: ``(path, step)`` of the last model checkpoint written, or None.
    """

    def __init__(self, cfg, run_dir: Path):
        from transformers import AutoTokenizer

        from rlinf_embodied.llm.tasks import format_prompt, load_problems

        self.cfg, self.run_dir = cfg, Path(run_dir)
        save_config(cfg, self.run_dir)
        self.g = launch_reasoning_groups(cfg, self.run_dir, f"run-{uuid.uuid4().hex[:8]}")
        tok = AutoTokenizer.from_pretrained(self.g.model_dir)
        self.sets = {s: [PromptRequest(i, p.uid, format_prompt(tok, cfg.task, p.question), p.answer)
                         for i, p in enumerate(load_problems(cfg.task, s))] for s in ("train", "test")}
        self.log = MetricLogger(self.run_dir, cfg.logging.tensorboard, cfg.logging.wandb,
                                cfg.logging.console, cfg.logging.wandb_project, as_dict(cfg))
        self.results = {"backend": self.g.backend, "placement": cfg.placement,
                        "pipelining": cfg.rollout.pipelining, "model_dir": self.g.model_dir,
                        "steps": [], "eval": []}
        self.signals = StopSignals()
        self.interrupted = False
        self.saved: Optional[tuple] = None

    def run(self, signals: Optional[StopSignals] = None) -> dict:
        """Train ``trainer.iterations`` steps (or until ``max_time_s``, or a stop signal).

        A Ctrl-C / SIGTERM (``signals``, installed here unless the caller has) finishes the
        current step, saves the model to ``run_dir/model`` (also with
        ``trainer.save_every=0``) and ends the run; a second Ctrl-C aborts at once without
        saving. The model is also saved every ``trainer.save_every`` steps and at the end.
        ``results.json`` is written in every case, with ``interrupted``, ``aborted`` and
        ``model`` (``{"path", "step"}`` of the saved model, or None).

        Returns:
            The results dict (also in ``run_dir/results.json``).
        """
        g, t = self.g, self.cfg.trainer
        n_roll, start, tokens = g.rollout.world_size, time.time(), 0
        if signals is not None:
            self.signals = signals
        owns_handlers = not self.signals._prev
        self.signals.install()
        self.signals.phase = "training"
        done, eval_s = 0, 0.0
        try:
            if t.sft_steps:
                sft = g.actor.sft(t.sft_steps).wait()[0]
                self.results["sft"] = sft
                print(f"SFT warm-up: {t.sft_steps} steps, loss {sft['sft/loss_first']:.3f} -> "
                      f"{sft['sft/loss_last']:.3f}")
            if t.eval_every:
                self.log.log(self.evaluate(0), 0, 0)
            for step in range(t.iterations):
                if self.signals.requested:
                    break
                t_step = time.time()
                m = {"time/weight_sync_s": g.sync.push(step)}
                t0 = time.perf_counter()
                reqs = self._sample(step)
                gen = g.rollout.generate(step, PerRank(split_evenly(reqs, n_roll)))
                gs, rs, ts = wait_all(gen, g.reward.score(step), g.actor.train(step))
                m["time/step_s"] = time.perf_counter() - t0
                m["time/generate_s"] = max(s["generate_s"] for s in gs)
                m.update({k: float(np.mean([d[k] for d in ts if k in d]))
                          for k in ts[0] if k.startswith(("train/", "time/"))})
                n = sum(s["responses"] for s in gs)
                tokens += sum(s["tokens"] for s in gs)
                m["rollout/reward"] = sum(s["reward_sum"] for s in rs) / max(1, n)
                m["rollout/accuracy"] = sum(s["correct"] for s in rs) / max(1, n)
                m["rollout/response_length"] = sum(s["tokens"] for s in gs) / max(1, n)
                m["rollout/truncated"] = sum(s["truncated"] for s in gs) / max(1, n)
                m["rollout/tokens_per_s"] = sum(s["tokens"] for s in gs) / max(1e-9, m["time/generate_s"])
                evaluating = bool(t.eval_every) and (step + 1) % t.eval_every == 0
                now = time.time()  # stop before a step that would end past the budget
                last = step + 1 == t.iterations or over_budget(
                    now - start, now - t_step, t.max_time_s, due_s=eval_s if evaluating else 0.0)
                if t.eval_every and (evaluating or last):
                    t_eval = time.time()
                    m.update(self.evaluate(step + 1))
                    eval_s = time.time() - t_eval
                self.log.log(m, tokens, step + 1)
                self.results["steps"].append({"step": step + 1, **m})
                done = step + 1
                if last:
                    break
                if t.save_every and done % t.save_every == 0:
                    self.save(done)
            self.interrupted = self.signals.requested
            trained = bool(done or "sft" in self.results)  # the SFT warm-up trains too
            if self.interrupted:
                print(f"interrupted after step {done}: "
                      + ("saving the model" if done else "saving the SFT warm-up model"
                         if trained else "nothing trained, nothing to save"))
            if (t.save_every or self.interrupted) and trained and \
                    (self.saved is None or self.saved[1] != done):
                self.save(done)
        except KeyboardInterrupt:
            self.interrupted = True  # aborted (a second Ctrl-C): nothing more is saved
        finally:
            self.signals.phase = "exiting"
            try:
                self.results.update(
                    interrupted=self.interrupted, aborted=self.signals.aborted,
                    model=None if self.saved is None else {"path": str(self.saved[0]),
                                                           "step": self.saved[1]})
                self.log.close()
                atomic_write_json(self.run_dir / "results.json", self.results)
                plot_reasoning_curves(self.results, self.run_dir / "curves.png")
            finally:
                g.shutdown()
                if owns_handlers:
                    self.signals.restore()
        return self.results

    def save(self, step: int) -> Path:
        """Write the actor's model to ``run_dir/model`` (HF layout) after ``step`` steps.

        The files are written to a temporary directory that then replaces ``model/``, so an
        interrupted save leaves the previous model in place.
        """
        final = self.run_dir / MODEL_DIR
        with atomic_dir(final) as tmp:
            self.g.actor.save(str(tmp)).wait()
            atomic_write_json(tmp / "step.json", {"step": step})
        self.saved = (final, step)
        return final

    def _sample(self, step: int) -> list:
        """The step's prompts: ``rollout.prompts_per_step`` training problems drawn without
        replacement by (run seed, step); group ids renumbered 0..P-1."""
        train = self.sets["train"]
        rng = np.random.default_rng([self.cfg.run.seed, step])
        pick = rng.choice(len(train), size=min(self.cfg.rollout.prompts_per_step, len(train)), replace=False)
        return [PromptRequest(j, train[i].uid, train[i].prompt_ids, train[i].answer)
                for j, i in enumerate(pick.tolist())]

    def evaluate(self, step: int) -> dict:
        """Mean reward on the held-out set (greedy unless ``eval.greedy=false``); writes
        ``eval/iter_<step>.json`` with a few decoded samples."""
        g, e = self.g, self.cfg.eval
        g.sync.push(step)
        outs = g.rollout.evaluate(PerRank(split_evenly(self.sets["test"], g.rollout.world_size)),
                                  e.greedy, e.max_new_tokens).wait()
        scored = g.reward.on([0]).score_responses([r for part in outs for r in part]).wait()[0]
        mean = float(np.mean([r.reward for r in scored]))
        rec = {"step": step, "reward": mean, "num_prompts": len(scored), "backend": g.backend,
               "samples": [{"uid": r.uid, "answer": r.answer, "response": r.text,
                            "reward": r.reward} for r in scored[:8]]}
        atomic_write_json(self.run_dir / "eval" / f"iter_{step:06d}.json", rec)
        self.results["eval"].append({"step": step, "reward": mean})
        return {"eval/reward": mean}


def plot_reasoning_curves(results: dict, out: Path) -> Path:
    """PNG of training reward and held-out reward against the step."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    st = results["steps"]
    if st:
        ax.plot([s["step"] for s in st], [s["rollout/reward"] for s in st], label="train reward")
    ev = results["eval"]
    if ev:
        ax.plot([e["step"] for e in ev], [e["reward"] for e in ev], "o-", label="held-out reward")
    ax.set_xlabel("RL step")
    ax.set_ylabel("mean reward")
    ax.set_title(f"{results['backend']} backend, {results['placement']}")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out
