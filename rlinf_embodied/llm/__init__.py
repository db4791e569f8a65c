"""The reasoning workflow's domain: tasks and their verifier, generation backends (HF, vLLM), the
tiny model, and the messages its roles exchange (the LLM counterpart of envs/ and policies/)."""
