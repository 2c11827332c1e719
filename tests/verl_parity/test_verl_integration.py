"""``python -m rcdiag.integrations.verl``: verl's REAL rollout-correction step, wrapped, returns exactly what it
returns unwrapped, and the dump it writes gives, through ``rcdiag analyze``, the metrics verl itself returned; the
command line reaches a real Hydra main without rcdiag's overrides and with the Ray runtime environment that wraps
the step in verl's workers."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from conftest import ROOT, assert_metrics_close, missing, require
from verl_oracle import verl_root

from rcdiag.integrations.verl.hook import DUMP_DIR_ENV, training_step
from rcdiag.integrations.verl.launch import SETUP_HOOK, parse, summary
from rcdiag.io.dump_writer import DumpWriter
from rcdiag.runtime.errors import ConfigError

VERL_DEPS = ("tensordict", "omegaconf", "transformers", "codetiming", "orjson")
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests")])}


def installed(module: str) -> bool:
    """Whether ``module`` can be imported from sys.path: what a fresh process sees, whatever this one holds in
    sys.modules (the verl oracle keeps verl's modules, and package stubs have no spec)."""
    return importlib.machinery.PathFinder.find_spec(module) is not None


def require_real_verl(version: str) -> str:
    """The directory holding release ``version``'s ``verl`` package, with what its DataProto imports."""
    root = verl_root(version)
    if root is None:
        missing(f"verl-{version}")
    if not installed("torch"):
        missing("torch")
    for module in VERL_DEPS:
        if not installed(module):
            missing("verl-deps")
    return str(Path(root).parent)


def rcdiag_json(*args: str) -> dict:
    result = subprocess.run([sys.executable, "-m", "rcdiag", *args, "--format", "json"], capture_output=True,
                            text=True, env=ENV, timeout=600)  # fmt: skip
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


@pytest.mark.verl
@pytest.mark.parametrize("version", ["0.9.0", "0.8.0", "0.7.1"])
def test_the_wrapped_step_changes_nothing_and_its_dump_gives_verls_metrics(tmp_path: Path, version: str) -> None:
    dump, out = tmp_path / "dump", tmp_path / "verl.json"
    result = subprocess.run([sys.executable, str(ROOT / "tests" / "verl_wrapped_step.py"), require_real_verl(version),
                             str(dump), str(out)], capture_output=True, text=True, env=ENV, timeout=600)  # fmt: skip
    assert result.returncode == 0, result.stderr  # the script asserts identical batches and metrics
    verl = json.loads(out.read_text())

    # the refused step (a NaN log-prob) is one notice, and no part; training went on
    assert len(verl["notices"]) == 1
    assert verl["notices"][0].startswith(f"rcdiag: step 9 was not dumped to {dump}: ValueError: row 0, position 0:")
    assert sorted(p.name for p in dump.iterdir()) == ["step-000000007-0000.parquet", "step-000000008-0000.parquet"]

    table = pq.read_table(dump)
    assert table.column_names == ["old_log_prob", "rollout_log_prob", "response_mask", "step", "temperature",
                                  "token_ids"]  # fmt: skip
    assert set(table.column("temperature").to_pylist()) == {0.7}
    steps = table.column("step").to_pylist()
    ids = table.column("token_ids").to_pylist()
    for step in (7, 8):
        assert [row for row, s in zip(ids, steps, strict=True) if s == step] == verl["token_ids"][str(step)]
    metadata = {k.decode(): v.decode() for k, v in table.schema.metadata.items()}
    assert metadata["verl.version"] == version and metadata["rcdiag.integration"] == "rcdiag.integrations.verl"
    assert json.loads(metadata["verl.rollout_correction"])["rollout_rs"] == "token_k1"

    report = rcdiag_json("analyze", str(dump), "--verl-version", version, "--is", "token", "--is-threshold", "2.0",
                         "--rs", "token_k1", "--rs-threshold", "0.5_2.0")  # fmt: skip
    assert [s["step"] for s in report["steps"]] == [7, 8]
    for step in report["steps"]:
        assert_metrics_close(_rollout_corr(step["metrics"]), verl["metrics"][str(step["step"])])


FAKE_MAIN = """
import json, os, sys
import hydra
from omegaconf import OmegaConf

@hydra.main(config_path=".", config_name="fake", version_base=None)
def main(config):
    from verl.trainer.ppo import rollout_corr_helper as helper
    record = {
        "argv": sys.argv[1:],
        "config": OmegaConf.to_container(config),
        "env": os.environ.get("RCDIAG_VERL_DUMP_DIR"),
        "wrapped": getattr(helper.compute_rollout_correction_and_add_to_batch, "rcdiag_dumper", None) is not None,
    }
    with open(os.environ["FAKE_OUT"], "w") as handle:
        json.dump(record, handle)

if __name__ == "__main__":
    main()
"""


@pytest.fixture
def fake_main(tmp_path: Path) -> Path:
    """A real Hydra main with verl's ``ray_kwargs.ray_init`` layout (struct mode, as verl's config is)."""
    if not installed("hydra"):
        missing("verl-deps")
    (tmp_path / "fake_main.py").write_text(textwrap.dedent(FAKE_MAIN))
    (tmp_path / "fake.yaml").write_text("trainer:\n  total_epochs: 1\nray_kwargs:\n  ray_init:\n    num_cpus: null\n")
    return tmp_path


def launch(fake: Path, *args: str) -> subprocess.CompletedProcess:
    path = os.pathsep.join([str(fake), require_real_verl("0.9.0"), str(ROOT)])
    env = {**os.environ, "PYTHONPATH": path, "FAKE_OUT": str(fake / "out.json")}
    env.pop(DUMP_DIR_ENV, None)
    return subprocess.run([sys.executable, "-m", "rcdiag.integrations.verl", *args], capture_output=True, text=True,
                          cwd=fake, env=env, timeout=600)  # fmt: skip


@pytest.mark.verl
def test_hydra_gets_verls_arguments_and_the_ray_runtime_env(fake_main: Path) -> None:
    dump = fake_main / "dumps dir" / "it's here"  # a space and a quote survive Hydra's parser
    result = launch(fake_main, "trainer.total_epochs=3", f"+rcdiag.dump_dir={dump.relative_to(fake_main)}",
                    "+rcdiag.main=fake_main", "+trainer.name='a b'")  # fmt: skip
    assert result.returncode == 0, result.stderr
    record = json.loads((fake_main / "out.json").read_text())
    assert record["wrapped"] is True  # the step is wrapped in the launching process too
    assert record["env"] == str(dump)
    assert not any("rcdiag.dump_dir" in a or "rcdiag.main" in a for a in record["argv"])
    assert record["config"] == {
        "trainer": {"total_epochs": 3, "name": "a b"},
        "ray_kwargs": {"ray_init": {"num_cpus": None, "runtime_env": {
            "worker_process_setup_hook": SETUP_HOOK, "env_vars": {DUMP_DIR_ENV: str(dump)}}}},
    }  # fmt: skip
    assert result.stderr.splitlines()[-1] == (
        f"rcdiag: no step was dumped to {dump}: verl runs its rollout-correction step only with "
        "actor_rollout_ref.rollout.calculate_log_probs=true, algorithm.rollout_correction set and bypass_mode=false"
    )


RAY_MAIN = """
import json, os
import hydra
import ray
from omegaconf import OmegaConf

@hydra.main(config_path=".", config_name="fake_ray", version_base=None)
def main(config):
    ray.init(**OmegaConf.to_container(config.ray_kwargs.ray_init))

    @ray.remote
    class TaskRunner:  # as verl's main_ppo runs its trainer: in a Ray worker process
        def run(self):
            import torch
            from verl.protocol import DataProto
            from verl.trainer.ppo import rollout_corr_helper as helper

            step = helper.compute_rollout_correction_and_add_to_batch
            data = DataProto.from_dict(
                tensors={"old_log_probs": torch.tensor([[-0.5, -1.0]]), "rollout_log_probs": torch.tensor([[-0.4, -1.1]]),
                         "response_mask": torch.tensor([[1, 1]])},
                meta_info={"temperature": 1.0, "global_steps": 3},
            )
            _, metrics = step(data, OmegaConf.create({"rollout_is": None}))
            return getattr(step, "rcdiag_dumper", None) is not None, os.getpid(), metrics

    wrapped, pid, metrics = ray.get(TaskRunner.remote().run.remote())
    with open(os.environ["FAKE_OUT"], "w") as handle:
        json.dump({"wrapped": wrapped, "worker_pid": pid, "driver_pid": os.getpid(), "metrics": metrics}, handle)
    ray.shutdown()

if __name__ == "__main__":
    main()
"""


@pytest.mark.verl
def test_the_step_is_wrapped_in_verls_ray_worker(fake_main: Path) -> None:
    """verl runs its trainer in a Ray actor: the runtime environment's setup hook wraps the step there."""
    require("ray", "ray")
    (fake_main / "fake_ray_main.py").write_text(RAY_MAIN)
    (fake_main / "fake_ray.yaml").write_text(
        "ray_kwargs:\n  ray_init:\n    address: local\n    num_cpus: 1\n    include_dashboard: false\n"
    )
    dump = fake_main / "dump"
    result = launch(fake_main, "+rcdiag.main=fake_ray_main", f"+rcdiag.dump_dir={dump}")
    assert result.returncode == 0, result.stderr
    record = json.loads((fake_main / "out.json").read_text())
    assert record["wrapped"] is True and record["worker_pid"] != record["driver_pid"]
    assert (
        result.stderr.splitlines()[-1] == f"rcdiag: dumped 1 step(s) to {dump}; read them with: rcdiag analyze {dump}"
    )
    report = rcdiag_json("analyze", str(dump))
    assert [s["step"] for s in report["steps"]] == [3]
    assert_metrics_close(_rollout_corr(report["steps"][0]["metrics"]), record["metrics"])


LAZY_WORKER = """
import inspect, os, sys
from pathlib import Path
sys.path.insert(0, sys.argv[1])
os.environ["RCDIAG_VERL_DUMP_DIR"] = sys.argv[2]
from rcdiag.integrations.verl.hook import HELPER, setup_worker
setup_worker()
setup_worker()  # Ray may run it once per worker only, but twice must not wrap twice
assert "verl" not in sys.modules, "the hook imported verl before the worker did"
from verl.trainer.ppo.rollout_corr_helper import compute_rollout_correction_and_add_to_batch as step
assert step.rcdiag_dumper.directory == Path(sys.argv[2])
assert getattr(step.__wrapped__, "rcdiag_dumper", None) is None
assert "def compute_rollout_correction_and_add_to_batch" in inspect.getsource(step.__wrapped__)
print("ok")
"""


@pytest.mark.verl
def test_a_worker_wraps_the_step_only_when_verl_imports_it(tmp_path: Path) -> None:
    """The setup hook runs in every Ray worker (rollout and GPU workers too): it imports nothing itself, so no
    worker imports verl, torch or CUDA earlier than it would; the step is wrapped as its module loads."""
    script = tmp_path / "worker.py"
    script.write_text(LAZY_WORKER)
    result = subprocess.run([sys.executable, str(script), require_real_verl("0.9.0"), str(tmp_path / "d")],
                            capture_output=True, text=True, env=ENV, timeout=600)  # fmt: skip
    assert result.returncode == 0 and result.stdout == "ok\n", result.stderr


@pytest.mark.verl
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["a=1"], "give the dump directory: python -m rcdiag.integrations.verl <verl's arguments> "
                  "+rcdiag.dump_dir=DIR [+rcdiag.main=MODULE]"),
        (["+rcdiag.dump=x"], "unknown option +rcdiag.dump: rcdiag takes +rcdiag.dump_dir and +rcdiag.main"),
        (["+rcdiag.dump_dir=s3://b/d"], "+rcdiag.dump_dir must be a local directory, got s3://b/d"),
        (["+rcdiag.dump_dir=d", "+rcdiag.main=no_such_trainer"],
         "no module named no_such_trainer to run (+rcdiag.main names verl's entry module)"),
    ],
)  # fmt: skip
def test_bad_rcdiag_options_are_one_line_exit_2(fake_main: Path, args: list[str], message: str) -> None:
    result = launch(fake_main, *args)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr == f"rcdiag: error: {message}\n"
    assert not (fake_main / "d").exists()


