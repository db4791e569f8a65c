"""Task sets, the math-verify verifier, the tiny model builder and the reasoning config."""

import json

import pytest

from rlinf_embodied.config import ConfigError, load_config
from rlinf_embodied.reasoning.config import ReasoningJobConfig, is_reasoning_job
from rlinf_embodied.llm.tasks import arithmetic_problems, load_jsonl
from rlinf_embodied.llm.verifier import verify, verify_batch


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

    from rlinf_embodied.llm.tiny_model import build_tiny_model

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


def test_no_carry_sums_have_no_carry_and_split_disjointly():
    train = arithmetic_problems("train", 800, seed=0, max_operand=99, no_carry=True)
    test = arithmetic_problems("test", 100, seed=0, max_operand=99, no_carry=True)
    assert not {p.question for p in train} & {p.question for p in test}
    for p in train + test:
        a, b = p.question.split("+")
        assert len(a) == len(b) == 2 and int(p.answer) == int(a) + int(b)
        assert all(int(x) + int(y) <= 9 for x, y in zip(a, b)), p.question
    with pytest.raises(ValueError, match="raise max_operand"):  # 36 x 55 questions in all
        arithmetic_problems("train", 1500, max_operand=99, no_carry=True)


def test_long_tail_lengths_force_exact_response_lengths(tmp_path):
    """``rollout.long_tail_alpha``: Pareto lengths, and the HF backend generates exactly them
    (the streamed order follows the lengths: short responses leave first)."""
    from rlinf_embodied.reasoning.config import ReasoningRolloutConfig
    from rlinf_embodied.llm.hf_backend import HFBackend
    from rlinf_embodied.llm.tiny_model import build_tiny_model
    from rlinf_embodied.workers.reasoning_rollout import long_tail_lengths

    lens = long_tail_lengths(2000, 1.0, 48, seed=0)
    assert min(lens) == 1 and max(lens) == 48 and lens == long_tail_lengths(2000, 1.0, 48, 0)
    frac = sum(n >= 48 for n in lens) / len(lens)
    assert 0.01 < frac < 0.05  # P(Pareto(1) > 47) = 1/48
    assert sorted(lens)[len(lens) // 2] <= 2  # the median response is short
    model = build_tiny_model(tmp_path / "m", ["12+3=15", "7+2=9"] * 20, seed=0)
    be = HFBackend(str(model), ReasoningRolloutConfig())
    want = [1, 7, 3, 12, 2, 12]
    kw = dict(max_new_tokens=12, temperature=1.0, top_p=1.0, seed=0, response_lengths=want)
    gens = be.generate([[5, 6, 7]] * 6, **kw)
    assert [len(g.response_ids) for g in gens] == want
    assert all(be.eos_ids.isdisjoint(g.response_ids[:-1]) for g in gens)
    order = [g.index for g in be.generate_stream([[5, 6, 7]] * 6, **kw)]
    assert [want[i] for i in order] == sorted(want)
