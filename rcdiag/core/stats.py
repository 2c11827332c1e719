"""Student's t tail and critical values, for noise tests on few (or unequal) responses, without scipy; the cluster
variance of a ratio of per-response sums (responses as the units).

The two-sided tail is P(|T_nu| > t) = I_x(nu/2, 1/2) with x = nu / (nu + t^2), the regularized incomplete beta
function, evaluated by Lentz's continued fraction (Numerical Recipes, ``betacf``); the critical value is found by
safeguarded Newton steps on that tail.
"""

from __future__ import annotations

import math

import numpy as np

_TINY = 1e-300


def _beta_fraction(a: float, b: float, x: float) -> float:
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > _TINY else _TINY)
    h = d
    for m in range(1, 1000):
        for aa in (
            m * (b - m) * x / ((qam + 2 * m) * (a + 2 * m)),
            -(a + m) * (qab + m) * x / ((a + 2 * m) * (qap + 2 * m)),
        ):
            d = 1.0 + aa * d
            d = 1.0 / (d if abs(d) > _TINY else _TINY)
            c = 1.0 + aa / c
            c = c if abs(c) > _TINY else _TINY
            h *= d * c
        if abs(d * c - 1.0) < 1e-15:
            break
    return h


def regularized_beta(a: float, b: float, x: float) -> float:
    """I_x(a, b) for a, b > 0 and 0 <= x <= 1."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    log_front = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(log_front) * _beta_fraction(a, b, x) / a
    return 1.0 - math.exp(log_front) * _beta_fraction(b, a, 1.0 - x) / b


def t_two_sided_tail(t: float, dof: float) -> float:
    """P(|T| > t) for Student's t with ``dof`` degrees of freedom (any positive real)."""
    return regularized_beta(dof / 2.0, 0.5, dof / (dof + t * t))


def t_density(t: float, dof: float) -> float:
    """The density of Student's t with ``dof`` degrees of freedom at ``t``."""
    log_norm = math.lgamma((dof + 1.0) / 2.0) - math.lgamma(dof / 2.0) - 0.5 * math.log(dof * math.pi)
    return math.exp(log_norm - (dof + 1.0) / 2.0 * math.log1p(t * t / dof))


def t_critical(tail: float, dof: float) -> float:
    """The t with P(|T_dof| > t) = ``tail`` (two-sided): Newton's steps on the tail (its slope is twice the
    density), kept inside a bracket that shrinks with every evaluation, and bisection wherever a step would
    leave it. A handful of tail evaluations where bisection alone took some 45 (the report computes one per
    step)."""
    lo, hi = 0.0, 1.0
    while t_two_sided_tail(hi, dof) > tail:
        lo, hi = hi, hi * 2.0
    t = (lo + hi) / 2.0
    for _ in range(200):
        excess = t_two_sided_tail(t, dof) - tail
        if excess > 0:
            lo = t
        else:
            hi = t
        step = excess / (2.0 * t_density(t, dof))
        nxt = t + step
        if not lo < nxt < hi:
            nxt = (lo + hi) / 2.0
        if abs(nxt - t) <= 1e-13 * nxt or hi - lo <= 1e-13 * hi:
            return nxt
        t = nxt
    return t


def ratio_variance(tokens: np.ndarray, sums: np.ndarray, mean: float) -> float:
    """The squared cluster standard error of a ratio of sums, ``sum(sums) / sum(tokens)`` = ``mean``, with
    responses as the units (one entry each): the delta method's sum of squared residuals ``sums - mean * tokens``
    over ``sum(tokens)^2``, with the small-sample factor n / (n - 1)."""
    total = float(tokens.sum())
    n = tokens.size
    resid = sums - mean * tokens
    return float(np.sum(resid * resid)) / total**2 * n / max(n - 1, 1)
