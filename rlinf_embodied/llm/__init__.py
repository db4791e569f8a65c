"""The reasoning workflow's domain, the LLM counterpart of envs/ and policies/.

Modules: ``tasks`` (procedural arithmetic task set and a GSM8K/MATH-style JSONL loader),
``verifier`` (rule-based answer checking with math-verify), ``backends`` (generation backends
behind one interface), ``hf_backend`` (HF transformers), ``vllm_backend`` (vLLM; imported only
in the vLLM venv), ``messages`` (what the reasoning roles exchange), ``tiny_model`` (a tiny Qwen2
and tokenizer built from config for CPU tests). Importing this package imports neither
transformers nor vLLM; it imports no runtime, worker or workflow.
"""
