"""Every bounded user option goes through one template (``rcdiag.runtime.option_checks``): a bad value is one line,
``<where> must be <what>, got <value>``, naming the flag, keyword, variable or file key, with exit 2."""

from __future__ import annotations

from pathlib import Path

import pytest
import typer
from conftest import ROOT, run

import rcdiag
from rcdiag.cli import app
from rcdiag.runtime.errors import ConfigError, SettingError
from rcdiag.runtime.option_checks import (
    choice,
    count,
    duration,
    integer_text,
    number_text,
    positive,
    probability,
)

DUMP = str(ROOT / "sample_data" / "healthy.parquet")


def _options() -> list[tuple[str, object]]:
    """(command, click option) for every option of every command."""
    group = typer.main.get_command(app)
    ctx = typer.Context(group)
    found = []
    for name in group.list_commands(ctx):  # type: ignore[attr-defined]
        command = group.get_command(ctx, name)  # type: ignore[attr-defined]
        found += [(name, p) for p in command.params if p.opts[0].startswith("-")]
    return found


def _numeric(option: object) -> bool:
    annotation = getattr(getattr(option, "type_descriptor", None), "annotation", None)
    return annotation in (int, float)


CHECKED = [(c, o) for c, o in _options() if getattr(o.callback, "check", None) is not None]  # type: ignore[attr-defined]


def test_every_bounded_flag_goes_through_the_template() -> None:
    """No flag keeps typer's own bounds (``min=``/``max=``: pydantic's wording), and every number a flag takes is
    checked by the template."""
    for command, option in _options():
        name = max(option.opts, key=len)  # type: ignore[attr-defined]
        assert getattr(option, "min", None) is None and getattr(option, "max", None) is None, (command, name)
        if _numeric(option):
            assert getattr(option.callback, "check", None) is not None, f"rcdiag {command} {name} is not checked"  # type: ignore[attr-defined]
    assert {max(o.opts, key=len) for _, o in CHECKED} >= {  # type: ignore[attr-defined]
        "--workers", "--chunk-tokens", "--vocab-size", "--on-bad-row", "--steps", "--tolerate", "--worst",
        "--target-reject", "--poll", "--forecast-horizon", "--temperature-a",
    }  # fmt: skip


CHOICES = [(c, o) for c, o in _options() if o.type_descriptor.is_choice]  # type: ignore[attr-defined]


def test_every_choice_flag_goes_through_the_template() -> None:
    """A choice flag (an enum annotation) answers a bad value with the template, not click's wording, and still
    lists its choices in ``--help`` and completes them in the shell."""
    names = {(c, max(o.opts, key=len)) for c, o in CHOICES}  # type: ignore[attr-defined]
    assert names >= {
        ("analyze", "--format"), ("analyze", "--is"), ("compare", "--format"), ("check", "--is"),
        ("merge", "--format"), ("sweep", "--format"), ("watch", "--format"), ("watch", "--exit-on"),
    }  # fmt: skip
    group = typer.main.get_command(app)
    for command, option in CHOICES:
        values = [choice.value for choice in option.type_descriptor.choices]  # type: ignore[attr-defined]
        check = getattr(option.callback, "check", None)  # type: ignore[attr-defined]
        assert check is not None, f"rcdiag {command} {max(option.opts, key=len)} is not checked"  # type: ignore[attr-defined]
        assert check.what == f"one of {', '.join(values)}" and not check.accepts(check.example)
        ctx = typer.Context(group.get_command(typer.Context(group), command))  # type: ignore[attr-defined]
        assert [item.value for item in option.shell_complete(ctx, "")] == values  # type: ignore[attr-defined]
        assert option.display_type(ctx) == f"<{'|'.join(values)}>"  # type: ignore[attr-defined]


