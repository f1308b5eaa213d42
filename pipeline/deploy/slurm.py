"""Slurm batch scripts: multi-node serving (one task per GPU, `srun --mpi=pmix`, world size = TP × PP) and a job
array for the build matrix. Containers run through pyxis/enroot (`srun --container-image`); `container=False` runs
the same scripts on the hosts (the pipeline and tritonserver installed there).
"""

from __future__ import annotations

import shlex

from pydantic import BaseModel

from ..placement import Placement
from .runtime import Runtime


class SlurmOptions(BaseModel):
    name: str
    directory: str  # where the scripts are on the cluster (absolute; the rendered deployment directory)
    server_image: str
    pipeline_image: str
    pipeline_cmd: str
    container: bool = True
    partition: str | None = None
    time_limit: str = "04:00:00"
    release_file: str = ""
    release_url: str | None = None
    release_dir: str | None = None
    sha256: str | None = None


def _header(o: SlurmOptions, job: str, lines: list[str]) -> list[str]:
    head = ["#!/bin/bash", f"#SBATCH --job-name={job}", *lines, f"#SBATCH --time={o.time_limit}"]
    if o.partition:
        head.append(f"#SBATCH --partition={o.partition}")
    return head


def _srun(o: SlurmOptions, image: str, mounts: list[str], extra: list[str]) -> str:
    args = ["srun", *extra]
    if o.container:
        args += [f"--container-image={shlex.quote(image)}",
                 "--container-mounts=" + ",".join(f"{m}:{m}" for m in mounts), "--no-container-mount-home"]
    return " ".join(args)


def serve_script(o: SlurmOptions, rt: Runtime, p: Placement) -> str:
    """sbatch for serving on p.nodes nodes: fetch + verify once per node, then every rank under srun --mpi=pmix."""
    d = shlex.quote(o.directory)
    exports = {"RELEASE_FILE": o.release_file, "RELEASE_URL": o.release_url, "RELEASE_DIR": o.release_dir,
               "RELEASE_SHA256": o.sha256, "PIPELINE": o.pipeline_cmd}
    mounts = ["$WORK", o.directory, *([o.release_dir] if o.release_dir else [])]
    head = _header(o, o.name, [f"#SBATCH --nodes={p.nodes}", f"#SBATCH --ntasks-per-node={p.ranks_per_node}",
                               f"#SBATCH --gpus-per-node={p.ranks_per_node}", "#SBATCH --exclusive",
                               f"#SBATCH --output={o.directory}/logs/%x-%j.out"])
    fetch = _srun(o, o.pipeline_image, mounts, [f"--nodes={p.nodes}", "--ntasks-per-node=1"])
    per_node = p.ranks_per_node if rt.ranks_launched else 1
    ranks = _srun(o, o.server_image, mounts, [*(["--mpi=pmix"] if rt.ranks_launched else []), f"--nodes={p.nodes}",
                                              f"--ntasks-per-node={per_node}"])
    ports = " / ".join(f"{name} {port}" for name, port in rt.ports)
    body = [
        "set -euo pipefail",
        f"# tp={p.tp} pp={p.pp}: world size {p.world_size} = {p.nodes} node(s) x {p.ranks_per_node} GPU ranks; "
        "TP groups stay within a node",
        'export WORK="${WORK:-/tmp/trtllm-deploy-$SLURM_JOB_ID}"  # node-local: the release and its repository',
        *(f"export {k}={shlex.quote(v)}" for k, v in exports.items() if v),
        "# every node: fetch the release, verify it against this node's TensorRT-LLM and GPU, unpack, install",
        f"{fetch} /bin/sh {d}/fetch-verify.sh",
        f"# every rank ({rt.name} runtime): rank 0 serves {ports} on the first node",
        f"{ranks} /bin/sh {d}/rank.sh",
    ]
    return "\n".join([*head, "", *body]) + "\n"


def matrix_script(o: SlurmOptions, cells: int, gpus: int, output: str) -> str:
    """sbatch job array: task i builds and releases matrix cell i (build-cell.sh) into `output`."""
    d = shlex.quote(o.directory)
    lines = [f"#SBATCH --array=0-{cells - 1}", "#SBATCH --ntasks=1",
             f"#SBATCH --output={o.directory}/logs/%x-%A_%a.out"]
    if gpus:
        lines.append(f"#SBATCH --gpus={gpus}")
    head = _header(o, f"{o.name}-build", lines)
    run = _srun(o, o.pipeline_image, [output, o.directory], ["--ntasks=1"]) if o.container else "exec"
    body = ["set -euo pipefail", "# HF_TOKEN comes from the submitting environment (sbatch exports it); never written here",
            f"export OUTPUT={shlex.quote(output)}", f"export PIPELINE={shlex.quote(o.pipeline_cmd)}",
            f"{run} /bin/sh {d}/build-cell.sh"]
    return "\n".join([*head, "", *body]) + "\n"


def build_cell_script(cells: list[list[str]], release_files: list[str]) -> str:
    """/bin/sh: build and release cell $JOB_COMPLETION_INDEX (Kubernetes) or $SLURM_ARRAY_TASK_ID (Slurm); cell i's
    release is `release_files[i]` (the name `invoke release` gives its spec), checked once written."""
    cases = "\n".join(f"  {i}) set -- {' '.join(shlex.quote(a) for a in args)}; release={shlex.quote(name)} ;;"
                      for i, (args, name) in enumerate(zip(cells, release_files, strict=True)))
    return f"""#!/bin/sh
# One build-matrix cell: build it, then release it into $OUTPUT/releases (deterministic tarball + .sha256).
set -eu
index="${{JOB_COMPLETION_INDEX:-${{SLURM_ARRAY_TASK_ID:?no matrix index}}}}"
pipeline="${{PIPELINE:-invoke -r /opt/trtllm-pipeline}}"
case "$index" in
{cases}
  *) echo "error: no matrix cell $index" >&2; exit 2 ;;
esac
export PIPELINE_ROOT="$OUTPUT/cells/$index"
mkdir -p "$PIPELINE_ROOT" "$OUTPUT/releases"
$pipeline build "$@"
$pipeline release "$@" --output "$OUTPUT/releases"
if [ ! -f "$OUTPUT/releases/$release" ]; then
  echo "error: matrix cell $index did not write $OUTPUT/releases/$release; use the same pipeline version to render and build" >&2
  exit 2
fi
"""
