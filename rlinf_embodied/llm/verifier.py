"""Rule-based reward: is the response's final answer equal to the reference? (math-verify)

The reference answer and the response are both parsed by ``math_verify.parse`` (LaTeX such as
``\\boxed{42}`` or ``\\frac{1}{2}``, and plain expressions / numbers), and compared with
``math_verify.verify`` (symbolic equality). Reward 1.0 for a match, else 0.0 (the 0/1 outcome
reward of DeepSeekMath / veRL's GSM8K quickstart, REFERENCE.md "Reasoning RL reference points").
"""

from __future__ import annotations

from typing import List

__all__ = ["verify", "verify_batch"]

_GOLD_CFG = None
_PRED_CFG = None


def _configs():
    global _GOLD_CFG, _PRED_CFG
    if _GOLD_CFG is None:
        import logging

        # Timeouts are off: math-verify's are signal-based and need the main thread, which a
        # Ray worker's call lane is not; it warns about that on every call.
        logging.getLogger("math_verify").setLevel(logging.ERROR)
        from math_verify import ExprExtractionConfig, LatexExtractionConfig

        _GOLD_CFG = [LatexExtractionConfig(), ExprExtractionConfig()]
        _PRED_CFG = [LatexExtractionConfig(boxed_match_priority=0), ExprExtractionConfig()]
    return _GOLD_CFG, _PRED_CFG


def verify(response: str, answer: str) -> float:
    """1.0 if the final answer in ``response`` equals ``answer`` (symbolically), else 0.0.

    Args:
        response: generated text (may contain reasoning before the answer).
        answer: reference answer (``"18"``, ``"\\frac{1}{2}"``, ``"$x^2$"``).
    """
    from math_verify import parse
    from math_verify import verify as mv_verify

    gold_cfg, pred_cfg = _configs()
    if not response.strip():
        return 0.0
    gold = parse(answer if "$" in answer or "\\" in answer else f"${answer}$",
                 extraction_config=gold_cfg, parsing_timeout=None)
    pred = parse(response, extraction_config=pred_cfg, parsing_timeout=None)
    if not gold or not pred:
        return 0.0
    return 1.0 if mv_verify(gold, pred, timeout_seconds=None) else 0.0


def verify_batch(responses: List[str], answers: List[str]) -> List[float]:
    """:func:`verify` over pairs (B responses, B answers) -> B rewards in {0.0, 1.0}."""
    if len(responses) != len(answers):
        raise ValueError(f"got {len(responses)} responses but {len(answers)} answers.")
    return [verify(r, a) for r, a in zip(responses, answers)]
