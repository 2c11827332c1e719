"""Shared test helpers: random batches, conversions between padded and ragged layouts, dump writers."""

from __future__ import annotations

import contextlib
import math
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

sys.path.insert(0, str(Path(__file__).parent))
# Which test compiles a kernel first depends on the order tests run in: the "compiling kernels" notice stays out of
# every test's stderr but test_first_run_notice's, which switches it back on with a fresh numba cache.
os.environ["RCDIAG_COMPILE_NOTICE"] = "0"

from missing_components import missing, pytest_runtest_makereport  # noqa: F401  (the CI=true rule: missing means fail)

import rcdiag
from rcdiag.io import Chunk

TESTS = Path(__file__).resolve().parent  # the shared helpers live here; the tests sit in one folder per area
ROOT = TESTS.parent
SAMPLES = ROOT / "sample_data"


def random_batch(
    rng: np.random.Generator,
    rows: int = 24,
    width: int = 40,
    noise: float = 0.1,
    empty_rows: int = 2,
    hole_rate: float = 0.1,
    outliers: float = 0.0,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Padded ``(old, rollout, mask)`` float32/float32/int64 with ragged lengths, holes and empty rows."""
    lengths = rng.integers(1, width + 1, rows)
    if empty_rows:
        lengths[rng.choice(rows, size=min(empty_rows, rows), replace=False)] = 0
    old = -np.abs(rng.normal(0, 1.5, (rows, width))).astype(np.float32)
    delta = rng.normal(0, noise, (rows, width))
    if outliers:
        hit = rng.random((rows, width)) < outliers
        delta[hit] = rng.normal(0, 8.0, hit.sum())
    rollout = np.minimum(old + delta, 0).astype(np.float32)
    mask = (np.arange(width)[None, :] < lengths[:, None]).astype(np.int64)
    mask[rng.random((rows, width)) < hole_rate] = 0
    return old, rollout, mask


def rows_with_ratios(ratios: list[list[float]], rollout_lp: float = -3.0) -> tuple[np.ndarray, ...]:
    """A padded batch whose per-token ratios pi_train/pi_rollout are given (NaN = padding)."""
    width = max(len(r) for r in ratios) if ratios else 0
    old = np.full((len(ratios), width), -1.0, np.float32)
    rollout = np.full((len(ratios), width), rollout_lp, np.float32)
    mask = np.zeros((len(ratios), width), np.int64)
    for i, row in enumerate(ratios):
        for j, r in enumerate(row):
            old[i, j] = rollout_lp + math.log(r)
            mask[i, j] = 1
    return old, rollout, mask


def padded_chunk(old: np.ndarray, rollout: np.ndarray, mask: np.ndarray, steps: np.ndarray | None = None) -> Chunk:
    """A padded batch as one chunk (padding stays in, with mask 0)."""
    rows, width = old.shape
    return Chunk(
        old=np.ascontiguousarray(old, dtype=np.float32).reshape(-1),
        rollout=np.ascontiguousarray(rollout, dtype=np.float32).reshape(-1),
        offsets=np.arange(rows + 1, dtype=np.int64) * width,
        mask=mask.astype(bool).reshape(-1),
        steps=steps,
    )


def ragged_lists(old: np.ndarray, rollout: np.ndarray, mask: np.ndarray) -> dict[str, list]:
    """Ragged per-row lists, trimmed after the last valid token (what a canonical dump holds)."""
    out: dict[str, list] = {"old_log_prob": [], "rollout_log_prob": [], "response_mask": []}
    for i in range(old.shape[0]):
        valid = np.flatnonzero(mask[i])
        end = int(valid[-1]) + 1 if valid.size else 0
        out["old_log_prob"].append(old[i, :end].tolist())
        out["rollout_log_prob"].append(rollout[i, :end].tolist())
        out["response_mask"].append(mask[i, :end].astype(int).tolist())
    return out


def write_dump(path: Path, columns: dict, *, types: dict | None = None, metadata: dict | None = None) -> Path:
    """Write a Parquet dump from Python lists (float32 lists and int8 masks unless ``types`` says otherwise)."""
    types = types or {}
    arrays = {}
    for name, values in columns.items():
        default = {
            "old_log_prob": pa.list_(pa.float32()),
            "rollout_log_prob": pa.list_(pa.float32()),
            "response_mask": pa.list_(pa.int8()),
            "step": pa.int64(),
        }.get(name)
        arrays[name] = pa.array(values, type=types.get(name, default))
    table = pa.table(arrays)
    if metadata:
        table = table.replace_schema_metadata(metadata)
    pq.write_table(table, path)
    return path


def block_after(text: str, command: str) -> list[str]:
    """The lines of the first plain code block after the bash block that holds ``command``."""
    rest = text[text.index(command) :]
    rest = rest[rest.index("```\n") + 4 :]  # the end of the command's block
    rest = rest[rest.index("```\n") + 4 :]  # the start of its output's block
    return rest[: rest.index("```")].splitlines()


def run_padded(old: np.ndarray, rollout: np.ndarray, mask: np.ndarray, **config: object) -> rcdiag.Report:
    """rcdiag over one padded batch."""
    return rcdiag.analyze_chunks([padded_chunk(old, rollout, mask)], rcdiag.CorrectionConfig(**config))


def assert_metrics_close(
    ours: dict[str, float | None], expected: dict[str, float | None], rel: float = 1e-5, abs_tol: float = 1e-6
) -> None:
    """Same keys in the same order, values within tolerance; ``None`` matches ``None`` or a non-finite value."""
    assert list(ours) == list(expected)
    bad = []
    for key, want in expected.items():
        got = ours[key]
        if want is None or not math.isfinite(want):
            if got is not None:
                bad.append((key, got, want))
            continue
        if got is None or not math.isclose(got, want, rel_tol=rel, abs_tol=abs_tol):
            bad.append((key, got, want))
    assert not bad, bad


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(1234)


# ------------------------------------------------------------------ real components: an S3 server and a Ray instance


def require(module: str, component: str) -> Any:
    """Import ``module``; without it the test skips saying what installs ``component`` (a failure under CI=true,
    see missing_components.py)."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError:
        missing(component)


@pytest.fixture(scope="session")
def s3_env() -> Iterator[int]:
    """The standard AWS variables, pointing at a free port on 127.0.0.1 where ``s3_server`` listens. Set for the
    whole session (before Ray starts, so that Ray's workers inherit them)."""
    port = free_port()
    env = {
        "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}",
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_EC2_METADATA_DISABLED": "true",
    }
    with pytest.MonkeyPatch.context() as patch:
        for key, value in env.items():
            patch.setenv(key, value)
        patch.delenv("AWS_PROFILE", raising=False)
        yield port


def free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@contextlib.contextmanager
def moto_server(port: int, **env: str) -> Iterator[Any]:
    """moto's S3 server (``moto[server]``) in its own process on 127.0.0.1:``port`` (``env`` added to its
    environment), stopped on exit; yields a boto3 client of it for putting objects."""
    import os
    import subprocess
    import time
    import urllib.error
    import urllib.request

    require("moto.server", "moto")
    boto3 = require("boto3", "moto")
    server = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        env=os.environ | env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/moto-api/", timeout=1).close()
                break
            except urllib.error.HTTPError:  # it answers
                break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    pytest.fail("moto's S3 server did not start")
                time.sleep(0.2)
        yield boto3.client("s3", endpoint_url=f"http://127.0.0.1:{port}")
    finally:
        server.terminate()
        server.wait(timeout=30)


@pytest.fixture(scope="session")
def s3_server(s3_env: int) -> Iterator[Any]:
    """The session's S3 server, where ``AWS_ENDPOINT_URL`` points."""
    with moto_server(s3_env) as client:
        yield client


@pytest.fixture(scope="session")
def ray_local(s3_env: int) -> Iterator[Any]:
    """A local Ray instance with 2 CPUs for the session (its workers see the S3 variables)."""
    ray = require("ray", "ray")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, object_store_memory=200 * 1024 * 1024)
    yield ray
    ray.shutdown()


