"""``rcdiag.check.check``: a dump (and a baseline, read the same way) analysed, the rules (``rcdiag.check``)
evaluated on its report for a CI gate (docs/check.md)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import rcdiag.io.outputs as outputs
from rcdiag.api.analysis import analyze
from rcdiag.api.progress import ProgressCallback
from rcdiag.check import BASELINE_INPUT
from rcdiag.check.evaluate import evaluate_rules
from rcdiag.check.findings_gate import FindingGate
from rcdiag.check.metric_names import metric_names, refuse_unlogged, validate_rules
from rcdiag.check.results import CheckResult
from rcdiag.check.rules import Rule
from rcdiag.explain.section import ExplainSection
from rcdiag.runtime.errors import ConfigError
from rcdiag.settings.correction import CorrectionConfig
from rcdiag.settings.reading import ReadOptions

if TYPE_CHECKING:
    from rcdiag.frameworks.registry import Chosen


def check(
    path: str | Path,
    rules: Sequence[Rule],
    config: CorrectionConfig | None = None,
    read: ReadOptions | None = None,
    *,
    baseline: str | Path | None = None,
    on_chunk: ProgressCallback | None = None,
    fail_on: FindingGate | None = None,
    framework: Chosen | None = None,
    exact: bool = False,
    **options: Any,
) -> CheckResult:
    """Analyse ``path`` (and ``baseline``, read the same way) with ``config`` and evaluate ``rules``.

    Rules are validated against the configuration before any file is read: a rule on a metric the configuration
    does not compute raises ``ConfigError`` listing the available names (rule-pack rules are skipped instead).
    ``read`` and the keyword ``ReadOptions`` fields say how to read the dumps, as for ``rcdiag.analyze``.
    ``fail_on`` also fails the check on the dump's findings (``FindingGate``; a named ``--explain`` code runs
    analyze's explain detectors). ``framework`` (``--as NAME``): its keys may be named by rules too (in full:
    ``sampling/importance_sampling_ratio/mean``); ``--as verl``'s options are put on ``config``.
    ``exact`` also fails it unless the two log-prob columns are bitwise identical at every valid token
    (``CheckResult.exact_failure`` names the first differing response and position).
    """
    if not rules and fail_on is None and not exact:
        raise ConfigError(
            "no rules to check: give --max/--min/--max-abs NAME=VALUE, --pack NAME, --fail-on SEVERITY|CODES, "
            "--exact, --rules FILE, or a [tool.rcdiag.check] table in pyproject.toml."
        )
    rules = list(dict.fromkeys(rules))  # an identical rule (same metric, bound, mode, source) is checked once
    riding = None
    if framework is not None:
        config, riding = framework.split(config)
    config = config or CorrectionConfig()
    resolved = config.resolve()
    available = [*(riding.keys() if riding is not None else []), *metric_names(resolved)]
    if riding is not None:
        refuse_unlogged(rules, riding)
    validate_rules(rules, available, has_baseline=baseline is not None)
    outputs.reads(path)  # both dumps are the run's inputs before either is read (rcdiag.io.outputs.Ledger)
    outputs.reads(baseline, what=BASELINE_INPUT)
    read = ReadOptions.of(read, options)
    explaining = [ExplainSection()] if fail_on is not None and fail_on.explain else []
    report = analyze(path, config, read, sections=explaining, on_chunk=on_chunk, framework=riding)
    base = analyze(baseline, config, read, on_chunk=on_chunk, framework=riding) if baseline is not None else None
    return CheckResult(report, base, evaluate_rules(report, rules, base), fail_on, exact)
