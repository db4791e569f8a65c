"""Reasoning-LLM RL (GRPO/DAPO on math-style tasks) on the M2Flow runtime.

Modules: ``config`` (job and section dataclasses), ``backends`` (generation backends behind one
interface: HF transformers and vLLM), ``tiny_model`` (a tiny Qwen2 + tokenizer built from config
for CPU tests), ``tasks`` (procedural arithmetic task set and a GSM8K/MATH-style JSONL loader),
``verifier`` (rule-based answer checking with math-verify). Importing this package imports
neither transformers nor vLLM.
"""