BUCKET = "dumps"


def shard_columns() -> list[dict]:
    """Three shards of one run (5 steps, a step crossing shards), with bad rows to skip in two of them."""
    old, rollout, mask = random_batch(np.random.default_rng(21), rows=90, width=30, noise=0.3, empty_rows=3)
    columns = ragged_lists(old, rollout, mask)
    columns["step"] = [i // 18 for i in range(90)]
    columns["old_log_prob"][4] = [float("nan"), *columns["old_log_prob"][4][1:]]
    columns["rollout_log_prob"][70] = [0.5] * len(columns["rollout_log_prob"][70])
    return [{name: values[a:b] for name, values in columns.items()} for a, b in ((0, 25), (25, 61), (61, 90))]


@pytest.fixture(scope="module")
def local_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The shards on disk (each written with row groups of 8 rows), plus the files a writer leaves beside them."""
    root = tmp_path_factory.mktemp("run")
    for k, columns in enumerate(shard_columns()):
        table = pq.read_table(write_dump(root / f"tmp{k}.parquet", columns))
        (root / f"tmp{k}.parquet").unlink()
        pq.write_table(table, root / f"shard-{k}.parquet", row_group_size=8)
    (root / "_SUCCESS").write_text("")
    (root / ".shard-3.parquet.tmp").write_text("half written")
    return root


@pytest.fixture(scope="module")
def s3_run(s3_server: Any, local_run: Path) -> str:
    """The same files under s3://dumps/run1/."""
    s3_server.create_bucket(Bucket=BUCKET)
    for file in local_run.iterdir():
        s3_server.upload_file(str(file), BUCKET, f"run1/{file.name}")
    return f"s3://{BUCKET}/run1/"


@pytest.fixture(scope="module")
def big_dump(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """4M tokens (20,000 responses of 200) in row groups of 1,000: seconds of work with ``child_process.SLOW``'s chunks."""
    rows, length = 20_000, 200
    rng = np.random.default_rng(0)
    n = rows * length
    old = (-np.abs(rng.normal(1.0, 0.5, n)) - 0.05).astype(np.float32)
    rollout = np.minimum(old + rng.normal(0, 0.01, n), 0).astype(np.float32)
    offsets = pa.array(np.arange(0, n + 1, length, dtype=np.int32))
    table = pa.table(
        {
            "old_log_prob": pa.ListArray.from_arrays(offsets, pa.array(old)),
            "rollout_log_prob": pa.ListArray.from_arrays(offsets, pa.array(rollout)),
            "response_mask": pa.ListArray.from_arrays(offsets, pa.array(np.ones(n, np.int8))),
            "step": pa.array(np.arange(rows) // 1000, pa.int64()),
        }
    )
    path = tmp_path_factory.mktemp("big") / "big.parquet"
    pq.write_table(table, path, row_group_size=1000, compression="none")
    return path


@pytest.fixture(scope="session")
def real_dumps() -> dict[str, dict]:
    """Every realmodel scenario's dump (``scenario_dumps.built_dumps``): path, tokens, steps, seconds by name."""
    from scenario_dumps import built_dumps

    return built_dumps()


@pytest.fixture(scope="session")
def browser() -> object:
    """The headless-Chromium harness (tests/browser.py), or a skip saying what to install (a failure under
    CI=true)."""
    import browser as harness
    from missing_components import missing

    if harness.find_chromium() is None:
        missing("chromium")
    pytest.importorskip("websocket")
    return harness


def run(capsys: pytest.CaptureFixture, *args: str | Path) -> tuple[int, str, str]:
    """``rcdiag ARGS`` in this process, as a user runs it: its exit code, stdout and stderr (the one in-process CLI
    runner every test imports)."""
    from rcdiag.cli import main

    with pytest.raises(SystemExit) as info:
        main([str(a) for a in args])
    out, err = capsys.readouterr()
    return int(info.value.code or 0), out, err


def one_line_error(capsys: pytest.CaptureFixture, *args: str) -> str:
    code, out, err = run(capsys, *args)
    assert code == 2, (out, err)
    assert err.startswith("rcdiag: error: ") and err.count("\n") == 1 and "Traceback" not in err, err
    return err
