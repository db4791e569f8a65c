"""Denoising as a chain of Gaussian transitions, and its log-probs (πRL, arXiv 2510.25889).

Flow matching samples an action chunk by integrating dx/dt = v(x, t) from t = 1 (noise) to t = 0
with N Euler steps on the grid t_j = 1 - j / N (j = 0..N-1), t_N = 0, step delta_j = t_j -
t_{j+1}. Deterministically (the ODE, ``greedy``) ``x_{j+1} = x_j - delta_j v_j``. For RL each
step becomes a Gaussian transition ``x_{j+1} ~ N(mean_j, std_j^2)``:

* **Flow-SDE**: the SDE with the same marginals as the ODE, noise sigma_j = a sqrt(t_j / (1 - t_j))
  (a = ``noise_level``; at t_0 = 1 the denominator uses t_1, as RLinf does), gives
  ``mean_j = x_j - delta_j v_j - sigma_j^2 delta_j / (2 t_j) * (x_j + (1 - t_j) v_j)`` and
  ``std_j = sqrt(delta_j) sigma_j``. Each sample draws one step k uniformly; only that step is
  stochastic (the others follow the ODE) and the log-prob of x_{k+1} given x_k is the action's.
* **Flow-Noise**: every step keeps the ODE mean and adds a learned std (the :class:`NoiseHead`
  on the expert's outputs, clamped to [std_min, std_max]); the log-prob is the mean over the
  initial noise (standard normal) and all N transitions.
* **A learned initial noise** (``x0_dist``, :class:`InitialNoiseHead`, either method): x_0 ~
  N(mean, std^2) from the observation instead of N(0, I), and its log-prob is part of the
  chain's (added to Flow-SDE's step, in place of Flow-Noise's N(0, I) term).

Log-probs are per element of the chunk; the policy keeps the first K actions and A dims (what
is executed), as RLinf does. Everything here is a pure function of its inputs, so the rollout
and the recomputation in ``evaluate`` run the same operations and agree exactly.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

__all__ = [
    "DenoiseResult",
    "InitialNoiseHead",
    "NoiseHead",
    "chain_logprob",
    "denoise",
    "gaussian_entropy",
    "gaussian_logprob",
    "sde_sigmas",
    "time_grid",
    "transition",
]

VelocityFn = Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]
"""``(x_t (B, H, D), t (B,)) -> (v_t (B, H, D), expert hidden (B, H, We))``."""


def time_grid(num_steps: int, device: torch.device | None = None) -> torch.Tensor:
    """(N + 1,) float32 times ``1, 1 - 1/N, ..., 1/N, 0`` (openpi's Euler loop)."""
    head = torch.linspace(1.0, 1.0 / num_steps, num_steps, device=device)
    return torch.cat([head, torch.zeros(1, device=device)])


def sde_sigmas(grid: torch.Tensor, noise_level: float) -> torch.Tensor:
    """(N,) Flow-SDE noise sigma_j = a sqrt(t_j / (1 - t_j)); t_0 = 1 uses 1 - t_1 below."""
    denom = torch.where(grid == 1, grid[1], grid)
    return noise_level * torch.sqrt(grid / (1 - denom))[:-1]


class NoiseHead(nn.Module):
    """Flow-Noise's learned std: expert output (B, H, We) -> std (B, H, D) in [min, max].

    ``Linear -> tanh -> Linear -> tanh -> Linear`` (hidden 128, 64, as RLinf's ExploreNoiseNet);
    the output's tanh maps linearly onto [log min^2, log max^2] as a log-variance.
    """

    def __init__(self, in_dim: int, out_dim: int, std_min: float, std_max: float):
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(in_dim, 128), nn.Tanh(), nn.Linear(128, 64), nn.Tanh(),
                                 nn.Linear(64, out_dim))
        self.register_buffer("logvar_range", torch.tensor([math.log(std_min**2), math.log(std_max**2)]))

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """(B, H, We) -> (B, H, D) float32 std."""
        u = torch.tanh(self.mlp(hidden.to(self.mlp[0].weight.dtype)).float())
        lo, hi = self.logvar_range[0], self.logvar_range[1]
        return torch.exp(0.5 * (lo + (hi - lo) * (u + 1) / 2))


