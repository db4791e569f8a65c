"""rlinf_embodied.policies: the policy contract, the registry and checkpoints.

Importing this package does not import any policy implementation; ``build_policy`` and
``load_policy`` import the class of a ``policy.type`` on first use.
"""

from rlinf_embodied.policies.base import (
    GREEDY,
    SAMPLE,
    ActionOutput,
    Evaluation,
    Policy,
    SpaceSpec,
)
from rlinf_embodied.policies.registry import (
    PolicyCheckpointError,
    build_policy,
    check_checkpoint,
    load_policy,
    policy_class,
    policy_types,
    register_policy,
    save_policy,
)

__all__ = [
    "GREEDY",
    "SAMPLE",
    "ActionOutput",
    "Evaluation",
    "Policy",
    "PolicyCheckpointError",
    "SpaceSpec",
    "build_policy",
    "check_checkpoint",
    "load_policy",
    "policy_class",
    "policy_types",
    "register_policy",
    "save_policy",
]
