"""The wall-time budget of a run (``trainer.max_time_s``), shared by the embodied and the
reasoning runners."""

from __future__ import annotations

from typing import Optional

__all__ = ["over_budget"]


def over_budget(elapsed_s: float, last_iteration_s: float, max_time_s: Optional[float],
                due_s: float = 0.0) -> bool:
    """Whether the run should stop now rather than start another iteration.

    Args:
        elapsed_s: seconds since the run started (or resumed).
        last_iteration_s: seconds the iteration just finished took: the forecast of the next.
        max_time_s: the budget in seconds; None or 0: no budget.
        due_s: seconds of work due before the next iteration starts (an in-training
            evaluation, forecast by the last one's time).

    Returns:
        True when the next iteration would end past ``max_time_s``.
    """
    return bool(max_time_s) and elapsed_s + due_s + last_iteration_s > max_time_s
