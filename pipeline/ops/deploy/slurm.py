"""Slurm batch scripts: multi-node serving (one task per GPU, `srun --mpi=<--mpi>`, world size = TP × PP; several
replicas: a job array, one job per replica) and a job array for the build matrix. A serving job asks for its GPUs,
host RAM and cores (`--exclusive` only when asked, or for replicas) and removes its node-local $WORK when it ends
(`remove_work_script`). Orchestrator mode (draft-target) is one task, `srun --mpi=none`, that runs the image's Open
MPI `mpirun -n 1 tritonserver` as launch_triton_server.py does: the backend then MPI_Comm_spawns each model's ranks
through that mpirun's runtime, which implements spawning; a task srun starts with `--mpi=pmix` would need Slurm's
PMIx server to spawn (PMIx_Spawn), which we do not rely on (untried on a cluster here), and `--mpi=none` keeps
Slurm's PMI variables away from that mpirun. Containers run through
pyxis/enroot (`srun --container-image`, images in pyxis' `registry#image` form); `container=False` runs the same
scripts on the hosts (the pipeline and tritonserver installed there).

Two parsers read what is generated here: the shell runs the body (every value is `shlex.quote`d) and sbatch reads
the `#SBATCH` directives (its own words: quotes, backslashes, `#` comments), so every directive value is checked and
quoted for sbatch by `_directive`; a value it cannot carry safely is refused with a `DeployError`.
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import PurePosixPath

from pydantic import BaseModel

from pipeline.core.errors import DeployError
from pipeline.ops.deploy.runtime import Runtime
from pipeline.planning.placement import Placement

MATRIX_TIME = "04:00:00"  # a build cell's default limit; serving has none unless --time (the partition's applies)
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")  # partition, account, qos
CONSTRAINT_RE = re.compile(r"^[A-Za-z0-9_.(\[][A-Za-z0-9_.,&|*()\[\]:-]{0,255}$")  # features joined by & | , [ ] *
TIME_RE = re.compile(r"^(\d+|\d+:\d+|\d+:\d+:\d+|\d+-\d+|\d+-\d+:\d+|\d+-\d+:\d+:\d+|infinite|unlimited)$", re.I)
PLAIN_WORD = re.compile(r"^[A-Za-z0-9._/%:=,+@-]+$")  # needs no quoting in an #SBATCH line
SBATCH_MANGLED = re.compile(r"packjob|hetjob", re.I)  # sbatch blanks these words anywhere in a directive line
MOUNT_SEPARATORS = (",", ":")  # pyxis splits --container-mounts on these
MPI_TYPES = ("pmix", "pmix_v3", "pmix_v4", "pmix_v5", "pmi2", "cray_shasta", "none")  # srun --mpi (`srun --mpi=list`)
REMOVE_WORK = "remove-work.sh"  # the serving steps' --task-epilog
MIB = 1024**2


class SlurmOptions(BaseModel):
    name: str
    directory: str  # where the scripts are on the cluster (absolute; the rendered deployment directory)
    server_image: str
    pipeline_image: str
    pipeline_cmd: str
    container: bool = True
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    constraint: str | None = None
    time_limit: str | None = None  # serving: none (the partition's limit); the build matrix: MATRIX_TIME
    replicas: int = 1  # serving: >1 renders a job array, one job (its own nodes) per replica
    release_file: str = ""
    release_url: str | None = None
    release_dir: str | None = None
    sha256: str | None = None
    exclusive: bool = False  # serving: whole nodes (#SBATCH --exclusive)
    mpi: str = "pmix"  # serving: srun --mpi of the ranks
    keep_work: bool = False  # serving: leave $WORK on the nodes when the job ends
    mem_bytes: int | None = None  # #SBATCH --mem (per node), from the host-resource estimate
    cpus_per_task: int | None = None  # #SBATCH --cpus-per-task


def pyxis_image(ref: str) -> str:
    """`ref` in pyxis' form: `nvcr.io/nvidia/x:tag` -> `nvcr.io#nvidia/x:tag` when the first component is a registry
    host (has a `.` or `:`, or is localhost); Docker Hub names and refs already holding `#` are left alone."""
    host, sep, rest = ref.partition("/")
    if "#" in ref or not sep or not (("." in host) or (":" in host) or host == "localhost"):
        return ref
    return f"{host}#{rest}"


def _sbatch_word(value: str) -> str:
    """`value` as one sbatch directive word: plain, or double-quoted with `\\` and `"` escaped."""
    if PLAIN_WORD.match(value):
        return value
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _directive(flag: str, value: str, source: str) -> str:
    """`#SBATCH --flag=value`, refusing what sbatch would misread (line breaks, control characters, the words it
    blanks) with one DeployError naming `source`, the user's flag."""
    if any(ord(ch) < 32 or ord(ch) == 127 for ch in value) or SBATCH_MANGLED.search(value):
        raise DeployError(f"{source} {value!r}: an #SBATCH value cannot hold line breaks, control characters or the "
                          "words packjob/hetjob; choose another value")
    return f"#SBATCH --{flag}={_sbatch_word(value)}"


