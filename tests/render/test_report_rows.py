"""``--explain``'s breakdowns, its worst responses and ``--by``'s slices are typed rows (``rcdiag.records.report``: ``BucketRow``,
``TokenRow`` in a ``TokenBreakdown``, ``ExplainBreakdowns``, ``WorstRow``, ``SliceRow``), built once where the record
is built: the renderers read their attributes, never a dict key, and ``to_dict`` gives the JSON's keys in the JSON's
order, read back into the same rows."""

from __future__ import annotations

import dataclasses
import json
import math
import re
from html import escape
from pathlib import Path

import pytest
from conftest import ROOT, SAMPLES, run

import rcdiag
from rcdiag.explain.worst import WorstResponse
from rcdiag.io.columns import ColumnMap
from rcdiag.records.report import (
    BucketRow,
    ExplainBreakdowns,
    PrescribedSetting,
    SliceRow,
    TokenBreakdown,
    TokenRow,
    WorstRow,
)

ROWS = (BucketRow, TokenRow, TokenBreakdown, ExplainBreakdowns, WorstRow, SliceRow)
STOP = str(SAMPLES / "stop_token.parquet")
TOKENIZER = str(SAMPLES / "tokenizer.json")


def _render_sources() -> dict[str, str]:
    package = ROOT / "rcdiag" / "render"
    return {str(path.relative_to(package)): path.read_text() for path in sorted(package.glob("*.py"))}


def _row_key_read() -> re.Pattern[str]:
    """A subscript or ``.get`` naming one of the rows' fields (``entry["log_ratio_sum"]``, ``token.get("ids")``),
    or a breakdowns record read as a dict."""
    names = sorted({f.name for row in ROWS for f in dataclasses.fields(row)})
    keys = "|".join(names)
    return re.compile(
        rf"""(\[\s*["']({keys})["']\s*\]|\.get\(\s*["']({keys})["'])|\.breakdowns(\[|\.get\(|\.items\(|\.keys\()"""
    )


def test_the_renderers_read_no_dict_key_of_a_row() -> None:
    pattern = _row_key_read()
    offenders = [
        (name, line.strip())
        for name, text in _render_sources().items()
        for line in text.splitlines()
        if pattern.search(line)
    ]
    assert offenders == []


@pytest.mark.parametrize(
    "planted",
    [
        '    step = "" if entry["step"] is None else f", step {entry[\'step\']}"',
        "    share = entry['k3_share']",
        '    token = explained.breakdowns.get("token")',
        "        console.print(_breakdown(title, explained.breakdowns[name]))",
        "    for name, buckets in explained.breakdowns.items():",
    ],
)
def test_the_guard_sees_a_planted_dict_read(planted: str) -> None:
    assert _row_key_read().search(planted)


def test_rows_have_no_keys_to_read() -> None:
    """A renderer that read a row by key would fail on the first report it renders, not read ``None``."""
    for row in ROWS:
        assert not hasattr(row, "__getitem__") and not hasattr(row, "get"), row
        assert row.__dataclass_params__.frozen, row  # type: ignore[attr-defined]


def test_a_worst_row_says_a_non_finite_value_as_none() -> None:
    entry = WorstResponse(row=4, step=2, id="u4", length=3, log_ratio_sum=math.nan, max_abs_log_ratio=math.inf,
                          position_of_max=1, old_log_prob_at_max=-0.5, rollout_log_prob_at_max=-0.75)  # fmt: skip
    row = entry.reported()
    assert row == WorstRow(4, 2, "u4", 3, None, None, 1, -0.5, -0.75)
    assert list(row.to_dict().items()) == [
        ("row", 4), ("step", 2), ("id", "u4"), ("length", 3), ("log_ratio_sum", None), ("max_abs_log_ratio", None),
        ("position_of_max", 1), ("old_log_prob_at_max", -0.5), ("rollout_log_prob_at_max", -0.75),
    ]  # fmt: skip


def _breakdowns_from(data: dict) -> ExplainBreakdowns:
    """The record rebuilt from its JSON alone."""
    token = data.get("token")
    if token is not None:
        ranked = {
            name: tuple(TokenRow(**entry) for entry in token[name]) for name in ("by_k3_share", "by_abs_log_ratio")
        }
        token = TokenBreakdown(**{**token, **ranked})
    buckets = {
        name: tuple(BucketRow(**entry) for entry in data[name]) for name in ("position", "rollout_prob", "length")
    }
    return ExplainBreakdowns(**buckets, token=token)


