"""Regenerate the token-id sample: a tokenizer trained here and a dump whose mismatch sits on the stop token.

    python sample_data/make_token_sample.py      # needs the tokenizers library: pip install "rcdiag[tokens]"

* ``tokenizer.json``: a byte-level BPE of ``VOCAB`` ids trained on ``corpus()`` (arithmetic word problems written
  from templates with a seeded generator), with the special tokens ``<|endoftext|>`` and ``<|im_end|>``;
* ``stop_token.parquet``: ``rcdiag.io.synthetic``'s healthy dump (seeded) with a ``token_ids`` column: each response
  is a run of the tokenized corpus ending in ``<|im_end|>``; the rollout engine reports log-prob 0 for that stop
  token (it appended it by its stop rule rather than sampling it), while the trainer scores it as the model does.

Seeded and deterministic: rerunning it rewrites the same files. ``rcdiag analyze sample_data/stop_token.parquet
--explain --tokenizer sample_data/tokenizer.json`` ranks ``<|im_end|>`` first and gives ``token_specific``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa

from rcdiag.io import synthetic

HERE = Path(__file__).resolve().parent
VOCAB = 400
SPECIAL = ("<|endoftext|>", "<|im_end|>")
NAMES = ("Ana", "Tom", "Mei", "Ravi", "Olga", "Sam")
THINGS = ("apples", "pens", "books", "coins", "marbles", "stamps")


def corpus(seed: int = 0, problems: int = 400) -> list[str]:
    """Short arithmetic word problems with worked answers: words, digits, punctuation, spaces and newlines."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(problems):
        a, b = (int(v) for v in rng.integers(2, 90, 2))
        who, other = rng.choice(NAMES, 2, replace=False)
        thing = rng.choice(THINGS)
        out.append(
            f"{who} has {a + b} {thing}. {who} gives {b} {thing} to {other}.\n"
            f"How many {thing} does {who} have left?\n"
            f"Answer: {a + b} - {b} = {a}. The answer is {a}.\n"
        )
    return out


def train_tokenizer(texts: list[str], vocab: int = VOCAB):  # type: ignore[no-untyped-def]
    """A byte-level BPE trained on ``texts`` (returns a ``tokenizers.Tokenizer``)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab,
        special_tokens=list(SPECIAL),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer)
    return tokenizer


def with_token_ids(table: pa.Table, stream: np.ndarray, stop_id: int, stop_log_prob: float | None) -> pa.Table:
    """``table`` with a ``token_ids`` column: each row a run of ``stream`` ending in ``stop_id``; with
    ``stop_log_prob`` the rollout side reports that log-prob for the stop token."""
    old = table.column("old_log_prob").combine_chunks()
    offsets = np.asarray(old.offsets, dtype=np.int64)
    lengths = np.diff(offsets)
    ids = np.empty(int(offsets[-1]), dtype=np.int32)
    at = 0
    for row, n in enumerate(lengths.tolist()):
        if not n:
            continue
        start = at % (stream.shape[0] - n)
        ids[offsets[row] : offsets[row + 1] - 1] = stream[start : start + n - 1]
        ids[offsets[row + 1] - 1] = stop_id
        at += n
    rollout = table.column("rollout_log_prob").combine_chunks()
    values = rollout.values.to_numpy(zero_copy_only=False).copy()
    if stop_log_prob is not None:
        values[(offsets[1:] - 1)[lengths > 0]] = stop_log_prob
    lists = pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32)), pa.array(values))
    table = table.set_column(table.schema.get_field_index("rollout_log_prob"), "rollout_log_prob", lists)
    token_lists = pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32)), pa.array(ids))
    return table.append_column("token_ids", token_lists)


def main() -> None:
    texts = corpus()
    tokenizer = train_tokenizer(texts)
    tokenizer.save(str(HERE / "tokenizer.json"))
    stream = np.array(tokenizer.encode("".join(texts)).ids, dtype=np.int32)
    table = synthetic.generate("healthy", rows=256, steps=4, seed=22, median_length=120)
    table = with_token_ids(table, stream, tokenizer.token_to_id("<|im_end|>"), 0.0)
    metadata = dict(table.schema.metadata or {})
    metadata[b"rcdiag.description"] = b"healthy, except that the rollout engine reports log-prob 0 for the stop token"
    synthetic.write(table.replace_schema_metadata(metadata), HERE / "stop_token.parquet")
    print(f"wrote tokenizer.json ({tokenizer.get_vocab_size()} ids) and stop_token.parquet ({table.num_rows} rows)")


if __name__ == "__main__":
    main()