def test_without_verl_one_line_says_so(tmp_path: Path) -> None:
    if installed("verl"):
        pytest.skip("verl is installed in this environment")  # not a missing component: the case cannot be made
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    result = subprocess.run([sys.executable, "-m", "rcdiag.integrations.verl", "+rcdiag.dump_dir=d"],
                            capture_output=True, text=True, cwd=tmp_path, env=env, timeout=600)  # fmt: skip
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr == ("rcdiag: error: cannot import verl's rollout-correction step (No module named 'verl'); "
                             "is verl installed?\n")  # fmt: skip


def test_parse_keeps_verls_arguments_in_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    parsed = parse(["a=1", "++rcdiag.dump_dir='d'", "b=2", "rcdiag.main=x.y"])
    assert parsed.dump_dir == tmp_path / "d" and parsed.main == "x.y"
    assert parsed.argv[:2] == ("a=1", "b=2") and len(parsed.argv) == 4
    with pytest.raises(ConfigError, match=r"^\+rcdiag.dump_dir needs a value"):
        parse(["+rcdiag.dump_dir="])


def test_the_step_is_verls_global_steps() -> None:
    class Batch:
        meta_info: dict = {}  # noqa: RUF012

    class Trainer:
        global_steps = 42

        def frame(self) -> object:
            return sys._getframe(0)

    assert training_step(Batch(), Trainer().frame(), calls=3) == 42
    with_meta = Batch()
    with_meta.meta_info = {"global_steps": 5}
    assert training_step(with_meta, Trainer().frame(), calls=3) == 5
    assert training_step(Batch(), None, calls=3) == 3


