"""Flow math over one-hot draft blocks, as pure functions (paper §2-3.1, App. A).

Shape letters: B = blocks in a batch, K = slots per block, V = draft vocabulary, D = embedding width.

The state x (B, K, V) moves from Gaussian noise x0 at t=0 to the one-hot block at t=1 along the
interpolant I_t = (1-t) x0 + t onehot (eq. 2). Networks predict the clean data on the simplex
(a softmax per slot), the two-time denoiser delta_{s,t} defines the flow map (eq. 5).
"""
from __future__ import annotations

import math
from functools import lru_cache

import torch

T_MAX = 1.0 - 1e-4  # times are clamped below 1 where a formula divides by (1 - t)


def interpolant(x0: torch.Tensor, tokens: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """I_t = (1-t) x0 + t onehot(tokens). x0 (B, K, V), tokens (B, K), t (B,) -> (B, K, V)."""
    t = t.view(-1, 1, 1)  # (B, 1, 1)
    onehot = torch.nn.functional.one_hot(tokens, x0.shape[-1]).to(x0)  # (B, K, V)
    return (1 - t) * x0 + t * onehot


def slot_weights(block_size: int, kappa: float = 7.0) -> torch.Tensor:
    """w_k = exp(-(k-1)/kappa), k = 1..K (§3.1, following DFlash): early slots matter most."""
    return torch.exp(-torch.arange(block_size, dtype=torch.float32) / kappa)  # (K,)


def decoding_error(t: torch.Tensor, vocab_size: int, nodes: int = 801) -> torch.Tensor:
    """P_e(t) = 1 - E_z[Phi(z + t/(1-t))^(V-1)] (eq. 6), by quadrature on a dense z grid."""
    t = t.double().clamp(0.0, T_MAX)
    z = torch.linspace(-10.0, 10.0, nodes, dtype=torch.float64)  # (Z,)
    density = torch.exp(-0.5 * z**2) / math.sqrt(2 * math.pi) * (z[1] - z[0])  # (Z,) quadrature weights
    shift = (t / (1 - t)).unsqueeze(-1)  # (..., 1)
    phi = 0.5 * (1 + torch.erf((z + shift) / math.sqrt(2)))  # (..., Z)
    correct = (torch.exp((vocab_size - 1) * torch.log(phi.clamp_min(1e-300))) * density).sum(-1)
    return (1 - correct).clamp_min(0.0)


@lru_cache(maxsize=16)
def _tau_table(vocab_size: int, points: int = 4097) -> tuple[torch.Tensor, torch.Tensor]:
    t_grid = torch.linspace(0.0, 1.0, points, dtype=torch.float64)  # (P,)
    err = decoding_error(t_grid, vocab_size)
    tau = 1 - err / err[0]
    tau[-1] = 1.0
    return t_grid, torch.cummax(tau, 0).values  # monotone by construction; cummax removes quadrature jitter


def tau_of_t(t: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """tau(t) = 1 - P_e(t)/P_e(0): the fraction of the initial decoding error removed by time t."""
    t_grid, tau = _tau_table(vocab_size)
    return _interp(t.double(), t_grid, tau).to(t.dtype)


def t_of_tau(tau: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Inverse of tau(t): training samples tau ~ U[0,1] and maps it back to t (§3.1)."""
    t_grid, tau_grid = _tau_table(vocab_size)
    return _interp(tau.double(), tau_grid, t_grid).to(tau.dtype)


def _interp(x: torch.Tensor, xs: torch.Tensor, ys: torch.Tensor) -> torch.Tensor:
    """Piecewise-linear interpolation of increasing xs -> ys."""
    idx = torch.searchsorted(xs, x.clamp(xs[0], xs[-1])).clamp(1, len(xs) - 1)
    x_lo, x_hi, y_lo, y_hi = xs[idx - 1], xs[idx], ys[idx - 1], ys[idx]
    frac = torch.where(x_hi > x_lo, (x - x_lo) / (x_hi - x_lo).clamp_min(1e-300), torch.zeros_like(x))
    return y_lo + frac * (y_hi - y_lo)


def time_grid(steps: int, vocab_size: int) -> torch.Tensor:
    """t_n = tau^{-1}(n/N), n = 0..N: equal progress in resolving tokens per step."""
    grid = t_of_tau(torch.linspace(0, 1, steps + 1, dtype=torch.float64), vocab_size).float()  # (N+1,)
    grid[-1] = 1.0  # tau saturates numerically before t = 1; the last jump must land on the data
    return grid


def posterior(x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """pi_t(x) = softmax(t x / (1-t)^2) per slot (eq. 8): the exact posterior over the clean token
    under a uniform prior, given the Gaussian-noised one-hot x. x (B, K, V), t (B,)."""
    t = t.clamp(0.0, T_MAX).view(-1, 1, 1)  # (B, 1, 1)
    return torch.softmax(t * x / (1 - t) ** 2, dim=-1)


def flow_map_step(x: torch.Tensor, delta: torch.Tensor, s: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """X_{s,t}(x) = (1-t)/(1-s) x + (t-s)/(1-s) delta (eq. 5). x, delta (B, K, V); s, t (B,)."""
    s, t = s.view(-1, 1, 1), t.view(-1, 1, 1)  # (B, 1, 1)
    one_minus_s = (1 - s).clamp_min(1 - T_MAX)
    return (1 - t) / one_minus_s * x + (t - s) / one_minus_s * delta


def semigroup_weight(s: torch.Tensor, u: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """lambda = (1-t)(u-s) / ((1-u)(t-s)) of eq. 7: how the split jump's two denoisers combine."""
    return (1 - t) * (u - s) / ((1 - u).clamp_min(1 - T_MAX) * (t - s).clamp_min(1e-6))


def euler_velocity(x: torch.Tensor, denoised: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """v_t(x) = (D_t(x) - x) / (1 - t) (eq. 3)."""
    return (denoised - x) / (1 - t.view(-1, 1, 1)).clamp_min(1 - T_MAX)
