"""Reasoning task sets: a procedural arithmetic set shipped with the code, and JSONL loading.

The arithmetic set needs no download: problems of a split are drawn from a NumPy generator
seeded by ``(seed, split)``, and a hash of the question decides its split, so the held-out set
is disjoint from training by construction. GSM8K/MATH-style JSONL files (one JSON
object per line with a question and an answer field) load from a local path; GSM8K's
``"... #### 42"`` answers reduce to the final number.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional

import numpy as np

__all__ = ["Problem", "arithmetic_problems", "load_jsonl", "load_problems", "corpus_text",
           "format_prompt"]

_SPLIT_OFFSET = {"train": 0, "test": 1}


@dataclass(frozen=True)
class Problem:
    """One question with its reference answer.

    Attributes:
        uid: stable id (``"arith-train-17"``, ``"<file stem>-3"``).
        question: question text (formatted into a prompt by the rollout worker).
        answer: gold answer as a string (verified with math-verify).
        solution: a worked solution text ending in the answer (SFT warm-up target); may equal
            ``answer``.
    """

    uid: str
    question: str
    answer: str
    solution: str


def _arith(rng: np.random.Generator, max_operand: int, num_operands: int) -> tuple[str, int]:
    nums = rng.integers(0, max_operand + 1, size=num_operands)
    ops = rng.choice(["+", "-"], size=num_operands - 1)
    text, value = str(int(nums[0])), int(nums[0])
    for op, n in zip(ops, nums[1:]):
        text += f"{op}{int(n)}"
        value = value + int(n) if op == "+" else value - int(n)
    return text, value


def _arith_no_carry(rng: np.random.Generator, max_operand: int, num_operands: int) -> tuple[str, int]:
    digits = len(str(max_operand))
    cols = []
    for d in range(digits):  # most significant first; a leading digit is >= 1
        lo = 1 if d == 0 and digits > 1 else 0
        while True:
            col = rng.integers(lo, 10, size=num_operands)
            if col.sum() <= 9:
                break
        cols.append(col)
    nums = [int("".join(str(int(c[k])) for c in cols)) for k in range(num_operands)]
    return "+".join(map(str, nums)), sum(nums)


def _split_of(question: str, seed: int, test_fraction: float) -> str:
    h = int.from_bytes(hashlib.sha256(f"{seed}:{question}".encode()).digest()[:8], "little")
    return "test" if h / 2**64 < test_fraction else "train"


def arithmetic_problems(split: str, num: int, seed: int = 0, max_operand: int = 20,
                        num_operands: int = 2, test_fraction: float = 0.2,
                        no_carry: bool = False) -> List[Problem]:
    """``num`` distinct problems like ``"13+7-2"`` (answer ``"18"``) of ``split``.

    Every possible question belongs to exactly one split, by a hash of ``(seed, question)``
    (``test_fraction`` of them to ``test``), so held-out questions never occur in training.

    Args:
        split: ``"train"`` or ``"test"``.
        num: number of problems.
        seed: task seed; the split assignment and the draw order derive from it.
        max_operand: operands are integers in [0, max_operand].
        num_operands: operands per expression (>= 2), joined by random ``+``/``-``.
        test_fraction: share of all questions held out for ``test``.
        no_carry: sums without carries (``"34+52"``): ``+`` only, every operand has the digit
            count of ``max_operand`` (leading digit >= 1) and each digit column sums to <= 9.

    Raises:
        ValueError: for an unknown split, or when ``num`` exceeds 90% of about the distinct
            questions the split can hold (or the questions it actually holds).
    """
    if split not in _SPLIT_OFFSET:
        raise ValueError(f"split must be 'train' or 'test' (got {split!r}).")
    if num_operands < 2:
        raise ValueError(f"num_operands must be >= 2 (got {num_operands}).")
    space = (max_operand + 1) ** num_operands * 2 ** (num_operands - 1)
    if no_carry:  # columns of num_operands digits summing to <= 9, leading column from 1
        from math import comb

        digits = len(str(max_operand))
        lead = comb(9, num_operands) if digits > 1 else comb(9 + num_operands, num_operands)
        space = lead * comb(9 + num_operands, num_operands) ** (digits - 1)
    share = test_fraction if split == "test" else 1 - test_fraction
    if num > 0.9 * share * space:
        raise ValueError(f"{split} holds about {int(share * space)} distinct problems for "
                         f"max_operand={max_operand}, num_operands={num_operands}; ask for at "
                         f"most 90% of them (num={num}) or raise max_operand.")
    rng = np.random.default_rng([seed, _SPLIT_OFFSET[split]])
    seen, out, draws = set(), [], 0
    while len(out) < num:
        draws += 1
        if draws > 100 * space:  # the hash gave this split fewer questions than asked for
            raise ValueError(f"{split} holds only {len(out)} distinct problems for max_operand="
                             f"{max_operand}, num_operands={num_operands} (num={num}); lower "
                             f"num or raise max_operand.")
        q, v = (_arith_no_carry if no_carry else _arith)(rng, max_operand, num_operands)
        if q in seen or _split_of(q, seed, test_fraction) != split:
            continue
        seen.add(q)
        out.append(Problem(f"arith-{split}-{len(out)}", q, str(v), str(v)))
    return out


def _gsm8k_answer(text: str) -> str:
    return text.split("####")[-1].strip().replace(",", "") if "####" in text else text.strip()


def load_jsonl(path: str | Path, question_key: str = "question", answer_key: str = "answer",
               limit: Optional[int] = None) -> List[Problem]:
    """Problems from a GSM8K/MATH-style JSONL file.

    Args:
        path: local file, one JSON object per line.
        question_key: field holding the question (GSM8K ``question``, MATH ``problem``).
        answer_key: field holding the answer (GSM8K ``answer`` with ``#### N``; MATH
            ``solution`` with ``\\boxed{}``, verified by math-verify as is).
        limit: keep the first ``limit`` lines.

    Raises:
        FileNotFoundError: naming the path.
        ValueError: naming the line and the missing key.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"task file {path} not found; set task.path to a local JSONL file.")
    out = []
    with open(path) as f:
        for i, line in enumerate(f):
            if limit is not None and len(out) >= limit:
                break
            if not line.strip():
                continue
            row = json.loads(line)
            for k in (question_key, answer_key):
                if k not in row:
                    raise ValueError(f"{path}:{i + 1} has no key {k!r} (keys: {sorted(row)}); "
                                     f"set task.question_key / task.answer_key.")
            raw = str(row[answer_key])
            out.append(Problem(f"{path.stem}-{i}", str(row[question_key]), _gsm8k_answer(raw), raw))
    return out


def load_problems(task, split: str) -> List[Problem]:
    """Problems of ``split`` for a task config section (``type`` ``arithmetic`` or ``jsonl``)."""
    if task.type == "arithmetic":
        num = task.num_train if split == "train" else task.num_test
        return arithmetic_problems(split, num, task.seed, task.max_operand, task.num_operands,
                                   no_carry=task.no_carry)
    path = task.path if split == "train" else (task.test_path or task.path)
    return load_jsonl(path, task.question_key, task.answer_key,
                      task.num_train if split == "train" else task.num_test)


def format_prompt(tokenizer, task, question: str) -> List[int]:
    """Token ids of ``question`` formatted by ``task.prompt_format`` (and the tokenizer's chat
    template as one user message when ``task.use_chat_template``)."""
    text = task.prompt_format.format(question=question)
    if task.use_chat_template:
        text = tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                             add_generation_prompt=True)
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def corpus_text(problems: List[Problem], prompt_format: str) -> List[str]:
    """Prompt + solution strings (the text a tiny tokenizer is trained on)."""
    return [prompt_format.format(question=p.question) + p.solution for p in problems]
