"""What every framework harness shares: the dumps, their views, the JSON of expected values and the comparison.

slime, SkyRL, prime-rl, NeMo-RL and ROLL have no release on the package index, so the tests cannot run their code:
a harness script of ours per framework (``tests/harness/NAME_expected.py SOURCE``) runs the framework's own
functions from its repository at a pinned commit (fetched outside this tree; nothing of theirs is copied here) on
the dumps below and writes what they log to ``tests/harness/expected/NAME.json``, naming the repository, the commit
and every file and line range it ran (with their SHA-256). The tests rebuild the same dumps, check each one's
fingerprint (the arrays the harness read) and compare ``rcdiag analyze --as NAME`` with the JSON, per step and
pooled, to float32 rounding. Rerun a harness when its framework's pin or the dumps change.

The dumps: two real-model ones (tests/shape_dumps.py, seeded) and three synthetic ones (tests/framework_cases.py,
seeded): masked padding at row ends and inside rows, empty and fully masked rows, 3,000-token rows, outlier
tokens, (``synthetic_s2_far``) log-ratios beyond the +-20 clamps, and (``synthetic_s3_masked_step_inputs``) a step
without a valid token; the ``_inputs`` ones also hold a current policy and advantages. A view is one step, or every step pooled,
padded to its longest row (pads: log-prob 0, mask 0) as a trainer pads its batch.
"""

from __future__ import annotations

import hashlib
import json
import math
import tempfile
import textwrap
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
from framework_cases import Rows, all_rows, close, dump_inputs, dump_rows, padded, synthetic_dump, with_loss_inputs
from framework_oracles import _load as load_module
from framework_oracles import _package as package
from framework_oracles import _stub as stub

HERE = Path(__file__).resolve().parent
EXPECTED = HERE / "expected"
POOLED = "pooled"
__all__ = ["load_module", "package", "stub"]  # the oracles' loaders, for the harnesses


def _real(scenario: str, seed: int) -> Callable[[Path], Path]:
    def build(_: Path) -> Path:
        from shape_dumps import dump

        return dump(scenario, seed)

    return build


DUMPS: dict[str, Callable[[Path], Path]] = {
    "bf16_s0": _real("bf16", 0),
    "int4_s1": _real("int4", 1),
    "synthetic_s0": lambda d: synthetic_dump(d, 0),
    "synthetic_s1_wide": lambda d: synthetic_dump(d, 1, scale=0.3),
    "synthetic_s2_far": lambda d: synthetic_dump(d, 2, scale=0.3, outliers=25.0),
    "bf16_s0_inputs": lambda d: with_loss_inputs(_real("bf16", 0)(d), d, 0),
    "synthetic_s0_inputs": lambda d: with_loss_inputs(synthetic_dump(d, 0), d, 0),
    "synthetic_s1_token_advantages": lambda d: with_loss_inputs(synthetic_dump(d, 1, scale=0.3), d, 1, per_row=False),
    "synthetic_s3_masked_step_inputs": lambda d: with_loss_inputs(synthetic_dump(d, 3, masked_step=1), d, 3),
}
"""Each dump the harnesses run on, by name -> how to build it (into a directory, for the synthetic ones)."""


