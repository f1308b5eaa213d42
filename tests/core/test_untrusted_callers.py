"""Each kind of untrusted file goes through `pipeline.core.untrusted`: a FIFO, /dev/zero, a directory, JSON 100,000
deep and a 5,000-digit integer are one line of the kind's error, without hanging or reading the device."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.core.errors import BenchError, CalibrationError, PipelineError, RegistryError, SpecError
from pipeline.core.hub_entry import read_config
from pipeline.planning.slo_search import read_bench_terms
from pipeline.serving.dataset import load_dataset
from pipeline.stages.calibrate.data import load_texts

ROOT = Path(__file__).resolve().parents[2]
DEEP = "[" * 100_000 + "]" * 100_000
HUGE_INT = "1" * 5000


@pytest.fixture(autouse=True)
def _deadline(deadline):
    """Every test here fails instead of hanging (conftest's `deadline`)."""


@pytest.fixture(params=["fifo", "device", "directory"])
def not_a_file(request, tmp_path) -> Path:
    if request.param == "fifo":
        os.mkfifo(tmp_path / "fifo")
        return tmp_path / "fifo"
    return Path("/dev/zero") if request.param == "device" else tmp_path


READERS = {
    "bench report": (lambda p: read_bench_terms(p, model="m", precision=None), SpecError),
    "dataset": (load_dataset, BenchError),
    "calibration data": (load_texts, CalibrationError),
    "hub config": (lambda p: read_config(Path(p), where="org/x@main"), RegistryError),
}


@pytest.mark.parametrize("kind", READERS)
def test_not_a_regular_file_is_refused(kind, not_a_file):
    reader, error = READERS[kind]
    with pytest.raises(error, match="not a regular file") as exc:
        reader(not_a_file)
    assert "\n" not in str(exc.value) and exc.value.exit_code == 2


@pytest.mark.parametrize("kind, name, text, needle", [
    ("bench report", "r.json", DEEP, "nested too deeply"),
    ("bench report", "r.json", '{"acceptance_rate": ' + HUGE_INT + "}", "more than 100 digits"),
    ("dataset", "d.jsonl", '{"prompt": "x", "n": ' + DEEP + "}\n", "line 1 is JSON nested too deeply"),
    ("dataset", "d.json", "[" + DEEP + "]", "record 1: nested over 1,000 levels deep"),
    ("dataset", "d.jsonl", '{"prompt": "x", "output_len": ' + HUGE_INT + "}\n", "more than 100 digits"),
    ("calibration data", "c.jsonl", DEEP + "\n", "nested too deeply"),
    ("calibration data", "c.jsonl", '{"text": "a", "n": ' + HUGE_INT + "}\n", "more than 100 digits"),
    ("hub config", "config.json", DEEP, "nested too deeply"),
    ("hub config", "config.json", '{"hidden_size": ' + HUGE_INT + "}", "more than 100 digits"),
])
def test_hostile_json_is_one_line(tmp_path, kind, name, text, needle):
    reader, error = READERS[kind]
    (f := tmp_path / name).write_text(text)
    with pytest.raises(error, match=needle) as exc:
        reader(f)
    assert "\n" not in str(exc.value) and exc.value.exit_code == 2


def test_a_dataset_array_record_is_capped_while_it_is_read(tmp_path, monkeypatch):
    import pipeline.serving.dataset as dataset

    monkeypatch.setattr(dataset, "MAX_RECORD_BYTES", 1 << 16)
    (f := tmp_path / "d.json").write_text('[{"prompt": "a"}, {"prompt": "' + "x" * (1 << 17) + '"}]')
    with pytest.raises(BenchError, match="record 2: over the 65,536-byte cap of one record"):
        load_dataset(f)


def test_a_ref_that_is_a_fifo_is_refused(tmp_path, monkeypatch):
    from pipeline.core import refs

    monkeypatch.setattr(refs, "ref_path", lambda stage, identity: tmp_path / "ref.json")
    os.mkfifo(tmp_path / "ref.json")
    with pytest.raises(PipelineError, match="is a FIFO, not a regular file; delete it and run `invoke build`"):
        refs.read_ref("compile", "x")


def test_a_precision_search_record_that_is_a_device_is_refused():
    from pipeline.core.manifests import PrecisionSearch

    with pytest.raises(PipelineError, match="is a character device, not a regular file"):
        PrecisionSearch.read(Path("/dev/zero"))


@pytest.mark.parametrize("args", [["--spec", "/dev/zero"], ["--model", "tiny-llama", "--models-file", "FIFO"]])
def test_check_refuses_a_device_or_fifo_spec_in_one_line(tmp_path, args):
    os.mkfifo(fifo := tmp_path / "models.yaml")
    args = [str(fifo) if a == "FIFO" else a for a in args]
    r = subprocess.run([sys.executable, "-m", "invoke", "check", *args], cwd=ROOT, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip().count("\n") == 0 and "not a regular file" in r.stderr


def _dir_readers():
    from pipeline.core.artifacts import read_manifest
    from pipeline.core.errors import CompileError, DeployError, PackageError
    from pipeline.core.tokenizer import identity
    from pipeline.ops.deploy.source import from_release
    from pipeline.serving.token_count import load_tokenizer
    from pipeline.stages.calibrate.checkpoint import CheckpointError
    from pipeline.stages.calibrate.hf_checkpoint import read_quant_config
    from pipeline.stages.compile.checkpoint_config import read_checkpoint_config
    from pipeline.stages.package.package import read_engine_source

    return {  # kind -> (reader of a directory, the file it reads there, error)
        "checkpoint config": (read_checkpoint_config, "config.json", CompileError),
        "engine config": (read_engine_source, "config.json", PackageError),
        "stage manifest": (read_manifest, "manifest.json", PipelineError),
        "tokenizer identity": (identity, "tokenizer.json", PipelineError),
        "bench tokenizer": (load_tokenizer, "tokenizer.json", PipelineError),
        "ModelOpt quant config": (read_quant_config, "hf_quant_config.json", CheckpointError),
        "release directory": (from_release, "release.json", DeployError),
    }


DIR_KINDS = ["checkpoint config", "engine config", "stage manifest", "tokenizer identity", "bench tokenizer",
             "ModelOpt quant config", "release directory"]


@pytest.mark.parametrize("kind", DIR_KINDS)
@pytest.mark.parametrize("hostile", ["fifo", "device", "deep", "huge int"])
def test_files_inside_a_given_directory_are_read_through_untrusted(tmp_path, kind, hostile):
    """A checkpoint, engine, tokenizer or release directory the user points at: the JSON file in it that is a FIFO,
    a link to /dev/zero, JSON 100,000 deep or holds a 5,000-digit integer is one line of the reader's error."""
    reader, name, error = _dir_readers()[kind]
    target = tmp_path / name
    if hostile == "fifo":
        os.mkfifo(target)
    elif hostile == "device":
        target.symlink_to("/dev/zero")
    else:
        target.write_text(DEEP if hostile == "deep" else '{"n": ' + HUGE_INT + "}")
    if name == "tokenizer.json" and hostile in ("fifo", "device"):  # no regular file: the directory has no tokenizer
        if kind == "bench tokenizer":
            assert reader(tmp_path) is None  # bench then counts without one, never opening the FIFO
            return
        with pytest.raises(error, match="has no tokenizer.json or tokenizer.model"):
            reader(tmp_path)
        return
    with pytest.raises(error) as exc:
        reader(tmp_path)
    msg = str(exc.value)
    assert "\n" not in msg and exc.value.exit_code in (2, 3)
    assert any(s in msg for s in ("not a regular file", "nested too deeply", "more than 100 digits",
                                  "cannot be loaded")), msg


def test_an_hf_index_naming_a_file_outside_the_checkpoint_is_refused(tmp_path):
    from pipeline.stages.calibrate.checkpoint import CheckpointError
    from pipeline.stages.calibrate.hf_checkpoint import _tensors

    (tmp_path / "model.safetensors.index.json").write_text('{"weight_map": {"w": "../../etc/passwd"}}')
    with pytest.raises(CheckpointError, match="'weight_map' must map tensors to .safetensors files in that directory"):
        _tensors(tmp_path)