def test_a_choice_reaches_the_command_as_its_enum(capsys: pytest.CaptureFixture) -> None:
    code, out, _ = run(capsys, "analyze", DUMP, "--is", "sequence", "--format", "json")
    assert code == 0 and '"rollout_is": "sequence"' in out


@pytest.mark.parametrize(
    ("command", "option"),
    CHECKED,
    ids=[f"{c} {max(o.opts, key=len)}" for c, o in CHECKED],  # type: ignore[attr-defined]
)
def test_a_bad_value_is_the_template_line(
    capsys: pytest.CaptureFixture, tmp_path: Path, command: str, option: object
) -> None:
    check = option.callback.check  # type: ignore[attr-defined]
    name = max(option.opts, key=len)  # type: ignore[attr-defined]
    paths = {"compare": [DUMP, DUMP], "watch": [str(tmp_path)]}.get(command, [DUMP])
    code, out, err = run(capsys, command, *paths, name, check.example)
    assert code == 2 and out == "", err
    assert err.startswith(f"rcdiag: error: {name} must be {check.what}, got ") and err.count("\n") == 1, err


NUMBERS = [(c, o) for c, o in CHECKED if _numeric(o) or max(o.opts, key=len) == "--workers"]  # type: ignore[attr-defined]


def test_every_number_flag_reads_its_text_as_a_number() -> None:
    """An int flag's check reads integers, a float flag's numbers (else ``abc`` would reach the check as text
    unread, or ``2.5`` pass an int flag's reading as a float); ``--workers`` (``N|auto``) reads integers too."""
    names = {(c, max(o.opts, key=len)) for c, o in NUMBERS}  # type: ignore[attr-defined]
    assert names >= {
        ("analyze", "--chunk-tokens"), ("analyze", "--workers"), ("analyze", "--worst"), ("analyze", "--prompt-len"),
        ("compare", "--temperature-b"), ("check", "--tolerate"), ("sweep", "--min-ess"), ("watch", "--poll"),
        ("watch", "--forecast-horizon"), ("sweep", "--vocab-size"),
    }  # fmt: skip
    for command, option in NUMBERS:
        read = option.callback.check.read  # type: ignore[attr-defined]
        annotation = option.type_descriptor.annotation  # type: ignore[attr-defined]
        assert read(" 12 ") == 12 and read("abc") == "abc", (command, option.opts)  # type: ignore[attr-defined]
        assert (read("2.5") == "2.5") if annotation is not float else (read("2.5") == 2.5), (command, option.opts)  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("command", "option"),
    NUMBERS,
    ids=[f"{c} {max(o.opts, key=len)}" for c, o in NUMBERS],  # type: ignore[attr-defined]
)
@pytest.mark.parametrize("text", ["abc", "", "1,5"])
def test_a_non_number_is_the_template_line(
    capsys: pytest.CaptureFixture, tmp_path: Path, command: str, option: object, text: str
) -> None:
    """Not typer's "Invalid value ... is not a valid integer" with a usage block: the same line as a number out of
    range, the text quoted as given."""
    check = option.callback.check  # type: ignore[attr-defined]
    name = max(option.opts, key=len)  # type: ignore[attr-defined]
    paths = {"compare": [DUMP, DUMP], "watch": [str(tmp_path)]}.get(command, [DUMP])
    code, out, err = run(capsys, command, *paths, name, text)
    assert (code, out, err) == (2, "", f"rcdiag: error: {name} must be {check.what}, got {text!r}\n")


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (("analyze", DUMP, "--chunk-tokens", "abc"), "--chunk-tokens must be a number of tokens from 1 to 1,099,511,627,776, got 'abc'"),
        (("analyze", DUMP, "--workers", "two"), "--workers must be an integer >= 1 or 'auto', got 'two'"),
        (("analyze", DUMP, "--micro-batch-size", "2.5"), "--micro-batch-size must be a number of rows >= 1, got '2.5'"),
        (("compare", DUMP, DUMP, "--temperature-a", "hot"), "--temperature-a must be a positive number, got 'hot'"),
        (("check", DUMP, "--tolerate", "ten%"), "--tolerate must be a fraction in [0, 1), got 'ten%'"),
        (("sweep", DUMP, "--target-reject", "1e"), "--target-reject must be a probability in [0, 1], got '1e'"),
        (("watch", ".", "--poll", "1s"), "--poll must be a number of seconds >= 0.01, got '1s'"),
    ],
)  # fmt: skip
def test_a_non_number_names_the_flag(capsys: pytest.CaptureFixture, args: tuple[str, ...], line: str) -> None:
    assert run(capsys, *args) == (2, "", f"rcdiag: error: {line}\n")


