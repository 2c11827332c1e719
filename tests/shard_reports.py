"""The sharded run's reports (the ``local_run`` and ``s3_run`` fixtures in conftest) read through the CLI, and two
JSON reports compared metric by metric: a run read from S3, with Ray or from a merged state must equal the local one."""

from __future__ import annotations

import json
import math

import pytest
from conftest import run

FLAGS = ("--is", "token", "--rs", "token_k1,seq_mean_k3", "--rs-threshold", "0.7_1.4,0.05", "--on-bad-row", "skip")


def close(a: dict, b: dict, tol: float = 1e-12) -> None:
    assert list(a) == list(b)
    for key in a:
        if a[key] is None or b[key] is None:
            assert a[key] is None and b[key] is None, key
        else:
            assert math.isclose(a[key], b[key], rel_tol=tol, abs_tol=tol), (key, a[key], b[key])


def same_report(a: dict, b: dict) -> None:
    """Two JSON reports with the same metrics (1e-12), steps and counts (skipped rows included)."""
    close(a["metrics"], b["metrics"])
    close(a["extras"], b["extras"])
    assert [s["step"] for s in a["steps"]] == [s["step"] for s in b["steps"]]
    for x, y in zip(a["steps"], b["steps"], strict=True):
        close(x["metrics"], y["metrics"])
        assert x["rows"] == y["rows"]
    for key in ("rows", "tokens", "valid_tokens", "skipped_rows", "skipped_by_reason", "neg_inf_tokens", "files"):
        assert a["input"][key] == b["input"][key], key
    assert [f["code"] for f in a["findings"]] == [f["code"] for f in b["findings"]]
    assert a["exact"] == b["exact"]  # counts and the first differing rows, in reading order, however it was read


def analyze_json(capsys: pytest.CaptureFixture, path: str, *flags: str) -> dict:
    code, out, err = run(capsys, "analyze", path, *FLAGS, *flags, "--format", "json")
    assert code == 0, err
    return json.loads(out)
