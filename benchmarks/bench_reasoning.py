"""Reasoning workflow speeds: HF vs vLLM generation, placement plans, elastic pipelining.

Runs in the vLLM venv (``.venv-vllm``; started from another interpreter it re-executes itself
there when that venv exists). All numbers use the tiny Qwen2 of
``rlinf_embodied.reasoning.tiny_model`` on CPU, so they compare code paths, not model speeds.
Prints one JSON line last:

    hf_tokens_per_s, vllm_tokens_per_s, vllm_vs_hf     generated tokens/s at the same batch
                                                       (B prompts x up to T new tokens, same
                                                       sampling settings, same thread count)
    generation: {hf: {...}, vllm: {...}}               breakdown: start-up, generate seconds,
                                                       generated tokens, finish reasons
    placement / scheduler / pipelining                 filled by the reasoning runner's part
                                                       (``runner`` says why when it is absent)
    loadavg                                            /proc/loadavg before and after

Usage: python benchmarks/bench_reasoning.py [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VENV_PY = ROOT / ".venv-vllm" / "bin" / "python"


def _reexec_in_vllm_venv() -> None:
    try:
        import vllm  # noqa: F401
    except ImportError:
        # venv pythons are links to one interpreter: compare the venvs, not the executables
        if VENV_PY.exists() and Path(sys.prefix).resolve() != VENV_PY.parents[1].resolve():
            os.execv(str(VENV_PY), [str(VENV_PY), __file__, *sys.argv[1:]])
        raise SystemExit("bench_reasoning needs vLLM: run `bash scripts/setup.sh` (builds "
                         ".venv-vllm) and `.venv-vllm/bin/python benchmarks/bench_reasoning.py`.")


def _loadavg() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "n/a"


def _prompts(tok, n: int):
    from rlinf_embodied.reasoning.tasks import arithmetic_problems

    probs = arithmetic_problems("test", n, seed=0)
    return [tok.encode(f"{p.question}=") for p in probs]


def bench_generation(model_dir: str, batch: int, new_tokens: int) -> dict:
    """Same prompts, sampling settings and thread count through both backends."""
    from transformers import AutoTokenizer

    from rlinf_embodied.reasoning.backends import make_backend
    from rlinf_embodied.reasoning.config import ReasoningRolloutConfig

    tok = AutoTokenizer.from_pretrained(model_dir)
    prompts = _prompts(tok, batch)
    kw = {"max_new_tokens": new_tokens, "temperature": 1.0, "top_p": 1.0, "seed": 0}
    out = {"batch": batch, "max_new_tokens": new_tokens}
    for name in ("hf", "vllm"):
        cfg = ReasoningRolloutConfig(backend=name, max_batch_size=batch,
                                     max_new_tokens=new_tokens, max_model_len=256,
                                     gpu_memory_utilization=0.05)
        t0 = time.perf_counter()
        be = make_backend(name, model_dir, cfg)
        start_s = time.perf_counter() - t0
        be.generate(prompts[:2], **{**kw, "max_new_tokens": 2})  # warm-up
        t0 = time.perf_counter()
        gens = be.generate(prompts, **kw)
        gen_s = time.perf_counter() - t0
        ntok = sum(len(g.response_ids) for g in gens)
        out[name] = {"start_s": round(start_s, 2), "generate_s": round(gen_s, 3),
                     "generated_tokens": ntok, "tokens_per_s": round(ntok / gen_s, 1),
                     "stopped": sum(g.finish_reason == "stop" for g in gens)}
        be.close()
    return out


def bench_runner(model_dir: str, quick: bool) -> dict:
    """Placement, scheduler and pipelining numbers from the reasoning runner (if present)."""
    try:
        from rlinf_embodied.runners import reasoning as _runner  # noqa: F401
    except ImportError as e:
        return {"runner": f"not measured: the reasoning runner is not in this tree ({e})"}
    return {"runner": "present but its benchmark hooks are not wired here yet"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="smaller batch and fewer tokens")
    args = ap.parse_args()
    # The same intra-op thread count for both backends (vLLM lowers torch's to 1 unless
    # OMP_NUM_THREADS is set).
    os.environ.setdefault("OMP_NUM_THREADS", str(os.cpu_count() or 1))
    _reexec_in_vllm_venv()
    from rlinf_embodied.reasoning.tiny_model import build_tiny_model

    load0 = _loadavg()
    batch, new_tokens = (16, 32) if args.quick else (64, 64)
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = str(build_tiny_model(Path(tmp) / "tiny", seed=0))
        gen = bench_generation(model_dir, batch, new_tokens)
        result = {
            "hf_tokens_per_s": gen["hf"]["tokens_per_s"],
            "vllm_tokens_per_s": gen["vllm"]["tokens_per_s"],
            "vllm_vs_hf": round(gen["vllm"]["tokens_per_s"] / gen["hf"]["tokens_per_s"], 2),
            "generation": gen,
        }
        result.update(bench_runner(model_dir, args.quick))
    result["loadavg"] = {"before": load0, "after": _loadavg()}
    result["omp_num_threads"] = int(os.environ["OMP_NUM_THREADS"])
    print(json.dumps(result))


if __name__ == "__main__":
    main()
