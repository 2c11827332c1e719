"""Checks on the pictures and HTML pages rcdiag writes: a PNG is a real picture (not blank), a page opened offline
in the browser made no request but for itself and raised no error (``browser.py`` opens it)."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pytest
from conftest import run


def not_blank(png: bytes) -> tuple[int, int]:
    """The image's size, after checking it is a picture: many colours, a good share of non-white pixels."""
    from PIL import Image  # matplotlib's own dependency: the picture tests skip without matplotlib

    image = Image.open(io.BytesIO(png)).convert("RGB")
    pixels = np.asarray(image)
    inked = (pixels < 235).any(axis=2).mean()
    colours = len(np.unique(pixels.reshape(-1, 3)[:: max(pixels.shape[0] * pixels.shape[1] // 200_000, 1)], axis=0))
    assert inked > 0.03 and colours > 50, (inked, colours)
    return image.size


def assert_clean_offline_load(load: object, page: Path) -> None:
    assert load.requests == [page.resolve().as_uri()]  # type: ignore[attr-defined]  # the file itself, nothing else
    assert load.failed == [] and load.console_errors == []  # type: ignore[attr-defined]
    not_blank(load.screenshot)  # type: ignore[attr-defined]


def opened(browser: object, capsys: pytest.CaptureFixture, tmp_path: Path, *args: str) -> tuple[Path, object, dict]:
    """Run ``rcdiag ARGS --html`` (and ``--format json``), open the page offline and check that it loaded
    cleanly: the page, what the browser saw, and the JSON result."""
    page, result = tmp_path / "page.html", tmp_path / "result.json"
    code, _, err = run(capsys, *args, "-q", "--html", str(page), "--format", "json", "-o", str(result))
    assert code == 0 and f"wrote {page}" in err
    load = browser.open_offline(page)  # type: ignore[attr-defined]
    assert_clean_offline_load(load, page)
    return page, load, json.loads(result.read_text())