class InitialNoiseHead(nn.Module):
    """The learned initial-noise distribution: pooled prefix (B, W) -> mean, std (B, H, D).

    ``Linear(W, 128) -> GELU -> Linear(128, 2 H D)``, float32, times ``gain`` (the head's
    learning-rate multiplier: ``policy.initial_noise_gain``); the last layer starts at zero, so
    the distribution starts at N(0, I) (the flow's prior) and the policy's samples are those of
    the SFT checkpoint until RL moves it. The log-std is clamped to [-5, 1]: std in
    [0.0067, 2.7].
    """

    def __init__(self, in_dim: int, horizon: int, action_dim: int, gain: float = 5.0):
        super().__init__()
        self.shape, self.gain = (horizon, action_dim), float(gain)
        self.fc1 = nn.Linear(in_dim, 128)
        self.fc2 = nn.Linear(128, 2 * horizon * action_dim)
        nn.init.zeros_(self.fc2.weight)
        nn.init.zeros_(self.fc2.bias)

    def forward(self, pooled: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, W) any float dtype -> (mean, std), each (B, H, D) float32."""
        out = self.gain * self.fc2(nn.functional.gelu(self.fc1(pooled.to(self.fc1.weight.dtype)))).float()
        mean, log_std = out.view(pooled.shape[0], 2, *self.shape).unbind(1)
        return mean, torch.exp(log_std.clamp(-5.0, 1.0))


def transition(x: torch.Tensor, v: torch.Tensor, t: torch.Tensor, delta: torch.Tensor,
               sigma: torch.Tensor | None) -> torch.Tensor:
    """Mean of x_{j+1} given x_j: the Euler step, plus the Flow-SDE drift when ``sigma`` is set.

    Args:
        x, v: (B, H, D) float32 state and velocity; t, delta: (B,) time and step;
        sigma: (B,) SDE noise or None (ODE / Flow-Noise mean).
    """
    t3, d3 = t[:, None, None], delta[:, None, None]
    mean = x - d3 * v
    if sigma is not None:
        s2 = (sigma**2)[:, None, None]
        mean = mean - s2 * d3 / (2 * t3) * (x + (1 - t3) * v)
    return mean


def gaussian_logprob(x: torch.Tensor, mean: torch.Tensor, std: torch.Tensor) -> torch.Tensor:
    """Elementwise log N(x; mean, std^2)."""
    return -torch.log(std) - 0.5 * math.log(2 * math.pi) - 0.5 * ((x - mean) / std) ** 2


def gaussian_entropy(std: torch.Tensor) -> torch.Tensor:
    """Elementwise entropy 0.5 log(2 pi e std^2)."""
    return 0.5 * math.log(2 * math.pi * math.e) + torch.log(std)


@dataclass
class DenoiseResult:
    """One batch of denoising (leading dim B).

    Attributes:
        chain: (B, N + 1, H, D) float32 states x_0 (the initial noise) .. x_N (the actions).
        index: (B,) int64 Flow-SDE step of each sample (-1 for the ODE and Flow-Noise).
        logprob: (B, H, D) log-prob (zeros for the ODE).
        entropy: (B, H, D) entropy of the same transitions.
    """

    chain: torch.Tensor
    index: torch.Tensor
    logprob: torch.Tensor
    entropy: torch.Tensor

    @property
    def actions(self) -> torch.Tensor:
        """(B, H, D) the final state of the chain."""
        return self.chain[:, -1]


def denoise(velocity: VelocityFn, x0: torch.Tensor, num_steps: int, method: str,
            noise_level: float = 0.5, noise_head: NoiseHead | None = None,
            index: torch.Tensor | None = None,
            x0_dist: tuple[torch.Tensor, torch.Tensor] | None = None) -> DenoiseResult:
    """Integrate from ``x0`` with N steps; ``method`` ``ode``, ``flow_sde`` or ``flow_noise``.

    Args:
        velocity: the expert (see :data:`VelocityFn`).
        x0: (B, H, D) initial noise.
        num_steps: N.
        method: ``ode`` (deterministic), ``flow_sde`` or ``flow_noise``.
        noise_level: Flow-SDE a.
        noise_head: Flow-Noise std head.
        index: (B,) Flow-SDE steps; None draws them uniformly (torch's global generator, like
            the transition noise).
        x0_dist: (mean, std), each (B, H, D), of the learned distribution ``x0`` was drawn
            from (:class:`InitialNoiseHead`); None: N(0, I), unscored by Flow-SDE.

    Returns:
        A :class:`DenoiseResult`.
    """
    b, dev = x0.shape[0], x0.device
    grid = time_grid(num_steps, dev)
    x = x0.float()
    chain, logps, ents = [x], [], []
    if method == "flow_sde" and index is None:
        index = torch.randint(0, num_steps, (b,), device=dev)
    if method != "ode" and (method == "flow_noise" or x0_dist is not None):
        lp0, ent0 = _initial_terms(x, x0_dist)
        logps.append(lp0)
        ents.append(ent0)
    sigmas = sde_sigmas(grid, noise_level) if method == "flow_sde" else None
    zero = torch.zeros_like(x)
    for j in range(num_steps):
        t, delta = grid[j].expand(b), (grid[j] - grid[j + 1]).expand(b)
        v, hidden = velocity(x, t)
        if method == "flow_sde":
            pick = (index == j)[:, None, None]
            sigma = sigmas[j].expand(b)
            mean = torch.where(pick, transition(x, v, t, delta, sigma), transition(x, v, t, delta, None))
            std = torch.where(pick, (delta.sqrt() * sigma)[:, None, None].expand_as(x), zero)
        elif method == "flow_noise":
            mean, std = transition(x, v, t, delta, None), noise_head(hidden)
        else:
            mean, std = transition(x, v, t, delta, None), zero
        x_next = mean + std * torch.randn_like(x) if method != "ode" else mean
        if method == "flow_noise":
            logps.append(gaussian_logprob(x_next, mean, std))
            ents.append(gaussian_entropy(std))
        elif method == "flow_sde":
            safe = torch.where(pick, std, torch.ones_like(std))
            logps.append(torch.where(pick, gaussian_logprob(x_next, mean, safe), zero))
            ents.append(torch.where(pick, gaussian_entropy(safe), zero))
        chain.append(x_next)
        x = x_next
    if method == "ode":
        logp = ent = zero
        index = torch.full((b,), -1, dtype=torch.long, device=dev)
    elif method == "flow_sde":
        # one non-zero step term (plus x_0's with a learned initial noise)
        logp, ent = torch.stack(logps).sum(0), torch.stack(ents).sum(0)
    else:
        logp, ent = torch.stack(logps).mean(0), torch.stack(ents).mean(0)
        index = torch.full((b,), -1, dtype=torch.long, device=dev)
    return DenoiseResult(torch.stack(chain, dim=1), index, logp, ent)


def _initial_terms(x0: torch.Tensor, x0_dist: tuple[torch.Tensor, torch.Tensor] | None
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-prob and entropy (B, H, D) of the initial noise: under ``x0_dist`` or N(0, I)."""
    mean, std = x0_dist if x0_dist is not None else (torch.zeros_like(x0), torch.ones_like(x0))
    return gaussian_logprob(x0, mean, std), gaussian_entropy(std)