def time_seconds(limit: str) -> int | None:
    """A --time value (TIME_RE's formats) in seconds; None for infinite/unlimited."""
    if limit.lower() in ("infinite", "unlimited"):
        return None
    days, _, rest = limit.rpartition("-")
    parts = [int(x) for x in rest.split(":")]
    if days:  # D-HH[:MM[:SS]]
        h, m, s = (parts + [0, 0])[:3]
    else:  # minutes, MM:SS, HH:MM:SS
        h, m, s = [0, parts[0], 0] if len(parts) == 1 else [0] * (3 - len(parts)) + parts
    return int(days or 0) * 86400 + h * 3600 + m * 60 + s


def _check(value: str | None, pattern: re.Pattern, flag: str, what: str) -> None:
    if value is not None and not pattern.match(value):
        raise DeployError(f"{flag} {value!r}: {what}")


def _check_path(value: str, flag: str, *, mounted: bool) -> None:
    if not PurePosixPath(value).is_absolute():
        raise DeployError(f"{flag} {value!r}: give an absolute directory that every node sees (a shared filesystem)")
    if "%" in value or "\\" in value or any(ord(ch) < 32 or ord(ch) == 127 for ch in value):
        raise DeployError(f"{flag} {value!r}: a Slurm path cannot hold '%' or '\\' (sbatch file patterns) or "
                          "control characters; choose another directory")
    if mounted and any(sep in value for sep in MOUNT_SEPARATORS):
        raise DeployError(f"{flag} {value!r}: pyxis --container-mounts cannot carry ',' or ':' in a path; choose "
                          "another directory or pass --no-container")


def validate_options(o: SlurmOptions, *, output: str | None = None) -> None:
    """Raise DeployError for a value the scripts cannot carry safely: directive values outside sbatch's syntax,
    relative or unmountable paths. `output`: the build matrix's --matrix-output."""
    _check(o.partition, NAME_RE, "--partition", "a partition name is letters, digits, '.', '_' and '-'")
    _check(o.account, NAME_RE, "--account", "an account name is letters, digits, '.', '_' and '-'")
    _check(o.qos, NAME_RE, "--qos", "a QOS name is letters, digits, '.', '_' and '-'")
    _check(o.constraint, CONSTRAINT_RE, "--constraint", "features are letters, digits, '_', '.', joined by & | , "
           "with [ ] ( ) * counts, e.g. 'h100&ib'")
    _check(o.time_limit, TIME_RE, "--time", "use minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS or unlimited, "
           "e.g. 2-00:00:00")
    _check_path(o.directory, "--output", mounted=o.container)
    if o.mpi not in MPI_TYPES:
        raise DeployError(f"--mpi {o.mpi!r}: use one of {', '.join(MPI_TYPES)} (Slurm's srun --mpi types)")
    if o.release_dir:
        _check_path(o.release_dir, "--release-volume", mounted=o.container)
    if output is not None:
        _check_path(output, "--matrix-output", mounted=o.container)


def _header(o: SlurmOptions, job: str, lines: list[str], time_limit: str | None) -> list[str]:
    resources = [*([f"#SBATCH --mem={-(-o.mem_bytes // MIB)}M"] if o.mem_bytes else []),
                 *([f"#SBATCH --cpus-per-task={o.cpus_per_task}"] if o.cpus_per_task else [])]
    head = ["#!/bin/bash", _directive("job-name", job, "--name"), *lines, *resources]
    optional = (("time", time_limit, "--time"), ("partition", o.partition, "--partition"),
                ("account", o.account, "--account"), ("qos", o.qos, "--qos"),
                ("constraint", o.constraint, "--constraint"))
    return head + [_directive(flag, value, source) for flag, value, source in optional if value]


def _mounts(mounts: list[str]) -> str:
    """--container-mounts: the node-local $WORK (when listed as "$WORK") and quoted same-path mounts."""
    words = ['"$WORK:$WORK"' if m == "$WORK" else shlex.quote(f"{m}:{m}") for m in mounts]
    return "--container-mounts=" + ",".join(words)


