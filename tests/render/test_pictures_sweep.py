"""``rcdiag sweep --html``: a curve per option with the recommended threshold, the recommendations, presets and
every row, checked in a real browser with the network cut."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from conftest import SAMPLES, run
from page_checks import opened

pytest.importorskip("matplotlib")
OUTLIERS = str(SAMPLES / "outliers.parquet")


def test_sweep_html_opens_offline_with_every_option_and_recommendation(
    browser: object,
    tmp_path: Path,
    capsys: pytest.CaptureFixture,
) -> None:
    page, load, sweep = opened(browser, capsys, tmp_path, "sweep", OUTLIERS)
    options = list(dict.fromkeys(row["option"] for row in sweep["sweep"]))
    assert len(options) == 13
    text = page.read_text()
    assert text.count("<svg") == len(options)  # one curve chart per option
    for row in sweep["sweep"]:
        assert re.search(rf"{row['option']}\s+{re.escape(row['threshold'])}", load.text), row
    for rec in sweep["recommendations"]:
        assert f"recommended {rec['threshold']}" in load.text  # the marked point's legend, as SVG text
        assert f"rollout_{'is' if rec['option'].startswith('is_') else 'rs'}" in load.text
    for preset in sweep["presets"]:
        assert preset["name"] in load.text
    # the preset table says the verdict's ranking and shows the IS truncated share and each preset's note
    assert "Ranked by the verdict's policy" in load.text and "Least rejected" not in load.text
    first = sweep["presets"][0]
    truncated = first["is_truncated_share"]
    digits = f"{truncated:.6g}"[:-1]  # the shown value's leading digits, whatever its last digit's rounding
    assert re.search(rf"{first['name']}\s+\S+\s+\S+\s+{re.escape(digits)}", load.text), first
    assert "applies no correction" in load.text
    assert len(text) < 5_000_000


def test_sweep_takes_no_png(capsys: pytest.CaptureFixture) -> None:
    code, _, err = run(capsys, "sweep", OUTLIERS, "--png", "x.png")
    assert code == 2 and "--png" in err


def test_merge_of_sweep_states_writes_the_sweep_page(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    state = str(tmp_path / "s.json")
    assert (
        run(capsys, "sweep", OUTLIERS, "--rs", "token_k1", "-q", "--save-state", state, "-o", str(tmp_path / "x"))[0]
        == 0
    )
    page = tmp_path / "merged.html"
    code, _, _ = run(capsys, "merge", state, "--html", str(page), "-o", str(tmp_path / "m.txt"))
    assert code == 0 and "rcdiag sweep" in page.read_text() and "token_k1" in page.read_text()
    code, _, err = run(capsys, "merge", state, "--png", str(tmp_path / "m.png"))
    assert code == 2 and "cannot write --png for a sweep" in err