def build(name: str, directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    return DUMPS[name](directory)


def step_name(step: int | None) -> str:
    return f"step {step}"


def views(path: Path) -> Iterator[tuple[str, Rows]]:
    """``("step N", rows)`` for each step in order, then ``("pooled", every row)``."""
    steps = dump_rows(path)
    for step in sorted(steps, key=lambda s: (s is None, s or 0)):
        yield step_name(step), steps[step]
    yield POOLED, all_rows(steps)


def inputs_of(path: Path) -> dict[str, list[tuple[np.ndarray, np.ndarray]]] | None:
    """Each view's rows' loss inputs (current log-probs, advantages per token) for a dump that has them."""
    import pyarrow.parquet as pq

    first = sorted(path.glob("*.parquet"))[0] if path.is_dir() else path
    if "advantages" not in pq.read_schema(first).names:
        return None
    steps = dump_inputs(path)
    out = {step_name(step): steps[step] for step in sorted(steps, key=lambda s: (s is None, s or 0))}
    out[POOLED] = [row for rows in out.values() for row in rows]
    return out


def fingerprint(path: Path) -> str:
    """SHA-256 of every row the harness reads (step, old, rollout, mask bytes, and the loss inputs where the dump
    has them), in order."""
    digest = hashlib.sha256()
    inputs = inputs_of(path)
    for name, rows in views(path):
        if name == POOLED:
            break
        digest.update(name.encode())
        for old, rollout, mask in rows:
            digest.update(old.tobytes() + b"|" + rollout.tobytes() + b"|" + mask.astype(np.uint8).tobytes())
        for current, advantages in inputs[name] if inputs is not None else ():
            digest.update(current.tobytes() + b"|" + advantages.tobytes())
    return digest.hexdigest()


# ------------------------------------------------------------------------------------------------ the harness side


def checkout(doc: str | None, commit: str) -> Path:
    """The framework checkout named on a harness's command line (``doc``: the harness's docstring)."""
    import argparse

    parser = argparse.ArgumentParser(description=(doc or "").splitlines()[0])
    parser.add_argument("source", type=Path, help=f"a checkout of the framework's repository at {commit}")
    root: Path = parser.parse_args().source.resolve()
    return root


def pinned(root: Path, path: str, first: int | None = None, last: int | None = None) -> dict[str, Any]:
    """What a harness ran from ``root/path`` (a line range, or the whole file): for the JSON's ``ran``."""
    lines = (root / path).read_text().splitlines()
    part = lines if first is None else lines[first - 1 : last]
    entry: dict[str, Any] = {"file": path, "sha256": hashlib.sha256("\n".join(part).encode()).hexdigest()}
    if first is not None:
        entry["lines"] = f"{first}-{last}"
    return entry


def lines_of(root: Path, path: str, first: int, last: int) -> str:
    """Lines ``first..last`` of a file of the framework's source, dedented (inline trainer code to run)."""
    return textwrap.dedent("\n".join((root / path).read_text().splitlines()[first - 1 : last]))


def weights_of(weights: Any, mask: Any) -> dict[str, float]:
    """rcdiag's two readings of the per-token weights the framework's code put on each valid token's loss."""
    kept = weights[mask.bool()].double() if weights.dim() == 2 else weights.double()
    if kept.numel() == 0:
        return {}
    return {"weight_mean": float(kept.mean()), "zeroed_fraction": float((kept == 0).double().mean())}


def _plain(value: Any) -> Any:
    value = float(value)
    return value if math.isfinite(value) else None


Oracle = Callable[..., tuple[dict[str, float], dict[str, float]]]
"""``(options, old, rollout, mask, rows[, inputs=]) -> (the keys the framework logs, rcdiag's weight readings)`` for
one view: its padded (B, T) float32 tensors, and its rows as stored (for a framework that takes one tensor per
sample); with ``run(with_inputs=True)`` also each row's loss inputs (current log-probs, advantages per token), or
``None`` for a dump without them."""


def run(
    name: str,
    *,
    repository: str,
    commit: str,
    ran: list[dict[str, Any]],
    settings: Mapping[str, Mapping[str, Any]],
    oracle: Oracle,
    notes: tuple[str, ...] = (),
    with_inputs: bool = False,
) -> Path:
    """Run ``oracle`` on every dump, setting and view; write ``expected/NAME.json`` (and print its path)."""
    with tempfile.TemporaryDirectory() as workdir:
        dumps = _results(settings, oracle, Path(workdir), with_inputs)
    out = EXPECTED / f"{name}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    document = {
        "framework": name,
        "repository": repository,
        "commit": commit,
        "generated_by": f"tests/harness/{name.replace('-', '_')}_expected.py",
        "ran": ran,
        "notes": list(notes),
        "settings": {k: dict(v) for k, v in settings.items()},
        "dumps": dumps,
    }
    out.write_text(json.dumps(document, indent=1, sort_keys=False) + "\n")
    print(out)
    return out


