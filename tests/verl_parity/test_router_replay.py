"""verl 0.9.1 refuses ``router_replay.mode: R2`` with ``rollout_correction.bypass_mode: true``; rcdiag refuses it
wherever it reads a configuration (``--as verl --as-option``, a rules file's ``[engine]``) and never proposes it
(the sweep's preset ranking, the verdict's prescription), checked against verl's own ``_validate_router_replay_config``
(``verl/utils/config.py`` of each installed release; 0.9.0 and earlier have none and accept everything)."""

from __future__ import annotations

import importlib.util
import itertools
import types
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from conftest import ROOT

import rcdiag
from rcdiag.io.dump_writer import DumpWriter
from rcdiag.runtime.errors import ConfigError
from rcdiag.settings.constants import ROUTER_REPLAY_KEY
from rcdiag.settings.correction import PRESETS, preset, refuse_router_replay

MODES = ("disabled", "R2", "R3")


@cache
def verl_validator(version: str) -> Any:
    """Release ``version``'s ``_validate_router_replay_config``, or ``None`` where its config module has none."""
    pytest.importorskip("omegaconf")
    from missing_components import missing

    path = ROOT / ".gl" / f"verl-{version}" / "verl" / "utils" / "config.py"
    if not path.is_file():
        missing(f"verl-{version}")
    spec = importlib.util.spec_from_file_location(f"verl_config_{version.replace('.', '_')}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return getattr(module, "_validate_router_replay_config", None)


def verl_refuses(version: str, mode: str, bypass: bool) -> str | None:
    """verl ``version``'s message for this pair, or ``None`` when it accepts it (the release without the check:
    0.9.1's rollout-correction code is 0.9.0's, its validation is not)."""
    validate = verl_validator(version)
    if validate is None:
        return None
    actor = types.SimpleNamespace(engine=types.SimpleNamespace(router_replay=types.SimpleNamespace(mode=mode)))
    try:
        validate(actor, {"bypass_mode": bypass})
    except ValueError as exc:
        return str(exc)
    return None


@pytest.mark.parametrize("version", ["0.7.1", "0.8.0", "0.9.0", "0.9.1"])
def test_refusal_is_verls_for_every_mode_and_release(version: str) -> None:
    for mode, bypass in itertools.product(MODES, (False, True)):
        expected = verl_refuses(version, mode, bypass)
        try:
            refuse_router_replay(mode, bypass, version)
            got = None
        except ConfigError as exc:
            got = str(exc)
        assert got == expected, (version, mode, bypass)
    assert verl_refuses("0.9.1", "R2", True) is not None  # the case this file is about exists


@pytest.mark.parametrize(
    "args",
    [
        ("--preset", "bypass_ppo_clip", "--as-option", "router_replay.mode=R2"),
        ("--as", "verl", "--as-option", "bypass_mode=true", "--as-option",
         "actor_rollout_ref.actor.megatron.router_replay.mode=R2"),
        ("--as-option", 'algorithm.rollout_correction={"bypass_mode": true}', "--as-option",
         'actor_rollout_ref.actor.veomni.router_replay={"mode": "R2"}'),
    ],
)  # fmt: skip
def test_analyze_refuses_r2_with_bypass_in_one_line(args: tuple[str, ...], capsys: pytest.CaptureFixture) -> None:
    from rcdiag.cli import main

    with pytest.raises(SystemExit) as exit_:
        main(["analyze", str(ROOT / "sample_data" / "healthy.parquet"), *args])
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err == f"rcdiag: error: {verl_refuses('0.9.1', 'R2', True)}"
    with pytest.raises(SystemExit) as accepted:  # verl 0.9.0 validates nothing of the kind
        main(["analyze", str(ROOT / "sample_data" / "healthy.parquet"), *args, "--verl-version", "0.9.0", "-q"])
    assert accepted.value.code == 0


def test_rules_file_refuses_r2_with_bypass_set_by_a_flag(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from rcdiag.cli import main

    rules = tmp_path / "rules.toml"
    rules.write_text('[engine]\nrouter_replay_mode = "R2"\n[max]\nkl = 1.0\n')
    dump = str(ROOT / "sample_data" / "healthy.parquet")
    with pytest.raises(SystemExit) as ok:
        main(["check", dump, "--rules", str(rules), "-q"])
    assert ok.value.code == 0
    with pytest.raises(SystemExit) as refused:
        main(["check", dump, "--rules", str(rules), "--preset", "bypass_pg_is"])
    assert refused.value.code == 2
    assert capsys.readouterr().err.strip().endswith(verl_refuses("0.9.1", "R2", True) or "")


def _r2_dump(tmp_path: Path) -> Path:
    """The healthy sample rewritten with the metadata the verl integration records for an R2 run."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    table = pq.read_table(ROOT / "sample_data" / "healthy.parquet")
    writer = DumpWriter(tmp_path / "r2", metadata={ROUTER_REPLAY_KEY: "R2"})
    for step in sorted(set(table.column("step").to_pylist())):
        rows = table.filter(pc.equal(table.column("step"), step))
        writer.write(
            step=step,
            old_log_prob=rows.column("old_log_prob").to_pylist(),
            rollout_log_prob=rows.column("rollout_log_prob").to_pylist(),
            response_mask=rows.column("response_mask").to_pylist(),
        )
    return tmp_path / "r2"


def test_sweep_never_ranks_a_preset_verl_refuses_for_an_r2_run(tmp_path: Path) -> None:
    from rcdiag.sweep import sweep

    plain = sweep(ROOT / "sample_data" / "healthy.parquet")
    r2 = sweep(_r2_dump(tmp_path))
    assert any(preset(p.name).bypass_mode for p in plain.presets)  # bypass presets are ranked for other runs
    assert r2.presets and not any(preset(p.name).bypass_mode for p in r2.presets)
    for ranked in r2.presets:  # every preset left passes verl 0.9.1's own validation with R2
        assert verl_refuses("0.9.1", "R2", preset(ranked.name).bypass_mode) is None
    bypass = [name for name in PRESETS if preset(name).bypass_mode]
    assert bypass and all(verl_refuses("0.9.1", "R2", True) for _ in bypass)


@pytest.mark.parametrize("sample", ["outliers", "quantized_4bit"])  # the samples whose verdict is `correct`
def test_prescriptions_pass_verls_validation_under_r2(sample: str) -> None:
    """The verdict prescribes decoupled settings only: verl 0.9.1 accepts each with R2."""
    report = rcdiag.analyze(ROOT / "sample_data" / f"{sample}.parquet")
    assert report.verdict is not None and report.verdict.recommendation is not None
    assert "bypass_mode" not in report.verdict.recommendation.config.to_dict()  # a prescription is decoupled
    assert verl_refuses("0.9.1", "R2", False) is None
