"""A tiny Qwen2 causal LM and a BPE tokenizer built locally, saved in the HF layout.

CPU tests and the learning check need a real HF model directory without downloading one. The
model is ``Qwen2ForCausalLM`` from a config (2 layers, hidden 128, 2 attention heads and 1 KV head,
so head_dim 64: vLLM's CPU attention rejects head_dim 16, see ENVIRONMENT.md), tied embeddings;
the tokenizer is a byte-level BPE trained with ``tokenizers`` on the task text, with digits split
into single tokens so numbers are spelled digit by digit. Everything is deterministic from
``seed``: the same arguments give byte-identical files.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import List, Optional, Sequence

__all__ = ["build_tiny_model", "EOS_TOKEN", "PAD_TOKEN"]

EOS_TOKEN = "<|endoftext|>"
PAD_TOKEN = "<|pad|>"
_CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['content'] }}{% endfor %}"
)  # plain format: the prompt text itself, so chat and plain prompts tokenize the same


def _train_tokenizer(texts: Sequence[str], vocab_size: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=[EOS_TOKEN, PAD_TOKEN], show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(list(texts), trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS_TOKEN, pad_token=PAD_TOKEN)
    fast.chat_template = _CHAT_TEMPLATE
    return fast


def build_tiny_model(out_dir: str | Path, texts: Optional[List[str]] = None, seed: int = 0,
                     vocab_size: int = 512, hidden_size: int = 128, num_layers: int = 2,
                     num_heads: int = 2, num_kv_heads: int = 1, intermediate_size: int = 512,
                     max_position_embeddings: int = 256) -> Path:
    """Build (or reuse) a tiny Qwen2ForCausalLM + tokenizer directory at ``out_dir``.

    Args:
        out_dir: target directory; if it already holds a model built from the same arguments
            (``tiny_model_spec.json`` matches) it is reused as is.
        texts: tokenizer training corpus; None uses the default arithmetic task's prompts and
            solutions (``tasks.arithmetic_problems``: 3 operands up to 99, prompt format
            ``"{question}="``), which holds every digit and operator.
        seed: torch seed of the weight initialisation.
        vocab_size: model vocabulary V (>= tokenizer size; byte-level BPE needs >= 258).
        hidden_size: model width; ``hidden_size / num_heads`` must be 64 for vLLM on CPU.
        num_layers, num_heads, num_kv_heads, intermediate_size, max_position_embeddings:
            Qwen2 config fields.

    Returns:
        ``out_dir`` as a Path, holding config.json, generation_config.json, model.safetensors,
        tokenizer.json, tokenizer_config.json (with a chat template) and the spec file.

    Raises:
        ValueError: if ``vocab_size`` is smaller than the trained tokenizer.
    """
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    from rlinf_embodied.checkpoint import atomic_write_json

    if texts is None:
        from rlinf_embodied.llm.tasks import arithmetic_problems, corpus_text

        texts = corpus_text(arithmetic_problems("train", 2000, 0, 99, 3), "{question}=")
    out = Path(out_dir)
    spec = dict(seed=seed, vocab_size=vocab_size, hidden_size=hidden_size, num_layers=num_layers,
                num_heads=num_heads, num_kv_heads=num_kv_heads,
                intermediate_size=intermediate_size, max_pos=max_position_embeddings,
                corpus=hashlib.sha256("\n".join(texts).encode()).hexdigest())
    spec_file = out / "tiny_model_spec.json"
    if spec_file.is_file() and json.loads(spec_file.read_text()) == spec:
        return out
    tok = _train_tokenizer(texts, vocab_size)
    if len(tok) > vocab_size:
        raise ValueError(f"tokenizer has {len(tok)} tokens > vocab_size={vocab_size}; raise it.")
    cfg = Qwen2Config(
        vocab_size=vocab_size, hidden_size=hidden_size, intermediate_size=intermediate_size,
        num_hidden_layers=num_layers, num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads, max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=True, eos_token_id=tok.eos_token_id, bos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id, torch_dtype="float32", use_sliding_window=False)
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(cfg)
    model.generation_config = GenerationConfig(
        eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, bos_token_id=tok.eos_token_id)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    atomic_write_json(spec_file, spec)
    return out
