"""``--obs-mode auto`` of ``rlinf-embodied eval``: a language-conditioned ManiSkill suite gives
camera images only, so even the random policy is evaluated on rgb observations there (it was
given ``state``, which the suite's env config refuses)."""

from __future__ import annotations

from rlinf_embodied.eval.families import auto_obs_mode
from rlinf_embodied.eval.request import EvalRequest


def test_a_maniskill_suite_is_evaluated_on_rgb_and_a_single_task_random_policy_on_state():
    assert auto_obs_mode(EvalRequest(env="maniskill", policy="random",
                                     suite="maniskill_lang3_peg")) == "rgb"
    assert auto_obs_mode(EvalRequest(env="maniskill", policy="random",
                                     task="PushCube-v1")) == "state"
