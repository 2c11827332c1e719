"""Which tokens carry the mismatch (issue 22, items 2-4): exact per-id sums, their ranking and test, merging, the
text of the ids with a real tokenizer trained here, the ``token_specific`` detector, and the highlighted HTML."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import ROOT, SAMPLES, one_line_error
from hypothesis import given, settings
from hypothesis import strategies as st

import rcdiag
from rcdiag.engine.stream import Engine
from rcdiag.explain.by_token import DENSE_IDS, MIN_COUNT, TokenSums
from rcdiag.explain.state import ExplainState
from rcdiag.io import Chunk
from rcdiag.settings.correction import CorrectionConfig

pytest.importorskip("tokenizers")
sys.path.insert(0, str(SAMPLES))
import make_token_sample

from rcdiag.explain.vocabulary import Vocabulary

EOS = "<|im_end|>"


@pytest.fixture(scope="module")
def tokenizer_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A byte-level BPE trained on a few KB of word problems, saved as tokenizer.json."""
    directory = tmp_path_factory.mktemp("tokenizer")
    tokenizer = make_token_sample.train_tokenizer(make_token_sample.corpus(seed=5, problems=120), vocab=320)
    tokenizer.save(str(directory / "tokenizer.json"))
    return directory


@pytest.fixture(scope="module")
def vocabulary(tokenizer_path: Path) -> Vocabulary:
    return Vocabulary(tokenizer_path)


@pytest.fixture(scope="module")
def stream(vocabulary: Vocabulary) -> np.ndarray:
    text = "".join(make_token_sample.corpus(seed=9, problems=300))
    return np.array(vocabulary.tokenizer.encode(text).ids, dtype=np.int64)


