"""The one Stage interface: every build stage implements it, and `build` runs the runtime row's stage list through it."""

from __future__ import annotations

import dataclasses

import pytest

from pipeline.core.errors import CalibrationError, CompileError, PackageError
from pipeline.core.runtimes import RUNTIMES, runtime_named
from pipeline.core.spec import BuildSpec, resolve_spec
from pipeline.stages import build as build_mod
from pipeline.stages.build import STAGES, build, locate_outputs
from pipeline.stages.calibrate.stage import CALIBRATE
from pipeline.stages.compile.stage import COMPILE
from pipeline.stages.download.stage import DOWNLOAD
from pipeline.stages.package.stage import PACKAGE
from pipeline.stages.stage import BuildOptions, BuildOutputs, Stage, StageOutcome

OBJECTS = {"download": DOWNLOAD, "calibrate": CALIBRATE, "compile": COMPILE, "package": PACKAGE}


@pytest.fixture
def spec(tmp_path, monkeypatch) -> BuildSpec:
    monkeypatch.setenv("PIPELINE_ROOT", str(tmp_path / "out"))
    monkeypatch.setenv("PIPELINE_CACHE", str(tmp_path / "cache"))
    return resolve_spec(model="tiny-llama", precision="fp8", target="reference")


@pytest.mark.parametrize("name", sorted(OBJECTS))
def test_every_stage_object_satisfies_the_protocol(name):
    stage = OBJECTS[name]
    assert isinstance(stage, Stage) and stage.name == name
    assert build_mod._BY_NAME[name] is stage  # build looks each one up once, by its name


def test_an_object_missing_a_member_is_not_a_stage():
    class NoLocate:
        name = "x"

        def identity(self, spec): return None

        def doing(self, spec): return ""

        def run(self, spec, outputs, options, *, force): return StageOutcome("x", "built", 0.0)

    assert not isinstance(NoLocate(), Stage) and not isinstance(object(), Stage)


def test_build_knows_a_stage_for_every_name_a_runtime_row_lists():
    listed = {name for row in RUNTIMES for name in row.stages}
    assert listed == set(build_mod._BY_NAME) == set(STAGES[1:])


def test_ref_stages_are_found_by_their_spec_identity_and_download_by_its_revision(spec):
    for stage in (CALIBRATE, COMPILE, PACKAGE):
        assert stage.identity(spec) == spec.identity(stage.name)
    assert len({CALIBRATE.identity(spec), COMPILE.identity(spec), PACKAGE.identity(spec)}) == 3
    assert DOWNLOAD.identity(spec) is None


@pytest.mark.parametrize("stage, error, needle", [
    (CALIBRATE, CalibrationError, "no current target checkpoint for tiny-llama fp8"),
    (COMPILE, CompileError, "no current target engine for tiny-llama fp8"),
    (PACKAGE, PackageError, "no current Triton repository for tiny-llama fp8"),
])
def test_locate_with_nothing_recorded_raises_the_stages_error(spec, stage, error, needle, tmp_path):
    out = BuildOutputs()
    with pytest.raises(error, match=needle):
        stage.locate(spec, out, BuildOptions(offline=True))
    assert out.results() == {} and not (tmp_path / "out").exists()


class Recorder:
    """A stage that records what build asked of it (no ref: identity None)."""

    def __init__(self, name: str, calls: list[tuple[str, str]]):
        self.name, self.calls = name, calls

    def identity(self, spec):
        return None

    def doing(self, spec):
        return f"doing {self.name}"

    def locate(self, spec, outputs, options):
        self.calls.append(("locate", self.name))

    def run(self, spec, outputs, options, *, force):
        self.calls.append(("run" + (" forced" if force else ""), self.name))
        return StageOutcome(self.name, "built", 0.0)


@pytest.fixture
def recorded(monkeypatch):
    """build with recording stages, over a row whose stage list a test sets."""
    calls: list[tuple[str, str]] = []
    stages = {name: Recorder(name, calls) for name in STAGES[1:]}
    assert all(isinstance(s, Stage) for s in stages.values())
    monkeypatch.setattr(build_mod, "_BY_NAME", stages)

    def with_row(runtime: str, stage_list: tuple[str, ...]) -> list[tuple[str, str]]:
        row = dataclasses.replace(runtime_named(runtime, "reference"), stages=stage_list)
        monkeypatch.setattr(build_mod, "runtime_of", lambda spec: row)
        return calls

    return with_row


def test_build_runs_the_rows_stage_list_in_its_order(spec, recorded):
    calls = recorded("engine", ("download", "package", "calibrate"))
    lines: list[str] = []
    report = build(spec, progress=lines.append)
    assert calls == [("run", "download"), ("run", "package"), ("run", "calibrate")]
    # the reference row does not compile: compile is reported skipped before the first stage after it
    assert [o.stage for o in report.stages] == ["check", "download", "compile", "package", "calibrate"]
    assert [line for line in lines if line.endswith(" ...")][1:] == [
        "[2/4] download: doing download ...", "[3/4] package: doing package ...", "[4/4] calibrate: doing calibrate ..."]


def test_build_runs_only_the_stages_the_row_lists(spec, recorded):
    calls = recorded("engine", ("download", "calibrate"))
    report = build(spec, progress=None)
    assert calls == [("run", "download"), ("run", "calibrate")]
    assert [o.stage for o in report.stages] == ["check", "download", "calibrate", "compile"]  # compile: skipped


def test_build_locates_the_stages_before_from_and_forces_from_force_on(spec, recorded):
    calls = recorded("engine", ("download", "calibrate", "package"))
    build(spec, from_stage="calibrate", force="package", progress=None)
    assert calls == [("locate", "download"), ("run", "calibrate"), ("run forced", "package")]


def test_build_stops_at_until_and_check_only_locates_every_stage(spec, recorded):
    calls = recorded("engine", ("download", "calibrate", "package"))
    build(spec, until="calibrate", progress=None)
    assert calls == [("run", "download"), ("run", "calibrate")]
    calls.clear()
    locate_outputs(spec)
    assert calls == [("locate", "download"), ("locate", "calibrate"), ("locate", "package")]


def test_a_compile_the_row_has_not_is_reported_skipped_in_its_place(spec, recorded):
    calls = recorded("pytorch", ("download", "calibrate", "package"))
    lines: list[str] = []
    report = build(spec, progress=lines.append)
    assert calls == [("run", "download"), ("run", "calibrate"), ("run", "package")]
    assert [(o.stage, o.status) for o in report.stages] == [
        ("check", "ok"), ("download", "built"), ("calibrate", "built"), ("compile", "skipped"), ("package", "built")]
    assert "compile: skipped (no-op, nothing to compile: runtime pytorch loads the Hugging Face checkpoint at serve " \
           "time)" in lines
    report = build(spec, until="compile", progress=None)
    assert [o.stage for o in report.stages][-1] == "compile"
