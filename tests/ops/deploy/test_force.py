"""`deploy --force` replaces only an earlier deployment: never another directory, the output root, $HOME or / (issue
33, class 1); the replacement is atomic."""

from __future__ import annotations

import pytest

from pipeline.cli.commands import deploy_command
from pipeline.core.errors import PipelineError, RunError
from pipeline.core.spec import resolve_spec
from pipeline.ops.deploy.render import write_directory
from tests.support.k8s import PIPELINE_IMAGE


@pytest.fixture
def spec(tmp_path, monkeypatch):
    monkeypatch.setenv("PIPELINE_ROOT", str(tmp_path / "root"))
    monkeypatch.chdir(tmp_path)
    return resolve_spec(model="llama-8b", precision="fp8", tp=1)


def _deploy(spec, output, **kw):
    return deploy_command(spec, platform="k8s", pipeline_image=PIPELINE_IMAGE,
                          release_volume="releases", output=str(output), **kw)


def _tree(root):
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*"))


def test_force_refuses_a_directory_holding_other_files(spec, tmp_path):
    mine = tmp_path / "mine"
    (mine / "sub").mkdir(parents=True)
    (mine / "notes.txt").write_text("keep")
    with pytest.raises(PipelineError, match=r"mine was not written by this pipeline \(no deploy.json\)") as e:
        _deploy(spec, mine, force=True)
    assert e.value.exit_code == 2 and _tree(mine) == ["notes.txt", "sub"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine"]  # no temporary left beside it


def test_force_refuses_the_output_root_even_with_a_deploy_json(spec, tmp_path):
    root = tmp_path / "root"
    for d in ("engines/b", "triton_repo/r", "releases"):
        (root / d).mkdir(parents=True)
    (root / "deploy.json").write_text("{}")
    before = _tree(root)
    with pytest.raises(PipelineError, match="is the output root") as e:
        _deploy(spec, root, force=True)
    assert e.value.exit_code == 2 and _tree(root) == before


@pytest.mark.parametrize("where", ["cwd", "home", "parent-of-home", "slash"])
def test_force_refuses_cwd_home_and_their_parents(spec, tmp_path, monkeypatch, where):
    home = tmp_path / "users" / "me"
    home.mkdir(parents=True)
    (home / "deploy.json").write_text("{}")
    monkeypatch.setenv("HOME", str(home))
    target = {"cwd": tmp_path, "home": home, "parent-of-home": home.parent, "slash": "/"}[where]
    with pytest.raises(PipelineError, match="is the output root, a checkout, \\$HOME or /") as e:
        _deploy(spec, target, force=True)
    assert e.value.exit_code == 2 and (home / "deploy.json").is_file()


def test_force_refuses_the_checkout(spec):
    from pathlib import Path

    import pipeline

    checkout = Path(pipeline.__file__).resolve().parents[1]
    with pytest.raises(PipelineError, match="a checkout"):
        _deploy(spec, checkout, force=True)
    assert (checkout / "pipeline" / "__init__.py").is_file()


def test_force_replaces_an_earlier_deployment(spec, tmp_path):
    out = tmp_path / "d"
    _deploy(spec, out)
    (out / "stale.yaml").write_text("from an older render")
    _deploy(spec, out, force=True)
    assert (out / "deploy.json").is_file() and not (out / "stale.yaml").exists()
    assert sorted(p.name for p in tmp_path.iterdir() if p.name != "root") == ["d"]


def test_an_interrupted_replace_keeps_the_old_deployment(tmp_path):
    out = tmp_path / "d"
    write_directory(out, {"deploy.json": "{}\n", "serving.yaml": "old\n"}, force=False)
    with pytest.raises(RunError, match="writing the deployment"):
        write_directory(out, {"deploy.json": "{}\n", "no-such-dir/serving.yaml": "new\n"}, force=True)
    assert (out / "serving.yaml").read_text() == "old\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d"]
