"""``rcdiag check``: a CI gate."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from rcdiag.catalogue.metrics import packs_help
from rcdiag.cli.flags import AS_FLAGS, ENGINE_FLAGS, READ_FLAGS, given_path, output_flags, path_argument, path_option
from rcdiag.cli.params import checked_option, with_flags
from rcdiag.cli.rule_flags import bound_option, fail_on_option, pack_option, rules_option
from rcdiag.settings.rule_options import STEP_MODE, TOLERATE, is_step_mode

if TYPE_CHECKING:
    from rcdiag.check import CheckResult
    from rcdiag.cli.engine_config import EngineFlags
    from rcdiag.cli.output import Output
    from rcdiag.frameworks.registry import Chosen
    from rcdiag.settings.reading import ReadOptions

RULES = "Rules"
CI = "CI output"


@with_flags(ENGINE_FLAGS, AS_FLAGS, READ_FLAGS, output_flags("check", "check"))
def check(
    path: Annotated[str, path_argument("PATH", "The dump to check (a path or URL).")],
    max_rules: bound_option(  # type: ignore[valid-type]
        "--max", "Upper bound, e.g. `kl=2e-3` (short or full metric name). Repeatable.", RULES
    ) = None,
    min_rules: bound_option("--min", "Lower bound, e.g. `rollout_is_eff_sample_size=0.8`. Repeatable.", RULES) = None,  # type: ignore[valid-type]
    max_abs_rules: bound_option("--max-abs", "Bound on the absolute value, e.g. `kl=0.1`. Repeatable.", RULES) = None,  # type: ignore[valid-type]
    max_increase: bound_option(  # type: ignore[valid-type]
        "--max-increase",
        "At most this much above the baseline: `kl=50%` (of |baseline|) or `kl=abs:1e-4` (absolute; a bare "
        "number is refused). Needs `--baseline`. Repeatable.",
        RULES,
    ) = None,
    max_decrease: bound_option(  # type: ignore[valid-type]
        "--max-decrease",
        "At most this much below the baseline, e.g. `rollout_is_eff_sample_size=10%`. Needs `--baseline`.",
        RULES,
    ) = None,
    packs: pack_option(  # type: ignore[valid-type]
        f"Rule pack from documented practice: {packs_help()}; or `analyze`: fail on every finding "
        "analyze rates warning or error (as `--fail-on warning`). Rules on metrics the configuration does not "
        "compute are skipped. Repeatable.",
        RULES,
    ) = None,
    fail_on: fail_on_option(  # type: ignore[valid-type]
        "Also fail on analyze's findings: a severity (`warning`: any warning or error; `error`; `info`) "
        "and/or finding codes, comma-separated (`kl_k3_disagree,position_drift`; docs/findings.md). A code only "
        "`--explain` gives runs the explain detectors. Repeatable.",
        RULES,
    ) = None,
    exact: Annotated[
        bool,
        typer.Option(
            "--exact",
            help="Also fail unless the two log-prob columns are bitwise identical at every valid token (float32 bit "
            "patterns; deterministic or batch-invariant inference); the failure names the first differing response "
            "(row) and position.",
            rich_help_panel=RULES,
        ),
    ] = False,
    rules_file: rules_option(  # type: ignore[valid-type]
        "TOML rules: its `[tool.rcdiag.check]` table, or its top level (format: docs/check.md). "
        "Without it, `./pyproject.toml`'s `[tool.rcdiag.check]` is used when present.",
        RULES,
    ) = None,
    no_pyproject: Annotated[
        bool,
        typer.Option("--no-pyproject", help="Ignore `./pyproject.toml`.", rich_help_panel=RULES),
    ] = False,
    steps: Annotated[
        str,
        typer.Option(
            "--steps",
            metavar="MODE",
            **checked_option(STEP_MODE),
            help="Which steps a rule reads: `every` (each step must hold; a failure names the step), `last`, or "
            "`mean` (over steps). Rules files may set their own.",
            rich_help_panel=RULES,
        ),
    ] = "every",
    tolerate: Annotated[
        float,
        typer.Option(
            "--tolerate",
            metavar="FRACTION",
            **checked_option(TOLERATE),
            help="With `--steps every`: the fraction of steps allowed to fail (e.g. 0.1).",
            rich_help_panel=RULES,
        ),
    ] = 0.0,
    baseline: Annotated[
        str | None,
        typer.Option(
            "--baseline",
            metavar="FILE",
            help="The last good run, for `--max-increase`/`--max-decrease` (analysed with the same configuration).",
            rich_help_panel=RULES,
            show_default=False,
            callback=given_path,
        ),
    ] = None,
    junit: path_option(  # type: ignore[valid-type]
        "--junit", "Write a JUnit XML report (a testcase per rule, one per failing finding).", CI
    ) = None,
    markdown: path_option(  # type: ignore[valid-type]
        "--markdown", "Write a Markdown summary (appended when FILE is `$GITHUB_STEP_SUMMARY`).", CI
    ) = None,
    *,
    engine: EngineFlags,
    framework: Chosen | None,
    read: ReadOptions,
    out: Output,
) -> None:
    """Check a dump against rules on its metrics: exit 0 when every rule holds, 1 when one fails.

    Rules name any metric by its verl name, short (`kl`) or full (`rollout_corr/kl`), or an `rcdiag/*` extra.
    Engine flags decide which metrics exist. Under GitHub Actions (GITHUB_ACTIONS=true) each failed rule is also
    printed as an `::error` annotation. Examples:

    * `rcdiag check run.parquet --max k3_kl=1e-3 --max-abs kl=2e-3`
    * `rcdiag check run.parquet --fail-on warning` (any finding analyze warns about fails the gate)
    * `rcdiag check run.parquet --exact` (fails unless both log-prob columns are bitwise identical)
    * `rcdiag check run.parquet --is token --pack verl --pack analyze --junit rcdiag.xml`
    * `rcdiag check new.parquet --baseline good.parquet --max-increase k3_kl=50% --steps mean`
    * `rcdiag check run.parquet --as trl --min rcdiag/trl/weight_mean=0.9` (a framework's own keys and rcdiag's
      readings of its correction; docs/frameworks.md)

    Exit codes: 0 every rule holds, no finding fails `--fail-on` and (with `--exact`) the columns are bitwise
    identical, 1 a rule, finding or `--exact` failed, 2 bad option, rule, configuration or input, 3 internal error.
    """
    from rcdiag.api import check as run_check
    from rcdiag.check import find_project_rules, load_rules
    from rcdiag.check.rule_set import rule_set
    from rcdiag.cli.output import checked_path
    from rcdiag.cli.progress import progress
    from rcdiag.io.outputs import reads

    junit_file, markdown_file = checked_path(junit, "--junit"), checked_path(markdown, "--markdown")
    reads(path)  # every output is an input's clash from here on: the rules file's, pyproject.toml's, the baseline's
    assert is_step_mode(steps)  # --steps' callback refused any other (rcdiag.runtime.option_checks)
    loaded = (
        load_rules(rules_file, steps=steps, tolerate=tolerate)
        if rules_file
        else None
        if no_pyproject
        else find_project_rules(steps=steps, tolerate=tolerate)
    )
    bounds = {
        "max": max_rules,
        "min": min_rules,
        "max_abs": max_abs_rules,
        "max_increase": max_increase,
        "max_decrease": max_decrease,
    }
    ruled = rule_set(bounds, packs, fail_on, loaded, steps=steps, tolerate=tolerate)
    config = engine.config(base=loaded.config() if loaded is not None else None)  # before the notice: one error line
    if framework is not None:
        config = engine.for_framework(framework, config)
    if loaded is not None:
        loaded.refuse_router_replay(config)
    if loaded is not None and rules_file is None:
        print(f"rcdiag: using [tool.rcdiag.check] from {loaded.path}", file=sys.stderr)
    against = baseline or (loaded.baseline if loaded is not None else None)
    with progress(read, out) as on_chunk:
        result = run_check(
            path,
            ruled.rules,
            config,
            read,
            baseline=against,
            on_chunk=on_chunk,
            fail_on=ruled.gate,
            framework=framework,
            exact=exact or (loaded is not None and loaded.exact),
        )
    _emit(result, out, junit_file, markdown_file)
    if not result.passed:
        raise typer.Exit(1)


def _emit(result: CheckResult, out: Output, junit: Path | None, markdown: Path | None) -> None:
    from rcdiag.cli.output import print_stdout
    from rcdiag.io.outputs import write_file
    from rcdiag.render.check_formats import github_annotations, render_junit, render_markdown

    if junit is not None:
        write_file(junit, render_junit(result))
    if markdown is not None:
        summary = os.environ.get("GITHUB_STEP_SUMMARY")
        write_file(markdown, render_markdown(result), append=Path(summary) == markdown if summary else False)
    out.emit(result)
    if os.environ.get("GITHUB_ACTIONS") == "true":
        for line in github_annotations(result):
            print(line, file=sys.stderr) if out.text_to_stdout else print_stdout(line)