def test_number_texts_read_as_before(capsys: pytest.CaptureFixture) -> None:
    """What typer accepted still passes: ``int`` and ``float`` syntax, blanks around, ``_`` between digits, zeros
    after an integer's point; a float flag's value is a float."""
    assert [integer_text(t) for t in ("7", " 7 ", "1_000", "2.0", "2.", "-3", "2.5", "1e3", ".0", "0x10")] == [
        7, 7, 1000, 2, 2, -3, "2.5", "1e3", ".0", "0x10",
    ]  # fmt: skip
    assert [number_text(t) for t in ("1", " 1e-3 ", "1_0", "inf", "x", "")] == [1.0, 1e-3, 10.0, float("inf"), "x", ""]
    assert type(number_text(1)) is float and number_text(True) is True and integer_text(3) == 3
    code, out, err = run(
        capsys, "analyze", DUMP, "--chunk-tokens", "1_000.0", "--workers", " AUTO ", "--format", "json"
    )
    assert code == 0 and '"rollout_is"' in out, err


def test_the_checks_and_their_boundaries() -> None:
    assert probability()(1.0, "--p") == 1.0 and probability()(0, "--p") == 0
    with pytest.raises(ConfigError, match=r"^--p must be a fraction in \[0, 1\), got 1$"):
        probability(below_one=True)(1, "--p")
    with pytest.raises(ConfigError, match=r"^--p must be a probability in \[0, 1\], got nan$"):
        probability()(float("nan"), "--p")
    assert count(1, 3)(3, "n") == 3
    with pytest.raises(ConfigError, match=r"^n must be an integer from 1 to 3, got 4$"):
        count(1, 3)(4, "n")
    with pytest.raises(ConfigError, match=r"^n must be an integer >= 1, got True$"):
        count(1)(True, "n")
    with pytest.raises(ConfigError, match=r"^n must be an integer >= 0, got '1'$"):
        count(0)("1", "n")
    assert duration(0.01)(0.01, "--poll") == 0.01
    with pytest.raises(ConfigError, match=r"^--poll must be a number of seconds >= 0.01, got 0.005$"):
        duration(0.01)(0.005, "--poll")
    with pytest.raises(ConfigError, match=r"^t must be a positive number, got 0$"):
        positive()(0, "t")
    with pytest.raises(ConfigError, match=r"^s must be one of a, b, got 'c'$"):
        choice(("a", "b"))("c", "s")


def test_library_keywords_name_themselves() -> None:
    for field, value, what in [
        ("workers", 0, "an integer >= 1 or 'auto'"),
        ("chunk_tokens", 0, "a number of tokens from 1 to 1,099,511,627,776"),
        ("vocab_size", 0, "a number of token ids >= 1"),
        ("on_bad_row", "drop", "one of error, skip"),
    ]:
        with pytest.raises(ConfigError) as caught:
            rcdiag.ReadOptions(**{field: value})  # type: ignore[arg-type]
        assert str(caught.value) == f"{field} must be {what}, got {value!r}"


