"""Task sets, the math-verify verifier, the tiny model builder and the reasoning config."""

import json

import pytest

from rlinf_embodied.config import ConfigError, load_config
from rlinf_embodied.reasoning.config import ReasoningJobConfig, is_reasoning_job
from rlinf_embodied.reasoning.tasks import arithmetic_problems, load_jsonl
from rlinf_embodied.reasoning.verifier import verify, verify_batch


def test_arithmetic_split_is_disjoint_deterministic_and_correct():
    train = arithmetic_problems("train", 300, seed=0)
    test = arithmetic_problems("test", 60, seed=0)
    assert not {p.question for p in train} & {p.question for p in test}
    assert [p.question for p in train] == [p.question for p in arithmetic_problems("train", 300, 0)]
    assert [p.question for p in train] != [p.question for p in arithmetic_problems("train", 300, 1)]
    for p in train[:50]:
        assert int(p.answer) == eval(p.question)  # noqa: S307 - our own digits and +/-
    with pytest.raises(ValueError, match="raise max_operand"):
        arithmetic_problems("train", 10_000, max_operand=5)


def test_jsonl_loader_reads_gsm8k_answers(tmp_path):
    f = tmp_path / "gsm.jsonl"
    f.write_text(json.dumps({"question": "2 apples and 3 more?", "answer": "2+3=5\n#### 5"}) + "\n"
                 + json.dumps({"question": "Big?", "answer": "#### 1,200"}) + "\n")
    ps = load_jsonl(f)
    assert [(p.question, p.answer) for p in ps] == [("2 apples and 3 more?", "5"), ("Big?", "1200")]
    assert ps[0].solution.endswith("#### 5")
    with pytest.raises(ValueError, match="task.question_key"):
        load_jsonl(f, question_key="problem")
    with pytest.raises(FileNotFoundError, match="task.path"):
        load_jsonl(tmp_path / "missing.jsonl")


def test_verifier_checks_final_answers_symbolically():
    assert verify_batch(["18", " 18", "19", "-3", "The answer is \\boxed{42}.", "", "1/2"],
                        ["18", "18", "18", "3", "42", "1", "\\frac{1}{2}"]) == [1, 1, 0, 0, 1, 0, 1]
    assert verify("so 2+3=5, answer 5", "5") == 1.0


def test_tiny_model_is_deterministic_and_in_hf_layout(tmp_path):
    from transformers import AutoConfig, AutoTokenizer

    from rlinf_embodied.reasoning.tiny_model import build_tiny_model

    texts = ["12+3=15", "7-9=-2", "20+20=40"] * 20
    a = build_tiny_model(tmp_path / "a", texts, seed=1)
    b = build_tiny_model(tmp_path / "b", texts, seed=1)
    for name in ("config.json", "model.safetensors", "tokenizer.json"):
        assert (a / name).read_bytes() == (b / name).read_bytes(), name
    cfg = AutoConfig.from_pretrained(a)
    assert (cfg.model_type, cfg.hidden_size // cfg.num_attention_heads, cfg.num_key_value_heads,
            cfg.tie_word_embeddings, cfg.vocab_size) == ("qwen2", 64, 1, True, 512)
    tok = AutoTokenizer.from_pretrained(a)
    assert tok.tokenize("12+3=15") == ["1", "2", "+", "3", "=", "1", "5"]  # digits one by one
    assert tok.eos_token_id is not None and tok.chat_template


def test_reasoning_config_is_strict_and_detected(tmp_path):
    assert is_reasoning_job("configs/reasoning_grpo_tiny.yaml")
    assert not is_reasoning_job("configs/gym_pointreach_ppo_mlp.yaml")
    cfg = load_config("configs/reasoning_grpo_tiny.yaml", schema=ReasoningJobConfig)
    assert cfg.rollout.backend == "hf" and cfg.algorithm.group_size == 8
    with pytest.raises(ConfigError, match="group_size"):
        load_config("configs/reasoning_grpo_tiny.yaml", ["algorithm.group_size=1"], schema=ReasoningJobConfig)
    with pytest.raises(ConfigError, match="Valid keys of algorithm"):
        load_config("configs/reasoning_grpo_tiny.yaml", ["algorithm.nope=1"], schema=ReasoningJobConfig)
    gpu = load_config("configs/reasoning_grpo_qwen2.5_0.5b.yaml", schema=ReasoningJobConfig)
    assert gpu.task.type == "jsonl" and gpu.model.path