def _srun(o: SlurmOptions, image: str, mounts: list[str], extra: list[str]) -> str:
    args = ["srun", *extra]
    if o.container:
        args += [f"--container-image={shlex.quote(pyxis_image(image))}", _mounts(mounts), "--no-container-mount-home"]
    return " ".join(args)


def replica_targets(targets: str, replicas: int) -> str:
    """The file_sd path Prometheus reads: `targets`, or with several replicas the glob of their per-job files
    (`<stem>-<array task id>.json`)."""
    return targets if replicas == 1 else targets.removesuffix(".json") + "-*.json"


def _scrape_target_lines(o: SlurmOptions, rt: Runtime, targets: str) -> list[str]:
    """Shell lines writing the Prometheus file_sd file `targets` (one per replica of an array: `replica_targets`;
    written whole by a rename; `_cleanup_lines` removes it): rank 0's metrics port on this node (the batch script
    runs on the allocation's first node, where rank 0 serves; Triton's metrics port, trtllm-serve's HTTP port),
    labelled job=<name>."""
    port = dict(rt.ports).get(rt.scrape.port) if rt.scrape else None
    if port is None:
        raise DeployError(f"the {rt.name} runtime exports no metrics port; it has no Prometheus scrape target")
    port_word = f'"${{METRICS_PORT:-{port}}}"' if rt.ports_from_env else str(port)  # the reference runtime
    entry = '[{"targets": ["%s:%s"], "labels": {"job": %s}}]\\n'
    path = shlex.quote(targets) if o.replicas == 1 else \
        shlex.quote(targets.removesuffix(".json") + "-") + '"$SLURM_ARRAY_TASK_ID".json'
    return [
        "# Prometheus file_sd target (prometheus-scrape.yml reads it): rank 0's metrics port on this node",
        f"targets={path}",
        'tmp="$(mktemp "$targets.XXXXXX")"',
        f'printf {shlex.quote(entry)} "$(hostname)" {port_word} {shlex.quote(json.dumps(o.name))} > "$tmp"',
        'chmod 644 "$tmp"',
        'mv -f "$tmp" "$targets"',
    ]


def remove_work_script() -> str:
    """/bin/sh run by slurmstepd on each node (on the host, outside any container) after each task of a serving step
    ends, scancel included (`srun --task-epilog`): removes the node's $WORK; after the fetch step (KEEP_FETCHED=1)
    only where it did not finish (no $WORK/REPO)."""
    return """#!/bin/sh
case "${WORK:-}" in */trtllm-deploy-"${SLURM_JOB_ID:-}") ;; *) exit 0 ;; esac  # only this job's own directory
if [ "${KEEP_FETCHED:-}" = 1 ] && [ -f "$WORK/REPO" ]; then exit 0; fi
rm -rf "$WORK"
"""


def _cleanup_lines(o: SlurmOptions, node_step: list[str]) -> list[str]:
    """The batch script's trap (normal exit, failure, SIGTERM from scancel or the time limit, SIGINT): remove the
    Prometheus target, and unless keep_work $WORK on every node (a step while the job still runs; once it is
    cancelled no step starts, so the batch node's own copy, and the steps' --task-epilog the others')."""
    remove = [] if o.keep_work else [f'  srun {" ".join(node_step)} rm -rf "$WORK" 2>/dev/null || true',
                                     '  rm -rf "$WORK"']
    return ["cleanup() {", '  rm -f "${tmp:-}" "${targets:-}"', *remove, "}",
            "trap cleanup EXIT", "trap 'exit 143' TERM  # scancel, the time limit: SIGTERM, SIGKILL after KillWait",
            "trap 'exit 130' INT"]