def _results(
    settings: Mapping[str, Mapping[str, Any]], oracle: Oracle, workdir: Path, with_inputs: bool = False
) -> dict[str, Any]:
    """``with_inputs``: the oracle takes the loss inputs (``inputs=``, ``None`` for a dump without them) and runs on
    every dump; otherwise on the dumps without them only."""
    dumps: dict[str, Any] = {}
    for dump in DUMPS:
        path = build(dump, workdir / dump)
        inputs = inputs_of(path)
        if inputs is not None and not with_inputs:
            continue
        results: dict[str, Any] = {}
        for setting, options in settings.items():
            per_view = {}
            for view, rows in views(path):
                old, rollout, mask = padded(rows)
                extra = {"inputs": None if inputs is None else inputs[view]} if with_inputs else {}
                logged, weights = oracle(options, old, rollout, mask, rows, **extra)
                per_view[view] = {
                    "logged": {k: _plain(v) for k, v in logged.items()},
                    "weights": {k: _plain(v) for k, v in weights.items()},
                }
            results[setting] = per_view
        dumps[dump] = {"fingerprint": fingerprint(path), "results": results}
    return dumps


# ------------------------------------------------------------------------------------------------ the test side


def load(name: str) -> dict[str, Any]:
    """``expected/NAME.json``."""
    loaded: dict[str, Any] = json.loads((EXPECTED / f"{name}.json").read_text())
    return loaded


def compare(
    name: str,
    setting: str,
    directory: Path,
    *,
    rel: float = 2e-6,
    abs_: float = 1e-9,
    tolerances: Mapping[str, tuple[float, float]] | None = None,
) -> int:
    """``rcdiag analyze --as NAME`` with the options of ``setting`` against the JSON, every dump, step and the
    pooled view: the keys logged (in the framework's order), their values, and the weight readings. Returns how
    many values were compared."""
    import rcdiag

    expected = load(name)
    options = expected["settings"][setting]
    compared = 0
    for dump, entry in expected["dumps"].items():
        path = build(dump, directory / dump)
        assert fingerprint(path) == entry["fingerprint"], (
            f"{dump} is not the dump tests/harness/{name.replace('-', '_')}_expected.py read: rerun the harness "
            "(the dumps or their builders changed)"
        )
        report = rcdiag.analyze(path, framework=name, framework_options=options)
        ours = {step_name(step.step): (step.metrics, step.extras) for step in report.steps}
        ours[POOLED] = (report.metrics, report.extras)
        for view, values in entry["results"][setting].items():
            metrics, extras = ours[view]
            logged = values["logged"]
            own = [k for k in metrics if k in _framework_keys(name)]
            present = [k for k in own if metrics[k] is not None or logged.get(k, 0) is None]
            assert present == list(logged), (dump, setting, view, present, list(logged))
            for key, theirs in logged.items():
                r, a = (tolerances or {}).get(key.rsplit("/", 1)[-1], (rel, abs_))
                mine = metrics[key]
                ok = mine is None if theirs is None else close(mine, theirs, rel=r, abs_=a)
                assert ok, (dump, setting, view, key, mine, theirs)
                compared += 1
            for reading, theirs in values["weights"].items():
                mine = extras[f"rcdiag/{name}/{reading}"]
                ok = close(mine, theirs, rel=rel, abs_=abs_) if theirs is not None else mine is None
                assert ok, (dump, setting, view, reading, mine, theirs)
                compared += 1
    return compared


def _framework_keys(name: str) -> frozenset[str]:
    from rcdiag.frameworks.registry import framework

    return frozenset(key.key for key in framework(name).keys)
