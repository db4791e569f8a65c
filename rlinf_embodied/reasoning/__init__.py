"""The reasoning-LLM RL workflow (GRPO/DAPO on math-style tasks) on the M2Flow runtime.

Modules: ``config`` (job and section dataclasses), ``launch`` (starting the rollout, reward and
actor groups where the placement puts them), ``runner`` (the main loop), ``elastic`` (the runner
on the elastic rollout pool, with token-level migration), ``schedule`` (the workflow's graph,
analytic profile and profiling for the scheduler), ``cli`` (checks run before anything starts).
The domain it runs on (tasks, verifier, generation backends, messages, the tiny model) is
:mod:`rlinf_embodied.llm`. Importing this package imports neither transformers nor vLLM.
"""
