"""Remote reads fail in bounded time with one line (exit 2), and every malformed or unsupported URL is exit 2 with
one line: real subprocesses, on a machine without network access (a test server for the upload case)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import SAMPLES

NO_NETWORK = {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test", "AWS_EC2_METADATA_DISABLED": "true"}


def rcdiag(*args: str, timeout: float = 120, **env: str) -> tuple[subprocess.CompletedProcess[str], float]:
    start = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "rcdiag", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **env},
        check=False,
    )
    return result, time.monotonic() - start


def test_gs_without_network_fails_in_bounded_time_with_one_line() -> None:
    """It printed nothing for 9+ minutes: GCS retried its credential lookup for its default 15 minutes."""
    result, seconds = rcdiag("analyze", "gs://some-bucket/run/", timeout=60)
    assert result.returncode == 2 and result.stdout == "", result.stderr
    assert result.stderr.startswith("rcdiag: error: gs://some-bucket/run/: cannot be read: the storage service or ")
    assert "RCDIAG_STORAGE_RETRY_LIMIT" in result.stderr and result.stderr.count("\n") == 1, result.stderr
    assert seconds < 30, seconds
    quick, quicker = rcdiag("analyze", "gs://some-bucket/run/", RCDIAG_STORAGE_RETRY_LIMIT="1")
    assert quick.returncode == 2 and quicker < seconds, (quicker, seconds)
    bad, _ = rcdiag("analyze", "gs://some-bucket/run/", RCDIAG_STORAGE_RETRY_LIMIT="soon")
    assert bad.returncode == 2 and bad.stdout == ""
    assert bad.stderr == (
        "rcdiag: error: the environment variable RCDIAG_STORAGE_RETRY_LIMIT must be a positive number of seconds, "
        "got 'soon'\n"
    )


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("ftp://x/y.parquet", "uses 'ftp://', whose fsspec filesystem needs settings a URL does not give (host)"),
        ("s3://", "names no bucket; write s3://BUCKET/PATH"),
        ("s3:///x.parquet", "names no bucket; write s3://BUCKET/PATH"),
        ("gs://", "names no bucket; write gs://BUCKET/PATH"),
        ("nosuchscheme://x/y.parquet", "uses 'nosuchscheme://', which neither pyarrow nor"),
    ],
)
def test_malformed_or_unsupported_urls_are_one_line_exit_2(url: str, message: str) -> None:
    result, _ = rcdiag("analyze", url, **NO_NETWORK)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.startswith(f"rcdiag: error: {url}: {message}"), result.stderr
    assert result.stderr.count("\n") == 1, result.stderr


def test_a_failed_upload_says_written_not_read(tmp_path: Path) -> None:
    """An S3 endpoint that refuses connections: the state cannot be written, and the line says so."""
    result, seconds = rcdiag(
        "analyze", str(SAMPLES / "healthy.parquet"), "-q", "--save-state", "s3://bucket/state.json",
        AWS_ENDPOINT_URL="http://127.0.0.1:1", **NO_NETWORK,
    )  # fmt: skip
    assert result.returncode == 2 and result.stdout == "", result.stderr
    assert result.stderr.startswith("rcdiag: error: s3://bucket/state.json: cannot be written: "), result.stderr
    assert "cannot be read" not in result.stderr and result.stderr.count("\n") == 1
    assert seconds < 60
