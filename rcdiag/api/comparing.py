"""``rcdiag.compare.compare`` and ``compare_many``: the dumps analysed through one engine configuration (each keeping
its responses' sums for the significance tests), then compared (``rcdiag.compare``; docs/compare.md)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rcdiag.api.analysis import analyze
from rcdiag.api.progress import ProgressCallback
from rcdiag.compare import check_temperature, compare_against, compare_reports
from rcdiag.compare.records import Comparison, Comparisons
from rcdiag.runtime.errors import ConfigError
from rcdiag.settings.correction import CorrectionConfig
from rcdiag.settings.reading import ReadOptions

if TYPE_CHECKING:
    from rcdiag.frameworks.registry import Chosen


def compare(
    path_a: str | Path,
    path_b: str | Path,
    config: CorrectionConfig | None = None,
    read: ReadOptions | None = None,
    *,
    read_b: ReadOptions | None = None,
    temperature_a: float | None = None,
    temperature_b: float | None = None,
    on_chunk: ProgressCallback | None = None,
    framework: str | Chosen | None = None,
    framework_options: Mapping[str, Any] | Sequence[str] = (),
    **options: Any,
) -> Comparison:
    """Analyse both dumps with ``config`` and compare them.

    ``read`` (with any ``ReadOptions`` field given as a keyword on top) says how to read both dumps; ``read_b``,
    when given, replaces it for B (two dumps with different column names). Temperatures given here are used
    instead of the dumps' ``temperature`` metadata; a disagreement is reported as a finding. ``framework`` (and its
    ``framework_options``): both sides computed ``--as`` it, as ``rcdiag.analyze`` takes them: its keys compared
    beside verl's, each side's prescription in its settings. Raises ``ConfigError`` for a bad temperature and the
    errors of ``rcdiag.analyze`` for bad inputs.
    """
    for name, value in (("temperature_a", temperature_a), ("temperature_b", temperature_b)):
        check_temperature(value, name)
    config = config or CorrectionConfig()
    config.resolve()
    read = ReadOptions.of(read, options)
    from rcdiag.sections.units import UnitsSection

    units = (UnitsSection(),)  # each response's sums, for the significance tests
    chosen = _chosen(framework, framework_options)
    report_a = analyze(path_a, config, read, on_chunk=on_chunk, sections=units, framework=chosen)
    report_b = analyze(path_b, config, read_b or read, on_chunk=on_chunk, sections=units, framework=chosen)
    return compare_reports(report_a, report_b, temperature_a=temperature_a, temperature_b=temperature_b)


def compare_many(
    paths: Sequence[str | Path],
    config: CorrectionConfig | None = None,
    read: ReadOptions | None = None,
    *,
    baseline: int = 0,
    reads: Sequence[ReadOptions | None] = (),
    temperatures: Sequence[float | None] = (),
    on_chunk: ProgressCallback | None = None,
    framework: str | Chosen | None = None,
    framework_options: Mapping[str, Any] | Sequence[str] = (),
    **options: Any,
) -> Comparisons:
    """Every dump against ``paths[baseline]``, each dump read once. ``reads``/``temperatures``, where given, apply
    per dump (by position); the tests' p-values are Holm-adjusted over the comparisons, per metric. ``framework``:
    every dump computed ``--as`` it (``compare``)."""
    from rcdiag.sections.units import UnitsSection

    if len(paths) < 2:
        raise ConfigError("compare needs at least two dumps.")
    if not 0 <= baseline < len(paths):
        raise ConfigError(f"the baseline must be one of the {len(paths)} dumps given.")
    for i, value in enumerate(temperatures):
        check_temperature(value, f"temperature of dump {i + 1}")
    config = config or CorrectionConfig()
    config.resolve()
    read = ReadOptions.of(read, options)
    given = [*reads, *[None] * (len(paths) - len(reads))]
    chosen = _chosen(framework, framework_options)
    reports = [
        analyze(path, config, given[i] or read, on_chunk=on_chunk, sections=(UnitsSection(),), framework=chosen)
        for i, path in enumerate(paths)
    ]
    return compare_against(reports, baseline, temperatures)


def _chosen(framework: str | Chosen | None, options: Mapping[str, Any] | Sequence[str]) -> Chosen | None:
    """The framework both sides are computed ``--as`` (checked once, before either dump is read)."""
    if framework is None and not options:
        return None
    from rcdiag.frameworks.registry import Chosen, choose

    return framework if isinstance(framework, Chosen) else choose(framework or "verl", options)
