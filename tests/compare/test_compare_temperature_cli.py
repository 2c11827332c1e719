"""``rcdiag compare`` when temperatures are missing or do not explain the kl ratio (real subprocesses)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
from conftest import SAMPLES


def with_metadata(source: str, target: Path, metadata: dict[str, str] | None) -> Path:
    pq.write_table(pq.read_table(SAMPLES / source).replace_schema_metadata(metadata), target)
    return target


def compare(*args: object) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "rcdiag", "compare", *map(str, args)]
    return subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)


def test_no_temperatures_assumes_equal_ones_and_runs_the_noise_verdicts(tmp_path: Path) -> None:
    """kl differs ~45x between the sides (a 4-bit rollout, noise): that is engine_noise_differs, not only
    'temperature unknown'. A side whose own verdict names a bug (a trainer that forgot the temperature: fix) is not
    blamed on its engines' noise: its verdict says what it is."""
    a = with_metadata("healthy.parquet", tmp_path / "a.parquet", None)
    b = with_metadata("quantized_4bit.parquet", tmp_path / "b.parquet", None)
    result = compare(a, b, "--format", "json")
    assert result.returncode == 0 and result.stderr == "", result.stderr
    out = json.loads(result.stdout)
    t = out["temperature"]
    assert t["a"]["source"] == t["b"]["source"] == "assumed" and t["a"]["temperature"] == 1.0
    assert t["explanation"][0].startswith("Neither dump records its sampling temperature")
    assert [(f["code"], f["side"]) for f in out["findings"]] == [
        ("engine_noise_differs", "b"),
        ("temperature_unknown", None),
    ]
    assert "With equal temperatures (assumed: neither dump records one)" in out["findings"][0]["message"]
    table = compare(a, b)
    assert table.returncode == 0
    assert "WARNING [engine_noise_differs]" in table.stdout and "assumed" in table.stdout
    bug = with_metadata("train_forgot_temperature.parquet", tmp_path / "bug.parquet", None)
    out = json.loads(compare(a, bug, "--format", "json").stdout)
    assert [(f["code"], f["side"]) for f in out["findings"]] == [("temperature_unknown", None)]
    assert (out["b"]["verdict"]["status"], out["b"]["verdict"]["causes"][0]["class"]) == ("fix", "temperature")


def test_a_kl_ratio_the_temperatures_cannot_explain_is_not_credited_to_them(tmp_path: Path) -> None:
    """T 0.7 vs 1.0 predicts kl_a/kl_b between 1x and 2.04x; measured 0.385x, the other way round."""
    a = with_metadata("healthy.parquet", tmp_path / "a.parquet", {"temperature": "0.7"})
    b = with_metadata("healthy_t06.parquet", tmp_path / "b.parquet", {"temperature": "1.0"})
    result = compare(a, b, "--format", "json")
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    t = out["temperature"]
    assert round(t["kl_ratio"], 3) == 0.385 and round(t["ideal_kl_ratio"], 2) == 2.04
    assert t["kl_ratio_explained"] is False
    line = t["explanation"][1]
    assert "That lies outside what the temperatures can explain (between 1x and 2.04x" in line
    assert "in the opposite direction: side b has the larger kl although its temperature is the higher" in line
    assert "overstates reality" not in line
    (finding,) = out["findings"]
    assert finding["code"] == "noise_consistent"
    assert "comes from the temperatures" not in finding["message"]
    assert "the temperatures do not account for the kl difference" in finding["message"]


def test_a_ratio_the_temperatures_explain_is_still_credited_to_them(tmp_path: Path) -> None:
    a = with_metadata("healthy_t06.parquet", tmp_path / "a.parquet", {"temperature": "0.6"})
    b = with_metadata("healthy.parquet", tmp_path / "b.parquet", {"temperature": "1.0"})
    out = json.loads(compare(a, b, "--format", "json").stdout)
    assert out["temperature"]["kl_ratio_explained"] is True
    assert "within what the temperatures explain" in out["temperature"]["explanation"][1]
    assert "comes from the temperatures" in out["findings"][-1]["message"]
