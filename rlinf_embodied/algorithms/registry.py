"""Name -> function registries for advantage estimators, losses and batch filters.

Algorithm math lives in small pure tensor functions (``advantages.py``, ``losses.py``,
``filters.py``); each registers itself under the name a config uses
(``algorithm.advantage: gae``, ``algorithm.loss: ppo``). The training code looks the function
up by that name and never branches on it.

One signature per kind (:mod:`rlinf_embodied.algorithms.batch`)::

    from rlinf_embodied.algorithms import RolloutBatch, get_advantage, get_loss
    adv = get_advantage(cfg.algorithm.advantage)(RolloutBatch.from_trajectories(traj), cfg.algorithm)
    loss, metrics = get_loss(cfg.algorithm.loss)(loss_batch, cfg.algorithm)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

F = TypeVar("F", bound=Callable)

__all__ = [
    "advantage_names",
    "filter_names",
    "get_advantage",
    "get_filter",
    "get_loss",
    "loss_names",
    "register_advantage",
    "register_filter",
    "register_loss",
]


class _Registry:
    """Name -> function table of one kind (``kind`` and ``config_key`` go into errors)."""

    def __init__(self, kind: str, config_key: str):
        self.kind = kind
        self.config_key = config_key
        self._fns: dict[str, Callable] = {}

    def register(self, name: str) -> Callable[[F], F]:
        """Decorator registering ``fn`` as ``name``.

        Raises:
            ValueError: if ``name`` is already registered to another function.
        """

        def deco(fn: F) -> F:
            if name in self._fns and self._fns[name] is not fn:
                raise ValueError(
                    f"{self.kind} {name!r} is already registered (by "
                    f"{self._fns[name].__module__}.{self._fns[name].__qualname__}); "
                    "pick another name."
                )
            self._fns[name] = fn
            return fn

        return deco

    def get(self, name: str) -> Callable:
        """The function registered as ``name``.

        Raises:
            ValueError: for an unknown name; the message lists the valid ones.
        """
        if name not in self._fns:
            import difflib

            lower = {n.lower(): n for n in self.names()}
            close = ([lower[str(name).lower()]] if str(name).lower() in lower else
                     difflib.get_close_matches(str(name), self.names(), n=1, cutoff=0.5))
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise ValueError(
                f"Unknown {self.kind} {name!r}.{hint} Valid {self.kind} names: "
                f"{', '.join(self.names())}. Set {self.config_key} to one of them."
            )
        return self._fns[name]

    def names(self) -> list[str]:
        """Sorted registered names."""
        return sorted(self._fns)


_ADVANTAGES = _Registry("advantage", "algorithm.advantage")
_LOSSES = _Registry("loss", "algorithm.loss")
_FILTERS = _Registry("filter", "the filter name")

# Advantage estimators: ``fn(RolloutBatch, AlgorithmConfig) -> Advantages``.
register_advantage = _ADVANTAGES.register
get_advantage = _ADVANTAGES.get
advantage_names = _ADVANTAGES.names

# Losses: ``fn(LossBatch, AlgorithmConfig) -> (loss scalar, metrics dict)``.
register_loss = _LOSSES.register
get_loss = _LOSSES.get
loss_names = _LOSSES.names

# Batch filters: ``fn(...) -> keep mask``.
register_filter = _FILTERS.register
get_filter = _FILTERS.get
filter_names = _FILTERS.names
