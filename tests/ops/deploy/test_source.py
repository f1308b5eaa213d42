"""What a deployment fetches: the release file name `invoke release` writes, and a recorded name checked first."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import pytest

from pipeline import __version__
from pipeline.cli.commands import deploy_command
from pipeline.core.errors import DeployError, ReleaseError
from pipeline.core.layout import release_file, release_name
from pipeline.core.spec import resolve_spec
from pipeline.ops.deploy.source import from_release, from_spec
from pipeline.planning.limits_choice import choose_limits
from tests.support.k8s import PIPELINE_IMAGE


def _release_dir(tmp_path, name: str):
    spec = resolve_spec(model="llama-70b", precision="fp8", tp=4)
    rel = tmp_path / "rel"
    rel.mkdir()
    (rel / "release.json").write_text(json.dumps({"format": 1, "name": name, "spec": spec.model_dump(mode="json"),
                                                  "files": {}}))
    return rel


def test_a_recorded_name_that_leaves_the_directory_is_refused(tmp_path):
    rel = _release_dir(tmp_path, "../../PWNED")
    with pytest.raises(DeployError, match="names the release '../../PWNED', not a safe file name") as err:
        deploy_command(None, platform="slurm", release=str(rel), release_volume="/shared/releases",
                       output=str(tmp_path / "d"))
    assert err.value.exit_code == 2 and not (tmp_path / "d").exists()
    doc = (rel / "release.json").read_bytes()
    tarball = tmp_path / "x.tar"
    with tarfile.open(tarball, "w") as tar:
        info = tarfile.TarInfo("x/release.json")
        info.size = len(doc)
        tar.addfile(info, io.BytesIO(doc))
    with pytest.raises(DeployError, match="names the release '../../PWNED', not a safe file name"):
        deploy_command(None, platform="k8s", pipeline_image=PIPELINE_IMAGE,
                       release=str(tarball), release_volume="pvc", output=str(tmp_path / "k"))
    assert not (tmp_path / "k").exists()


@pytest.mark.parametrize("name", ["a/b", "..", "x" * 129, "-lead", "a b", "v1+local", ""])
def test_other_unsafe_recorded_names_are_refused(tmp_path, name):
    with pytest.raises(DeployError, match="not a safe file name"):
        from_release(_release_dir(tmp_path, name))


def test_deploy_from_a_spec_fetches_the_file_release_names(tmp_path):
    spec = resolve_spec(model="llama-405b", precision="fp8", tp=8)
    assert from_spec(spec).release_file == release_file(spec, __version__) == release_name(spec, __version__) + ".tar"
    assert release_file(spec, "1.0").startswith("llama-405b-fp8-") and release_file(spec, "1.0").endswith("-v1.0.tar")
    # deploy places the spec (nodes, TP) itself: a spec released with the TP/PP deploy settles on names the same file
    auto = deploy_command(resolve_spec(model="llama-405b", precision="bf16"), platform="slurm",
                          release_volume="/shared/releases", output=str(tmp_path / "d"))
    released = resolve_spec(model="llama-405b", precision="bf16", tp=8, pp=2, nodes=2)
    assert (auto["tp"], auto["pp"]) == (8, 2) and auto["release_file"] == release_file(released, __version__)
    sbatch = (tmp_path / "d" / "serve.sbatch").read_text()
    assert f"export RELEASE_FILE={auto['release_file']}" in sbatch


def test_names_ignore_where_a_build_runs_but_not_what_it_is():
    spec = resolve_spec(model="llama-70b", precision="fp8", tp=4)
    assert release_file(spec, "1") == release_file(resolve_spec(model="llama-70b", precision="fp8", tp=4, nodes=3,
                                                                gpu_price_per_hour=9.0), "1")
    for other in (dict(tp=2), dict(gpu="h200"), dict(max_batch_size=16), dict(runtime="pytorch"), dict(target="reference")):
        assert release_file(resolve_spec(**{"model": "llama-70b", "precision": "fp8", "tp": 4, **other}), "1") != \
            release_file(spec, "1"), other
    assert release_name(resolve_spec(model="tiny-llama", precision="fp8", target="reference"), "1").endswith(
        "-reference-v1")
    with pytest.raises(ReleaseError, match="not a safe file name"):
        release_name(spec, "1.0+local")


def test_matrix_cells_check_the_release_they_write(tmp_path):
    summary = deploy_command(None, platform="slurm", matrix="llama-8b:fp8,llama-8b:int4_awq:2",
                             matrix_output="/shared/builds", output=str(tmp_path / "m"))
    cell = (tmp_path / "m" / "build-cell.sh").read_text()
    # a cell's `build` resolves its spec from flags, unset limits chosen by the memory model (as the CLI does)
    want = [release_file(choose_limits(resolve_spec(model="llama-8b", precision="fp8")), __version__),
            release_file(choose_limits(resolve_spec(model="llama-8b", precision="int4_awq", tp=2)), __version__)]
    assert summary["releases"] == want
    for i, name in enumerate(want):
        assert f"  {i}) set -- " in cell and f"; release={name} ;;" in cell
    assert 'if [ ! -f "$OUTPUT/releases/$release" ]; then' in cell


def test_deploy_names_the_release_of_its_release_version_and_refuses_one_never_released(pipeline_env, capsys):
    """`release --version 1.0.0` then `deploy --spec ... --release-version 1.0.0 --release-volume DIR` names the file
    written; a version never released there is exit 2, naming the versions found."""
    from pipeline.cli.commands import build_command, release_command
    from pipeline.cli.flags import spec_from_flags

    spec_file = pipeline_env / "spec.yaml"
    spec_file.write_text("model: tiny-llama\ntarget: reference\n"
                         "quantization: {precision: fp8, calib_size: 4, calib_seq_len: 32}\n")
    spec = spec_from_flags({"spec": str(spec_file)})
    build_command(spec)
    releases = pipeline_env / "rel eases"
    release_command(spec, output=str(releases), version="1.0.0", json_=True)
    tarball = Path(json.loads(capsys.readouterr().out)["tarball"])
    assert tarball.parent == releases and tarball.name.endswith("-v1.0.0.tar")
    summary = deploy_command(spec_from_flags({"spec": str(spec_file)}), platform="slurm", release_version="1.0.0",
                             release_volume=str(releases), output=str(pipeline_env / "d"))
    assert summary["release_file"] == tarball.name
    assert f"export RELEASE_FILE={tarball.name}" in (pipeline_env / "d" / "serve.sbatch").read_text()
    with pytest.raises(DeployError, match=r"no .*-v2\.0\.0\.tar \(versions there: 1\.0\.0\)") as err:
        deploy_command(spec, platform="slurm", release_version="2.0.0", release_volume=str(releases),
                       output=str(pipeline_env / "d2"))
    assert err.value.exit_code == 2 and not (pipeline_env / "d2").exists()
    with pytest.raises(DeployError, match=rf"no {release_file(spec, __version__)}"):  # the default: this version
        deploy_command(spec, platform="slurm", release_volume=str(releases), output=str(pipeline_env / "d3"))
    with pytest.raises(DeployError, match="--release-version '1.0 0'"):
        deploy_command(spec, platform="slurm", release_version="1.0 0", release_volume=str(releases),
                       output=str(pipeline_env / "d4"))
