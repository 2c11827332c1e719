"""Student's t tails and critical values against published tables."""

from __future__ import annotations

import math

import pytest

from rcdiag.core.stats import regularized_beta, t_critical, t_two_sided_tail


@pytest.mark.parametrize(
    ("tail", "dof", "table"),
    [(0.05, 1, 12.7062), (0.01, 30, 2.7500), (0.001, 10, 4.5869), (0.05, 5, 2.5706), (1e-4, 10, 6.2111)],
)
def test_critical_values_match_the_tables(tail: float, dof: float, table: float) -> None:
    assert t_critical(tail, dof) == pytest.approx(table, abs=1e-3)


def test_tail_closed_forms() -> None:
    # dof 1 is Cauchy: P(|T| > t) = 1 - 2 atan(t) / pi; dof 2: P(|T| > t) = 1 - t / sqrt(2 + t^2)
    for t in (0.1, 1.0, 7.5, 300.0):
        assert t_two_sided_tail(t, 1) == pytest.approx(1 - 2 * math.atan(t) / math.pi, rel=1e-10)
        assert t_two_sided_tail(t, 2) == pytest.approx(1 - t / math.sqrt(2 + t * t), rel=1e-10)
    assert t_two_sided_tail(3.0, 1e8) == pytest.approx(math.erfc(3.0 / math.sqrt(2)), rel=1e-6)
    assert regularized_beta(2.0, 3.0, 0.0) == 0.0 and regularized_beta(2.0, 3.0, 1.0) == 1.0
    assert regularized_beta(1.0, 1.0, 0.3) == pytest.approx(0.3)  # uniform


@pytest.mark.parametrize("tail", [0.3, 0.05, 1e-3, 1e-6, 1e-9])
@pytest.mark.parametrize("dof", [1.0, 2.0, 3.7, 30.0, 1e4])
def test_critical_value_inverts_the_tail(tail: float, dof: float) -> None:
    t = t_critical(tail, dof)
    assert t_two_sided_tail(t, dof) == pytest.approx(tail, rel=1e-9)
    if dof == 1.0:  # Cauchy: t = tan(pi (1 - tail) / 2) = 1 / tan(pi tail / 2)
        assert t == pytest.approx(1 / math.tan(math.pi * tail / 2), rel=1e-9)
    if dof == 2.0:  # 1 - t / sqrt(2 + t^2) = tail
        assert t == pytest.approx(math.sqrt(2) * (1 - tail) / math.sqrt(tail * (2 - tail)), rel=1e-9)