def serve_script(o: SlurmOptions, rt: Runtime, p: Placement, *, scrape_targets: str | None = None) -> str:
    """sbatch for serving on p.nodes nodes: $WORK created on every node, fetch + verify once per node, then every
    rank under srun --mpi=<o.mpi> (or the runtime's one process), $WORK removed when the job ends unless
    `o.keep_work`; `o.replicas` > 1: a job array of that many such jobs. `scrape_targets`: the Prometheus file_sd file the job writes while it runs
    (`_scrape_target_lines`)."""
    validate_options(o)
    d = shlex.quote(o.directory)
    exports = {"RELEASE_FILE": o.release_file, "RELEASE_URL": o.release_url, "RELEASE_DIR": o.release_dir,
               "RELEASE_SHA256": o.sha256, "PIPELINE": o.pipeline_cmd}
    mounts = ["$WORK", o.directory, *([o.release_dir] if o.release_dir else [])]
    per_node = p.ranks_per_node if rt.ranks_launched else 1
    lines = [f"#SBATCH --nodes={p.nodes}", f"#SBATCH --ntasks-per-node={per_node}"]
    if o.replicas > 1:
        lines.append(f"#SBATCH --array=0-{o.replicas - 1}")
    if rt.gpus:
        lines.append(f"#SBATCH --gpus-per-node={p.ranks_per_node}")
    if o.exclusive or o.replicas > 1:  # replicas of one array share no node (nor its fixed ports)
        lines.append("#SBATCH --exclusive")
    log = "%x-%j.out" if o.replicas == 1 else "%x-%A_%a.out"
    lines.append(_directive("output", f"{o.directory}/logs/{log}", "--output"))
    head = _header(o, o.name, lines, o.time_limit)
    node_step = [f"--nodes={p.nodes}", "--ntasks-per-node=1"]
    epilog = [] if o.keep_work else [f"--task-epilog={shlex.quote(f'{o.directory}/{REMOVE_WORK}')}"]
    fetch = _srun(o, o.pipeline_image, mounts, [*(["--export=ALL,KEEP_FETCHED=1"] if epilog else []), *node_step,
                                                *epilog])
    # --kill-on-bad-exit: a rank that fails (rank 0's stub watchdog exits 5) ends the whole step, and the job fails
    ranks = _srun(o, o.pipeline_image if rt.pipeline_image else o.server_image, mounts,
                  [*([f"--mpi={o.mpi}"] if rt.ranks_launched else ["--mpi=none"] if rt.own_mpirun else []),
                   f"--nodes={p.nodes}", f"--ntasks-per-node={per_node}", "--kill-on-bad-exit=1", *epilog])
    ports = " / ".join(f"{name} {port}" for name, port in rt.ports)
    layout = (f"# tp={p.tp} pp={p.pp}: world size {p.world_size} = {p.nodes} node(s) x {p.ranks_per_node} GPU ranks; "
              "TP groups stay within a node") if rt.gpus else f"# {rt.name} runtime: one CPU process, no GPUs"
    body = [
        "set -euo pipefail",
        layout,
        "# node-local, this job's own: the release and its repository (TRTLLM_DEPLOY_TMP: where, default /tmp)",
        'export WORK="${TRTLLM_DEPLOY_TMP:-/tmp}/trtllm-deploy-$SLURM_JOB_ID"',
        *(f"export {k}={shlex.quote(v)}" for k, v in exports.items() if v),
        *_cleanup_lines(o, node_step),
        "# every node: create $WORK (a container mount's source must exist before its step starts)",
        f'srun {" ".join(node_step)} mkdir -p "$WORK"',
        "# every node: fetch the release, verify it against this node's TensorRT-LLM and GPU, unpack, install",
        f"{fetch} /bin/sh {d}/fetch-verify.sh",
        *(_scrape_target_lines(o, rt, scrape_targets) if scrape_targets else []),
        f"# every rank ({rt.name} runtime): rank 0 serves {ports} on the first node",
        f"{ranks} /bin/sh {d}/rank.sh",
    ]
    return "\n".join([*head, "", *body]) + "\n"


def matrix_script(o: SlurmOptions, cells: int, gpus: int, output: str) -> str:
    """sbatch job array: task i builds and releases matrix cell i (build-cell.sh) into `output`."""
    validate_options(o, output=output)
    d = shlex.quote(o.directory)
    lines = [f"#SBATCH --array=0-{cells - 1}", "#SBATCH --ntasks=1",
             _directive("output", f"{o.directory}/logs/%x-%A_%a.out", "--output")]
    if gpus:
        lines.append(f"#SBATCH --gpus={gpus}")
    head = _header(o, f"{o.name}-build", lines, o.time_limit or MATRIX_TIME)
    run = _srun(o, o.pipeline_image, [output, o.directory], ["--ntasks=1"]) if o.container else "exec"
    body = ["set -euo pipefail", "# HF_TOKEN comes from the submitting environment (sbatch exports it); never written here",
            f"export OUTPUT={shlex.quote(output)}", f"export PIPELINE={shlex.quote(o.pipeline_cmd)}",
            'mkdir -p "$OUTPUT"  # shared: the container mount source exists before the step starts',
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
