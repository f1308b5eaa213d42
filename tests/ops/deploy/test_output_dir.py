"""deploy's default output directory includes the platform: k8s and slurm files of one spec side by side."""

from __future__ import annotations

import re

from pipeline.cli.commands import deploy_command
from pipeline.core.spec import resolve_spec
from pipeline.planning.limits_choice import choose_limits
from tests.support.k8s import PIPELINE_IMAGE


def test_k8s_and_slurm_of_one_spec_both_write_by_default(tmp_path, monkeypatch):
    monkeypatch.setenv("PIPELINE_ROOT", str(tmp_path))
    spec = choose_limits(resolve_spec(model="llama-8b", precision="fp8", tp=1))
    k8s = deploy_command(spec, platform="k8s", pipeline_image=PIPELINE_IMAGE, release_volume="releases")
    slurm = deploy_command(spec, platform="slurm", release_volume="/shared/releases")
    assert k8s["directory"] == str(tmp_path / "deploy" / "k8s" / "llama-8b-fp8-tp1")
    assert slurm["directory"] == str(tmp_path / "deploy" / "slurm" / "llama-8b-fp8-tp1")
    assert (tmp_path / "deploy" / "k8s" / "llama-8b-fp8-tp1" / "serving.yaml").is_file()
    assert (tmp_path / "deploy" / "slurm" / "llama-8b-fp8-tp1" / "serve.sbatch").is_file()


def test_deploy_follows_the_chosen_topology_with_its_limits(tmp_path, monkeypatch):
    """Without --tp deploy picks the topology; a batch the memory model chose is chosen again for it."""
    monkeypatch.setenv("PIPELINE_ROOT", str(tmp_path))
    spec = choose_limits(resolve_spec(model="llama-70b", precision="fp8"))
    line = deploy_command(spec, platform="k8s", pipeline_image=PIPELINE_IMAGE, release_volume="releases")["summary"]
    tp, pp, batch = (int(re.search(rf" {key}=(\d+)", line).group(1)) for key in ("tp", "pp", "batch"))
    chosen = choose_limits(resolve_spec(model="llama-70b", precision="fp8", tp=tp, pp=pp))
    assert batch == chosen.max_batch_size and "the KV pool" in chosen.limit_reasons["max_batch_size"]