def test_the_summary_counts_steps(tmp_path: Path) -> None:
    writer = DumpWriter(tmp_path)
    for step in (1, 1, 2):
        writer.write(step=step, old_log_prob=[[-0.5]], rollout_log_prob=[[-0.4]])
    assert summary(tmp_path) == f"rcdiag: dumped 2 step(s) to {tmp_path}; read them with: rcdiag analyze {tmp_path}"


def test_the_writer_keeps_one_schema_for_its_optional_columns(tmp_path: Path) -> None:
    writer = DumpWriter(tmp_path)
    writer.write(step=1, old_log_prob=[[-0.5, -1.0]], rollout_log_prob=[[-0.4, -1.0]], response_mask=[[1, 0]],
                 temperature=0.6, token_ids=[[11, 12]])  # fmt: skip
    with pytest.raises(ValueError, match=r"step 2 gives no optional column but .* holds steps with temperature and "
                                         "token_ids"):  # fmt: skip
        writer.write(step=2, old_log_prob=[[-0.5]], rollout_log_prob=[[-0.4]])
    with pytest.raises(ValueError, match="row 0, position 0: token_ids holds -1, not a token id"):
        writer.write(step=2, old_log_prob=[[-0.5]], rollout_log_prob=[[-0.4]], temperature=0.6, token_ids=[[-1]])
    with pytest.raises(ValueError, match="row 0: old_log_prob, rollout_log_prob and token_ids have 1, 1 and 2 tokens"):
        writer.write(step=2, old_log_prob=[[-0.5]], rollout_log_prob=[[-0.4]], temperature=0.6, token_ids=[[1, 2]])
    with pytest.raises(ValueError, match="temperature must be a finite number >= 0"):
        writer.write(step=2, old_log_prob=[[-0.5]], rollout_log_prob=[[-0.4]], temperature=float("nan"))
    assert pq.read_table(tmp_path).to_pydict() == {
        "old_log_prob": [[-0.5]], "rollout_log_prob": [[-0.4000000059604645]], "response_mask": [[1]], "step": [1],
        "temperature": [0.6], "token_ids": [[11]],
    }  # fmt: skip


def test_help_says_how_to_run_it() -> None:
    result = subprocess.run([sys.executable, "-m", "rcdiag.integrations.verl", "--help"], capture_output=True,
                            text=True, env=ENV, timeout=600)  # fmt: skip
    assert result.returncode == 0 and result.stderr == ""
    assert result.stdout.startswith("usage: python -m rcdiag.integrations.verl <verl's arguments> +rcdiag.dump_dir=DIR")


def _rollout_corr(metrics: dict) -> dict:
    """The ``rollout_corr/*`` keys of a step: what the wrapped rollout correction logs (verl's trainer logs the
    ``training/*`` debug metrics elsewhere, when it recomputes old_log_probs; tests/verl_parity/test_verl_debug_metrics.py)."""
    return {k: v for k, v in metrics.items() if k.startswith("rollout_corr/")}