def make_rows(stream: np.ndarray, eos: int, rows: int = 300, seed: int = 0, noise: float = 0.02) -> dict:
    """Responses cut from the token stream, each ending in ``eos``; log-probs with small symmetric noise."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(30, 120, rows)
    ids, old, rollout = [], [], []
    at = 0
    for n in lengths.tolist():
        row = np.concatenate([stream[at : at + n - 1], [eos]])
        at = (at + n) % (len(stream) - 200)
        o = -rng.exponential(1.0, n).astype(np.float32)
        ids.append(row)
        old.append(o)
        rollout.append(np.minimum(o + rng.normal(0, noise, n), 0).astype(np.float32))
    return {"ids": ids, "old": old, "rollout": rollout}


def shifted(data: dict, hit: set[int], by: float) -> dict:
    """The rollout log-probs of the tokens whose id is in ``hit`` moved by ``by`` (kept <= 0)."""
    out = []
    for ids, values in zip(data["ids"], data["rollout"], strict=True):
        values = values.copy()
        on = np.isin(ids, list(hit))
        values[on] = np.minimum(values[on] + by, 0)
        out.append(values)
    return {**data, "rollout": out}


def write(path: Path, data: dict, row_group_size: int | None = None) -> Path:
    table = pa.table(
        {
            "old_log_prob": pa.array(data["old"], pa.list_(pa.float32())),
            "rollout_log_prob": pa.array(data["rollout"], pa.list_(pa.float32())),
            "response_ids": pa.array(data["ids"], pa.list_(pa.int32())),
        }
    )
    pq.write_table(table, path, row_group_size=row_group_size)
    return path


def token_finding(report: rcdiag.Report) -> rcdiag.Finding | None:
    return next((f for f in report.findings if f.code == "token_specific"), None)


def eos_id(vocabulary: Vocabulary) -> int:
    return int(vocabulary.tokenizer.token_to_id(EOS))


# ------------------------------------------------------------------------------------------------ exact sums


def brute_force(data: dict) -> dict[int, np.ndarray]:
    """Per id: tokens, sum d, sum |d|, sum k3, sum chi2 in float64 from numpy, one token at a time."""
    out: dict[int, np.ndarray] = {}
    for ids, old, rollout in zip(data["ids"], data["old"], data["rollout"], strict=True):
        d = (old - rollout).astype(np.float64)  # float32 difference, as verl takes it
        d = (old.astype(np.float32) - rollout.astype(np.float32)).astype(np.float64)
        k3 = np.expm1(d) - d
        clamped = np.clip(d, -20, 20)
        chi2 = np.expm1(2 * clamped)
        for j, token in enumerate(ids.tolist()):
            out.setdefault(token, np.zeros(5))
            out[token] += (1.0, d[j], abs(d[j]), k3[j], chi2[j])
    return out


def test_per_id_sums_equal_brute_force(tmp_path: Path, stream: np.ndarray, vocabulary: Vocabulary) -> None:
    data = shifted(make_rows(stream, eos_id(vocabulary), rows=120), {eos_id(vocabulary)}, 0.7)
    path = write(tmp_path / "d.parquet", data)
    rcdiag.analyze(path, explain=True, tokens=tmp_path / "t.parquet", chunk_tokens=500)
    import polars as pl

    table = pl.read_parquet(tmp_path / "t.parquet")
    expected = brute_force(data)
    assert sorted(table["id"].to_list()) == sorted(expected)
    total_k3 = sum(v[3] for v in expected.values())
    for row in table.iter_rows(named=True):
        n, lr, abs_lr, k3, chi2 = expected[row["id"]]
        assert row["tokens"] == n
        assert math.isclose(row["kl"], -lr / n, rel_tol=1e-9, abs_tol=1e-15)
        assert math.isclose(row["abs_log_ratio_mean"], abs_lr / n, rel_tol=1e-9)
        assert math.isclose(row["k3_kl"], k3 / n, rel_tol=1e-9, abs_tol=1e-15)
        assert math.isclose(row["chi2_token"], chi2 / n, rel_tol=1e-9, abs_tol=1e-15)
        assert math.isclose(row["k3_share"], k3 / total_k3, rel_tol=1e-9, abs_tol=1e-15)


def test_ids_beyond_the_dense_table_are_summed_sparsely(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    big = [DENSE_IDS + 5, 2**40, 7]
    data = {"ids": [], "old": [], "rollout": []}
    for _ in range(40):
        data["ids"].append(np.array(rng.choice(big, 6), dtype=np.int64))
        old = -rng.exponential(1.0, 6).astype(np.float32)
        data["old"].append(old)
        data["rollout"].append(np.minimum(old + rng.normal(0, 0.1, 6), 0).astype(np.float32))
    table = pa.table({"old_log_prob": pa.array(data["old"], pa.list_(pa.float32())),
                      "rollout_log_prob": pa.array(data["rollout"], pa.list_(pa.float32())),
                      "token_ids": pa.array(data["ids"], pa.list_(pa.int64()))})  # fmt: skip
    pq.write_table(table, tmp_path / "d.parquet")
    state_file = tmp_path / "s.json"
    rcdiag.analyze(tmp_path / "d.parquet", explain=True, tokens=tmp_path / "t.parquet", save_state=state_file)
    import polars as pl

    got = {r["id"]: r for r in pl.read_parquet(tmp_path / "t.parquet").iter_rows(named=True)}
    expected = brute_force(data)
    assert set(got) == set(big)
    for token, (n, lr, *_) in expected.items():
        assert got[token]["tokens"] == n and math.isclose(got[token]["kl"], -lr / n, rel_tol=1e-9)
    sums = json.loads(state_file.read_text())["state"]["whole_dump"]["explain"]["tokens"]["table"]
    assert sums["ids"] == sorted(big)


# ------------------------------------------------------------------------------------------------ ranking, detector


def test_one_shifted_id_is_ranked_first_and_detected(
    tmp_path: Path, stream: np.ndarray, vocabulary: Vocabulary
) -> None:
    target = int(vocabulary.tokenizer.token_to_id("Ġgives"))
    data = shifted(make_rows(stream, eos_id(vocabulary)), {target}, 0.4)
    report = rcdiag.analyze(write(tmp_path / "d.parquet", data), tokenizer=vocabulary.path)
    token = report.explain.breakdowns.token
    assert token.by_k3_share[0].id == target and token.by_k3_share[0].text == "\u2423gives"
    assert [e.id for e in token.by_abs_log_ratio] == [target]
    found = token_finding(report)
    assert found is not None and found.evidence["ids"] == [target]
    assert f"id {target} \u2423gives" in found.message
    assert report.verdict is not None and "token_specific" in [c.cls for c in report.verdict.causes]


def test_the_stop_token_alone_gets_the_special_token_hint(
    tmp_path: Path, stream: np.ndarray, vocabulary: Vocabulary
) -> None:
    eos = eos_id(vocabulary)
    data = make_rows(stream, eos)
    data["rollout"] = [np.concatenate([r[:-1], [0.0]]).astype(np.float32) for r in data["rollout"]]
    report = rcdiag.analyze(write(tmp_path / "d.parquet", data), explain=True, tokenizer=vocabulary.path)
    assert report.explain.breakdowns.token.by_k3_share[0].id == eos
    assert report.explain.breakdowns.token.by_k3_share[0].text == "\u27e8<|im_end|>\u27e9"
    found = token_finding(report)
    assert found is not None and found.evidence["per_id"][0]["special"] is True
    assert "Special token" in found.message and "stop token" in found.message
    without = token_finding(rcdiag.analyze(tmp_path / "d.parquet", explain=True))
    assert without is not None and "Give --tokenizer PATH to see their text." in without.message


def test_digits_only_rank_digit_ids(tmp_path: Path, stream: np.ndarray, vocabulary: Vocabulary) -> None:
    digits = {i for i in set(stream.tolist()) if vocabulary.raw(i).strip().isdigit()}
    data = shifted(make_rows(stream, eos_id(vocabulary)), digits, 0.3)
    token = rcdiag.analyze(write(tmp_path / "d.parquet", data), explain=True).explain.breakdowns.token
    ranked = [e.id for e in token.by_abs_log_ratio]
    assert ranked and set(ranked) <= digits
    counted = [e.id for e in token.by_k3_share if e.tokens >= MIN_COUNT]
    assert set(counted[: len(ranked)]) <= digits


@pytest.mark.parametrize("noise", [0.02, 0.3])
def test_quiet_on_clean_and_on_mismatch_spread_over_every_id(
    tmp_path: Path, stream: np.ndarray, vocabulary: Vocabulary, noise: float
) -> None:
    for seed in range(3):
        data = make_rows(stream, eos_id(vocabulary), seed=seed, noise=noise)
        report = rcdiag.analyze(write(tmp_path / f"d{seed}.parquet", data), explain=True)
        assert token_finding(report) is None
        assert len(report.explain.breakdowns.token.by_abs_log_ratio) <= 1
    assert "token_specific" not in report.explain.not_run


def test_not_run_without_ids_or_with_too_few_tokens(tmp_path: Path) -> None:
    report = rcdiag.analyze(SAMPLES / "healthy.parquet", explain=True)
    assert report.explain.not_run["token_specific"] == "not run: the dump has no token ids (--token-col NAME)"
    data = {"ids": [np.array([1, 2, 3])], "old": [np.array([-1, -1, -1], np.float32)],
            "rollout": [np.array([-1, -2, -1], np.float32)]}  # fmt: skip
    report = rcdiag.analyze(write(tmp_path / "d.parquet", data), explain=True)
    assert report.explain.not_run["token_specific"] == "not run: 3 valid tokens with ids, needs 2,000"


# ------------------------------------------------------------------------------------------------ merging


def assert_same_tokens(a: dict, b: dict) -> None:
    assert {k: v for k, v in a.items() if not k.startswith("by_")} == {
        k: v for k, v in b.items() if not k.startswith("by_")
    }
    for name in ("by_k3_share", "by_abs_log_ratio"):
        assert [e["id"] for e in a[name]] == [e["id"] for e in b[name]]
        for x, y in zip(a[name], b[name], strict=True):
            for key, value in x.items():
                if isinstance(value, float):
                    assert math.isclose(value, y[key], rel_tol=1e-9, abs_tol=1e-12), (key, value, y[key])
                else:
                    assert value == y[key]


def test_shards_merged_and_workers_equal_one_pass(tmp_path: Path, stream: np.ndarray, vocabulary: Vocabulary) -> None:
    data = shifted(make_rows(stream, eos_id(vocabulary)), {eos_id(vocabulary)}, 0.5)
    whole = rcdiag.analyze(write(tmp_path / "all.parquet", data, row_group_size=60), explain=True)
    states = []
    for i, (a, b) in enumerate(((0, 100), (100, 210), (210, 300))):
        part = {k: v[a:b] for k, v in data.items()}
        states.append(tmp_path / f"s{i}.json")
        rcdiag.analyze(write(tmp_path / f"p{i}.parquet", part), explain=True, save_state=states[-1])
    merged = rcdiag.merge_states(states, tokenizer=vocabulary.path)
    assert merged.explain.breakdowns.token.by_k3_share[0].text == "\u27e8<|im_end|>\u27e9"
    plain = rcdiag.merge_states(states)
    assert_same_tokens(plain.explain.breakdowns.token.to_dict(), whole.explain.breakdowns.token.to_dict())
    assert [t.row for t in plain.explain.texts] == [t.row for t in whole.explain.texts]
    assert [t.ids for t in plain.explain.texts] == [t.ids for t in whole.explain.texts]
    workers = rcdiag.analyze(tmp_path / "all.parquet", explain=True, workers=2)
    assert_same_tokens(workers.explain.breakdowns.token.to_dict(), whole.explain.breakdowns.token.to_dict())
    assert [t.ids for t in workers.explain.texts] == [t.ids for t in whole.explain.texts]


def engine_sums(data: dict, order: list[int], chunk_rows: int) -> tuple[np.ndarray, np.ndarray]:
    state = ExplainState()
    engine = Engine(CorrectionConfig().resolve(), wholes=[state])
    for start in range(0, len(order), chunk_rows):
        rows = order[start : start + chunk_rows]
        lengths = [len(data["ids"][r]) for r in rows]
        engine.update(
            Chunk(
                old=np.concatenate([data["old"][r] for r in rows]),
                rollout=np.concatenate([data["rollout"][r] for r in rows]),
                offsets=np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64),
                tokens=np.concatenate([data["ids"][r] for r in rows]).astype(np.int64),
            )
        )
    return state.tokens.table()


@settings(max_examples=12, deadline=None)
@given(chunk_rows=st.integers(1, 40), seed=st.integers(0, 2**16))
def test_chunking_and_row_order_do_not_change_per_id_sums(chunk_rows: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    stream = rng.integers(0, 50, 5000)
    data = make_rows(stream, 49, rows=40, seed=seed % 7)
    ids, sums = engine_sums(data, list(range(40)), 40)
    order = rng.permutation(40).tolist()
    other_ids, other = engine_sums(data, order, chunk_rows)
    assert np.array_equal(ids, other_ids)
    assert np.array_equal(sums[:, 0], other[:, 0])
    np.testing.assert_allclose(other, sums, rtol=1e-12, atol=1e-15)


def test_token_sums_state_round_trip_and_refusals() -> None:
    sums = TokenSums()
    table = {"ids": [3, DENSE_IDS + 1], "sums": [1, -0.1, 0.1, 0.005, 0.02, 0.01] * 2}
    sums.load_state_dict({"seen": 1.0, "table": table})
    assert sums.state_dict()["table"]["ids"] == [3, DENSE_IDS + 1] and sums.seen
    assert sums.dense.shape[0] > 3 and sums.sparse_ids.tolist() == [DENSE_IDS + 1]
    from rcdiag.runtime.fields import FieldError

    with pytest.raises(FieldError, match="ascending"):
        TokenSums().load_state_dict({"seen": 1.0, "table": {"ids": [4, 3], "sums": [1.0] * 12}})
    with pytest.raises(FieldError, match="at least one token"):
        TokenSums().load_state_dict({"seen": 1.0, "table": {"ids": [4], "sums": [0.0] * 6}})
    with pytest.raises(FieldError, match="must be a table of ids and sums"):
        TokenSums().load_state_dict({"seen": 1.0, "table": [1, 2]})


# ------------------------------------------------------------------------------------------------ text


def test_decoded_text_round_trips(tmp_path: Path, stream: np.ndarray, vocabulary: Vocabulary) -> None:
    data = shifted(make_rows(stream, eos_id(vocabulary)), {eos_id(vocabulary)}, 0.5)
    report = rcdiag.analyze(write(tmp_path / "d.parquet", data), tokenizer=vocabulary.path)
    assert report.explain.texts
    for text in report.explain.texts:
        assert "".join(text.pieces) == vocabulary.tokenizer.decode(list(text.ids), skip_special_tokens=False)
        assert len(text.pieces) == len(text.ids) == len(text.log_ratios)
    newline = vocabulary.tokenizer.token_to_id("Ċ")
    assert vocabulary.text(newline) == "\\n" and vocabulary.text(10**6) == "\u2205"
    accented = vocabulary.tokenizer.encode("é").ids  # two byte-level tokens, one character
    assert "".join(vocabulary.pieces(accented)) == "é"


def test_tokenizer_errors_are_one_line(capsys: pytest.CaptureFixture, tmp_path: Path) -> None:
    err = one_line_error(capsys, "analyze", str(SAMPLES / "healthy.parquet"), "--tokenizer", str(tmp_path))
    assert f"{tmp_path}: has no tokenizer.json" in err
    (tmp_path / "tokenizer.json").write_text("{not json")
    err = one_line_error(capsys, "analyze", str(SAMPLES / "healthy.parquet"), "--tokenizer", str(tmp_path))
    assert "cannot be read as a tokenizer" in err


def test_without_the_library_the_error_names_the_extra(tmp_path: Path) -> None:
    code = (
        "import sys; sys.modules['tokenizers'] = None\n"
        "from rcdiag.cli import main\n"
        f"main(['analyze', {str(SAMPLES / 'stop_token.parquet')!r}, '--tokenizer', {str(SAMPLES)!r}])\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr == (
        "rcdiag: error: --tokenizer needs the tokenizers library, which is not installed: "
        'pip install "rcdiag[tokens]".\n'
    )


def test_terminal_table_shows_ids_text_and_highlighted_response(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "rcdiag", "analyze", str(SAMPLES / "stop_token.parquet"), "--explain", "--tokenizer",
         str(SAMPLES / "tokenizer.json"), "--worst", "2"],
        capture_output=True, text=True, cwd=ROOT, env={"COLUMNS": "200", "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "By token id: largest share of the dump's k3" in out
    assert "\u27e8<|im_end|>\u27e9" in out and "21.5 *" in out
    assert "row 66, step 1, sum -6.59693, valid tokens 0-84:" in out and "The answer is 24.\\n<|im_end|>" in out
    assert "token_specific [token_specific]: 1 token id carries 97% of the dump's k3" in out  # the verdict's cause
    assert "WARNING [token_specific] 0.965358 (whole dump): fails mismatch is not concentrated on a few token ids" in out


def test_terminal_colours_tokens_by_log_ratio() -> None:
    from rich.console import Console

    from rcdiag.render.explain_table import render_explain

    report = rcdiag.analyze(SAMPLES / "stop_token.parquet", worst=1, tokenizer=SAMPLES / "tokenizer.json")
    console = Console(force_terminal=True, color_system="truecolor", width=200, record=True)
    render_explain(report, console)
    text = console.export_text(styles=True)
    assert "\x1b[30;48;2;80;135;255m<|im_end|>" in text  # the stop token, rollout far higher: full blue


# ------------------------------------------------------------------------------------------------ HTML in a browser


def test_highlighted_html_in_a_browser(tmp_path: Path, browser: object) -> None:
    pytest.importorskip("matplotlib")
    page = tmp_path / "report.html"
    rcdiag.cli.main  # noqa: B018 (the CLI writes the page as users get it)
    done = subprocess.run(
        [sys.executable, "-m", "rcdiag", "analyze", str(SAMPLES / "stop_token.parquet"), "--tokenizer",
         str(SAMPLES / "tokenizer.json"), "--worst", "3", "--html", str(page), "-q"],
        capture_output=True, text=True, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    html = page.read_text()
    assert 'title="id 1 · log-ratio -6.33273" data-lr="-6.332732200622559" style="background:rgb(80,135,255)"' in html
    loaded = browser.open_offline(page)  # type: ignore[attr-defined]
    assert loaded.requests == [page.resolve().as_uri()] and not loaded.failed and not loaded.console_errors
    assert "Which tokens carry the mismatch (--explain)" in loaded.text
    assert "Worst responses as text (log-ratio per token; hover for values)" in loaded.text
    assert "The answer is 76.\u21b5" in loaded.text and "<|im_end|>" in loaded.text
    assert loaded.screenshot.startswith(b"\x89PNG")
    (tmp_path / "report.png").write_bytes(loaded.screenshot)
