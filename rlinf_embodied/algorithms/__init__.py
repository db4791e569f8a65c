"""RL algorithm math as small registered pure tensor functions.

Importing this package registers every built-in estimator, loss and filter:

- advantages (``algorithm.advantage``): ``gae``, ``grpo``, ``reinforce_pp``, each
  ``fn(RolloutBatch, AlgorithmConfig) -> Advantages``;
- losses (``algorithm.loss``): ``ppo``, ``fn(LossBatch, AlgorithmConfig) -> (loss, metrics)``;
- losses from dapo.py: ``ppo_token`` (per response token, DAPO clip-higher and loss
  aggregation), on a :class:`~rlinf_embodied.algorithms.dapo.TokenLossBatch`;
- filters: ``dynamic_sampling``, ``nonuniform_groups`` and ``complete`` (DAPO).
"""

from rlinf_embodied.algorithms import advantages, dapo, filters, losses  # noqa: F401  (registration)
from rlinf_embodied.algorithms.advantages import gae, grpo, reinforce_pp
from rlinf_embodied.algorithms.batch import Advantages, LossBatch, RolloutBatch
from rlinf_embodied.algorithms.filters import dynamic_sampling
from rlinf_embodied.algorithms.losses import k3_kl, ppo_loss, ppo_objective, ppo_policy_loss, value_loss
from rlinf_embodied.algorithms.registry import (
    advantage_names,
    filter_names,
    get_advantage,
    get_filter,
    get_loss,
    loss_names,
    register_advantage,
    register_filter,
    register_loss,
)

__all__ = [
    "Advantages",
    "LossBatch",
    "RolloutBatch",
    "ppo_objective",
    "advantage_names",
    "dynamic_sampling",
    "filter_names",
    "gae",
    "get_advantage",
    "get_filter",
    "get_loss",
    "grpo",
    "k3_kl",
    "loss_names",
    "ppo_loss",
    "ppo_policy_loss",
    "register_advantage",
    "register_filter",
    "register_loss",
    "reinforce_pp",
    "value_loss",
]