def test_to_dict_round_trips_through_the_json() -> None:
    report = rcdiag.analyze(STOP, explain=True, tokenizer=TOKENIZER, columns=ColumnMap(by=("step",)))
    assert report.explain is not None
    data = json.loads(json.dumps(report.to_dict()))
    breakdowns = report.explain.breakdowns
    assert breakdowns.token is not None and breakdowns.token.by_k3_share and report.explain.worst_sequences
    assert list(data["breakdowns"])[:4] == ["position", "rollout_prob", "length", "token"]
    assert list(data["breakdowns"]["position"][0]) == ["lo", "hi", "tokens", "kl", "k3_kl", "chi2_token",
                                                        "abs_log_ratio_mean"]  # fmt: skip
    assert _breakdowns_from(data["breakdowns"]) == breakdowns
    assert tuple(WorstRow(**entry) for entry in data["worst_sequences"]) == report.explain.worst_sequences
    slices = report.sections["slices"].tables
    assert {
        column: tuple(SliceRow(**entry) for entry in rows) for column, rows in data["breakdowns"]["by"].items()
    } == slices
    for row in (*breakdowns.position, *breakdowns.token.by_k3_share, *report.explain.worst_sequences,
                *slices["step"]):  # fmt: skip
        assert type(row)(**row.to_dict()) == row


def test_every_renderer_draws_the_rows(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """The terminal tables, the JSON, the HTML page and the PNG dashboard of one report with every kind of row."""
    pytest.importorskip("matplotlib")
    page, png, out = tmp_path / "r.html", tmp_path / "r.png", tmp_path / "r.json"
    code, text, _ = run(capsys, "analyze", STOP, "--explain", "--tokenizer", TOKENIZER, "--by", "step", "--html",
                        str(page), "--png", str(png), "--format", "table")  # fmt: skip
    assert code == 0
    report = rcdiag.analyze(STOP, explain=True, tokenizer=TOKENIZER, columns=ColumnMap(by=("step",)))
    assert report.explain is not None and report.explain.breakdowns.token is not None
    top, worst = report.explain.breakdowns.token.by_k3_share[0], report.explain.worst_sequences[0]
    html = page.read_text()
    for shown, said in ((text, str), (html, escape)):
        assert "By token position in the response" in shown and said("By step (--by step)") in shown
        assert f"{top.tokens:,}" in shown and said(top.text or "") in shown
    assert f"row {worst.row}" in html
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    code, _, _ = run(capsys, "analyze", STOP, "--explain", "--by", "step", "--format", "json", "-o", str(out))
    assert code == 0 and json.loads(out.read_text())["worst_sequences"][0]["row"] == worst.row


def test_a_prescription_carries_its_setting_typed() -> None:
    """``verdict.recommendation.config`` is a ``PrescribedSetting``: verl's four keys in the JSON's order, read by
    attribute everywhere (no ``rec.config["rollout_is"]``), and the setting analyze measures it under."""
    from rcdiag.diagnosis.prescribe import outlier_band, prescribed_setting

    report = rcdiag.analyze(str(SAMPLES / "outliers.parquet"))
    assert report.verdict is not None and report.verdict.recommendation is not None
    setting = report.verdict.recommendation.config
    assert setting == PrescribedSetting("token", 2.0, "token_k1", outlier_band())
    shown = json.loads(json.dumps(report.to_dict()))["verdict"]["recommendation"]["config"]
    assert list(shown.items()) == [("rollout_is", "token"), ("rollout_is_threshold", 2.0),
                                   ("rollout_rs", "token_k1"), ("rollout_rs_threshold", outlier_band())]  # fmt: skip
    assert PrescribedSetting(**shown) == setting
    band = prescribed_setting(setting).resolve().rs_option("token_k1")  # |log-ratio| <= 1 nat, to 4 digits
    assert (band.lower, band.upper) == (pytest.approx(math.exp(-1.0), rel=5e-4), pytest.approx(math.e, rel=5e-4))
    as_dict = re.compile(r"\b(rec|recommendation|prescription|first)\.config(\[|\.get\()")
    package = ROOT / "rcdiag"
    offenders = [(str(path), line.strip()) for path in sorted(package.rglob("*.py"))
                 for line in path.read_text().splitlines() if as_dict.search(line)]  # fmt: skip
    assert offenders == []