def test_section_and_sweep_keywords_name_themselves() -> None:
    """The micro-batch settings, explain's ``worst``, the sweep's grid and ``ray_address`` take the template too,
    with the same words as their flags (``rcdiag.settings.section_options``)."""
    from rcdiag.explain.section import ExplainSection
    from rcdiag.microbatch import MicroBatchSettings
    from rcdiag.sweep import build_grid

    rs = "token_k1, token_k2, token_k3, seq_sum_k1, seq_sum_k2, seq_sum_k3, seq_mean_k1, seq_mean_k2, seq_mean_k3"
    for build, message in [
        (lambda: MicroBatchSettings(micro_batch_size=0), "micro_batch_size must be a number of rows >= 1, got 0"),
        (lambda: MicroBatchSettings(mini_batch_size=2.0), "mini_batch_size must be a number of rows >= 1, got 2.0"),
        (lambda: MicroBatchSettings(dp_size=True), "dp_size must be a number of ranks >= 1, got True"),
        (lambda: MicroBatchSettings(max_token_len=0, prompt_len=1), "max_token_len must be a number of tokens >= 1, got 0"),
        (lambda: MicroBatchSettings(prompt_len=-1, balance_batch=True), "prompt_len must be a number of tokens >= 0, got -1"),
        (lambda: ExplainSection(worst=-1), "worst must be a number of responses >= 0, got -1"),
        (lambda: build_grid(is_levels=["geometric"]), "is_levels must be one of token, sequence, got 'geometric'"),
        (lambda: build_grid(rs_options=["seq_max_k1"]), f"rs_options must be one of {rs}, seq_max_k2, seq_max_k3, got 'seq_max_k1'"),
        (lambda: build_grid(rs_options=["token_k1"], thresholds=[" "]), "thresholds must be one or more threshold specs, got [' ']"),
        (lambda: rcdiag.ReadOptions(ray_address=" "), "ray_address must be a Ray address (host:port, ray://host:port or auto; empty: an unset variable?), got ' '"),
    ]:  # fmt: skip
        with pytest.raises(ConfigError) as caught:
            build()
        assert str(caught.value) == message
    assert MicroBatchSettings(prompt_len=0, balance_batch=True).prompt_len == 0  # the boundaries pass
    assert MicroBatchSettings(micro_batch_size=1).micro_batch_size == 1 and ExplainSection(worst=0).worst == 0


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (("--is", "tok"), "--is must be one of token, sequence, got 'tok'"),
        (("--rs", "token_k1,seq_max_k1"), "--rs must be one of token_k1, "),
        (("--rs", "token_k1", "--thresholds", ","), "--thresholds must be one or more threshold specs, got []"),
    ],
)
def test_the_sweep_grid_names_its_flags(capsys: pytest.CaptureFixture, args: tuple[str, ...], line: str) -> None:
    code, out, err = run(capsys, "sweep", DUMP, *args)
    assert code == 2 and out == "" and err.startswith(f"rcdiag: error: {line}") and err.count("\n") == 1, err


def test_environment_variables_name_themselves(monkeypatch: pytest.MonkeyPatch) -> None:
    from rcdiag.io.storage import RETRY_LIMIT

    monkeypatch.setenv(RETRY_LIMIT.env, "-2")
    with pytest.raises(SettingError) as caught:
        RETRY_LIMIT.seconds()
    assert str(caught.value) == (
        f"the environment variable {RETRY_LIMIT.env} must be a positive number of seconds, got '-2'"
    )


def test_pyproject_keys_name_table_and_file(capsys: pytest.CaptureFixture, tmp_path: Path, monkeypatch) -> None:
    (tmp_path / "pyproject.toml").write_text("[tool.rcdiag.check]\ntolerate = 1.5\n[tool.rcdiag.check.max]\nkl = 1\n")
    monkeypatch.chdir(tmp_path)
    code, _, err = run(capsys, "check", DUMP)
    assert (code, err) == (
        2,
        "rcdiag: error: [tool.rcdiag.check] tolerate in pyproject.toml must be a fraction in [0, 1), got 1.5\n",
    )
