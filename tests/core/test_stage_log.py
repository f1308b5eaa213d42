"""stage_log: library output (prints, warnings, logging, native fd writes) goes to the log; our progress does not."""

from __future__ import annotations

import io
import logging
import os
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from pipeline.core import stage_log as sl

ROOT = Path(__file__).resolve().parents[2]


def test_library_output_goes_to_the_log_and_progress_to_the_console(tmp_path, capfd, monkeypatch):
    from transformers.utils import logging as hf_logging

    monkeypatch.setattr(sl, "PERIOD_S", 0.0)
    hf_logger = hf_logging.get_logger("transformers.modeling_utils")  # transformers' own stderr handler
    log = tmp_path / "logs" / "stage.log"
    print("ours before", file=sys.stderr)
    with sl.stage_log(log, title="calibrate x") as path:
        print("lib stdout print")
        print("lib stderr print", file=sys.stderr)
        warnings.warn("lib python warning", UserWarning, stacklevel=1)
        hf_logger.warning("lib logging record")
        os.write(1, b"native fd1\n")
        os.write(2, b"native fd2\n")
        assert list(sl.progress(range(3), desc="calibrate tiny", unit="batch")) == [0, 1, 2]
    print("ours after", file=sys.stderr)
    out, err = capfd.readouterr()
    assert path == log
    text = log.read_text()
    for chatter in ("lib stdout print", "lib stderr print", "UserWarning: lib python warning", "lib logging record",
                    "native fd1", "native fd2"):
        assert chatter in text and chatter not in out + err, chatter
    assert text.startswith("# calibrate x (")
    assert out == ""
    assert err.splitlines() == ["ours before", "      calibrate tiny: 1/3 batch (33%) after 0s",
                                "      calibrate tiny: 2/3 batch (66%) after 0s",
                                "      calibrate tiny: 3/3 batch (100%) after 0s", "ours after"]


def test_a_handler_created_inside_is_pointed_back_at_stderr(tmp_path, capfd):
    lg = logging.getLogger("transformers.stage_log_test")
    try:
        with sl.stage_log(tmp_path / "a.log"):
            lg.addHandler(logging.StreamHandler())  # binds the (redirected) sys.stderr, as a lazy import would
            lg.propagate = False
            lg.warning("inside")
        lg.warning("outside")  # the first log file is closed: no ValueError, back on the console
        with sl.stage_log(tmp_path / "b.log"):
            lg.warning("inside again")
    finally:
        lg.handlers.clear()
        lg.propagate = True
    assert "outside" in capfd.readouterr().err
    assert "inside" in (tmp_path / "a.log").read_text() and "inside again" in (tmp_path / "b.log").read_text()


def test_progress_is_quiet_between_periods_and_uses_tqdm_on_a_terminal(monkeypatch):
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    plain, tty = io.StringIO(), Tty()
    monkeypatch.setattr(sl, "_consoles", [plain])
    assert sum(sl.progress(range(50), desc="quiet")) == sum(range(50))
    assert plain.getvalue() == ""  # 50 fast steps: shorter than PERIOD_S, no line
    monkeypatch.setattr(sl, "_consoles", [tty])
    assert list(sl.progress(iter("ab"), desc="bar", total=2, unit="step")) == ["a", "b"]
    assert tty.getvalue().startswith("\rbar:   0%|") and "0/2" in tty.getvalue()  # a tqdm bar, cleared after


def test_a_terminal_without_a_width_gets_plain_lines(monkeypatch):
    master, slave = os.openpty()  # a fresh pseudo-terminal: 0 columns, where tqdm would draw nothing
    try:
        with open(slave, "w", closefd=False) as tty:
            monkeypatch.setattr(sl, "_consoles", [tty])
            monkeypatch.setattr(sl, "PERIOD_S", 0.0)
            list(sl.progress(range(2), desc="work", unit="step"))
        assert b"work: 2/2 step (100%)" in os.read(master, 4096)
    finally:
        os.close(master)
        os.close(slave)


def test_nested_logs_keep_the_outer_console(tmp_path, capfd, monkeypatch):
    monkeypatch.setattr(sl, "PERIOD_S", 0.0)
    with sl.stage_log(tmp_path / "outer.log"), sl.stage_log(tmp_path / "inner.log"):
        print("inner chatter")
        list(sl.progress(range(1), desc="inner work"))
    err = capfd.readouterr().err
    assert "inner work: 1/1" in err and "inner chatter" not in err
    assert "inner chatter" in (tmp_path / "inner.log").read_text()
    assert "inner work" not in (tmp_path / "outer.log").read_text()


def test_the_log_is_restored_after_a_failure(tmp_path, capfd):
    with pytest.raises(RuntimeError, match="boom"), sl.stage_log(tmp_path / "f.log"):
        print("partial output")
        raise RuntimeError("boom")
    print("console again", file=sys.stderr)
    assert "console again" in capfd.readouterr().err
    assert "partial output" in (tmp_path / "f.log").read_text()


# Lines the libraries print during a tiny-llama fp8 build (issue 22); none may reach the console.
CHATTER = ("is incompatible with nvidia-modelopt", "lm_head quantization", "No module named 'tensorrt_llm'",
           "Trying the manual approach", "Inserted", "quantizers", "current rank", "Registered <class", "Warning",
           "warn(", "torch_dtype", "accelerate")
OURS = re.compile(r"^(\[\d+/\d+\] \w+: .*|compile: skipped \(.*\)|build done: .*|      \S.*: \d+/\d+ \w+ .*)$")


@pytest.mark.slow
def test_build_prints_only_our_lines_and_the_calibrate_log_holds_the_chatter(pipeline_env):
    env = dict(os.environ)  # PIPELINE_ROOT/PIPELINE_CACHE from the fixture; the generated models are there
    r = subprocess.run([sys.executable, "-m", "invoke", "build", "--model", "tiny-llama", "--precision", "fp8",
                        "--target", "reference", "--calib-size", "8", "--calib-seq-len", "64"],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    lines = r.stderr.splitlines()
    assert r.stdout == "" and lines and all(OURS.match(ln) for ln in lines), r.stderr
    assert not [ln for ln in lines if any(c in ln for c in CHATTER)], r.stderr
    stages = [ln.split(":")[0] for ln in lines if not ln.startswith(" ")]
    assert stages == [f"[{k}/4] {name}" for k, name in enumerate(("check", "download", "calibrate"), 1) for _ in "12"
                      ] + ["compile", "[4/4] package", "[4/4] package", "build done"]
    built = next(ln for ln in lines if ln.startswith("[3/4] calibrate: built"))
    log = Path(re.search(r"library output: (\S+calibrate\.log)\)", built).group(1))
    assert log.parent.parent == pipeline_env / "out" / "engines"
    text = log.read_text()
    for chatter in ("is incompatible with nvidia-modelopt", "Inserted", "quantizers", "current rank"):
        assert chatter in text, chatter