def chain_logprob(velocity: VelocityFn, chain: torch.Tensor, index: torch.Tensor, method: str,
                  noise_level: float = 0.5, noise_head: NoiseHead | None = None,
                  x0_dist: tuple[torch.Tensor, torch.Tensor] | None = None
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """Recompute the log-prob and entropy (B, H, D) of a stored chain (with gradient).

    Flow-SDE evaluates only each sample's step ``index`` (one expert pass at per-sample times);
    Flow-Noise re-runs every step. The operations are those of :func:`denoise`, so with the
    same weights and batch the values are identical.

    Args:
        chain: (B, N + 1, H, D) from :attr:`DenoiseResult.chain`; index: (B,) Flow-SDE steps;
        x0_dist: as :func:`denoise`'s.
    """
    b, steps = chain.shape[0], chain.shape[1] - 1
    grid = time_grid(steps, chain.device)
    rows = torch.arange(b, device=chain.device)
    if method == "flow_sde":
        x, x_next = chain[rows, index], chain[rows, index + 1]
        t, delta = grid[index], grid[index] - grid[index + 1]
        v, _ = velocity(x, t)
        sigma = sde_sigmas(grid, noise_level)[index]
        mean = transition(x, v, t, delta, sigma)
        std = (delta.sqrt() * sigma)[:, None, None].expand_as(x)
        # The same elementwise ops as the rollout's torch.where over (step == index).
        zero = torch.zeros_like(x)
        lp, ent = zero + gaussian_logprob(x_next, mean, std), zero + gaussian_entropy(std)
        if x0_dist is None:
            return lp, ent
        lp0, ent0 = _initial_terms(chain[:, 0], x0_dist)  # summed in the rollout's order
        return torch.stack([lp0, lp]).sum(0), torch.stack([ent0, ent]).sum(0)
    if method != "flow_noise":
        raise ValueError(f"Cannot score a chain sampled with {method!r}; use flow_sde or flow_noise.")
    lp0, ent0 = _initial_terms(chain[:, 0], x0_dist)
    logps, ents = [lp0], [ent0]
    for j in range(steps):
        t, delta = grid[j].expand(b), (grid[j] - grid[j + 1]).expand(b)
        v, hidden = velocity(chain[:, j], t)
        std = noise_head(hidden)
        logps.append(gaussian_logprob(chain[:, j + 1], transition(chain[:, j], v, t, delta, None), std))
        ents.append(gaussian_entropy(std))
    return torch.stack(logps).mean(0), torch.stack(ents).mean(0)
