"""The engine runtime's watchdog over tritonserver's Python-backend stubs (/bin/sh functions for rank.sh).

When a stub (preprocessing, postprocessing, tensorrt_llm_bls) dies, tritonserver keeps `/v2/health/ready`,
`/v2/health/live` and `/v2/models/<m>/ready` at 200 and answers every request to that model with "Stub process
'<instance>' is not healthy" (python backend of Triton 2.51, checked against the CPU tritonserver). No HTTP probe
sees it, so rank 0 runs tritonserver under `serve_watched`: once the server listens on its HTTP port (every model
loaded), the stubs it started are recorded; when one of them is gone the watchdog stops the server (SIGTERM, SIGKILL
after a grace period) and the rank exits 5, so Kubernetes restarts the container (its probes fail meanwhile) and a
Slurm step ends failed. The reference runtime's `invoke serve` does the same in Python (`ServerFailed`, exit 5).

Once armed the watchdog records the server's pid and its stubs in STATE_FILE under $WORK (removed when the rank
starts); `stubs_ready`, the same check one-shot, fails until then and as soon as a recorded stub is gone: the
engine pod's readiness probe (`ready_script`) runs it, so Kubernetes takes the pod out of its Service at once
rather than after the watchdog's stop.

A stub is `triton_python_backend_stub MODEL.py SHM SIZE GROWTH PARENT_PID LIB IPC INSTANCE ...` (its argv as
python_backend's stub launcher writes it); PARENT_PID picks this server's stubs: the watched process or one of its
descendants, since rank 0 may start tritonserver below a launcher (`mpirun -n 1` in orchestrator mode,
`trtllm-llmapi-launch` for LLM-API ranks).
"""

from __future__ import annotations

import shlex

WATCH_SECONDS = 5  # STUB_WATCH_SECONDS: how often the stubs are checked
STOP_GRACE_SECONDS = 60  # STUB_STOP_GRACE_SECONDS: SIGTERM -> SIGKILL
STATE_FILE = "stub-watch"  # under $WORK (STUB_STATE overrides): the server pid, then the recorded stubs

STUB_WATCH = f"""\
# tritonserver stays ready when a Python-backend stub dies and fails every request to that model:
# serve_watched stops it (exit 5) once a stub it started after loading is gone, so the platform restarts the rank.
tree_of() {{  # process $1 and its descendants, as " pid pid ... "
  cat /proc/[0-9]*/stat 2>/dev/null | awk -v root="$1" '{{ r = $0; sub(/.*\\) /, "", r); split(r, f, " ");
    parent[$1] = f[2] }} END {{ tree[root] = 1; do {{ grown = 0; for (p in parent) if (!(p in tree) &&
    (parent[p] in tree)) {{ tree[p] = 1; grown = 1 }} }} while (grown); printf " "; for (p in tree) printf "%s ", p }}'
}}
stubs_of() {{  # instance names of the live Python-backend stubs whose parent is process $1 or a descendant of it
  stubs_tree=$(tree_of "$1")
  grep -las triton_python_backend_stub /proc/[0-9]*/cmdline | while read -r f; do
    tr '\\000' '\\n' < "$f" 2>/dev/null | awk -v tree="$stubs_tree" \\
      'NR == 1 && !/triton_python_backend_stub$/ {{exit}} NR == 6 && !index(tree, " " $0 " ") {{exit}} NR == 9 {{print; exit}}'
  done
}}
listening() {{  # a socket of this network namespace listens on TCP port $1
  cat /proc/net/tcp /proc/net/tcp6 2>/dev/null | awk -v port=":$(printf '%04X' "$1")" \\
    '$4 == "0A" && substr($2, length($2) - 4) == port {{found = 1}} END {{exit !found}}'
}}
gone_stub() {{  # $1 server pid, then recorded instance names: prints the first without a live stub; fails if none
  gone_pid="$1"
  shift
  gone_live=" $(stubs_of "$gone_pid" | tr '\\n' ' ') "
  for gone_s in "$@"; do
    case "$gone_live" in *" $gone_s "*) ;; *) echo "$gone_s"; return 0 ;; esac
  done
  return 1
}}
stub_state() {{ echo "${{STUB_STATE:-${{WORK:-/work}}/{STATE_FILE}}}"; }}
stubs_ready() {{  # one-shot: the watchdog armed (server loaded), the server alive and every stub it recorded alive
  if [ ! -r "$(stub_state)" ]; then
    echo "not ready: the stub watchdog has not recorded the loaded server's stubs yet" >&2
    return 1
  fi
  set -- $(cat "$(stub_state)")
  if [ ! -e "/proc/${{1:-0}}" ]; then
    echo "not ready: tritonserver (pid ${{1:-?}}) is gone" >&2
    return 1
  fi
  if dead=$(gone_stub "$@"); then
    echo "not ready: the Python stub of model instance $dead died" >&2
    return 1
  fi
}}
watch_stubs() {{  # $1 server pid, $2 its HTTP port; exits 5 after stopping the server when a recorded stub is gone
  armed=""
  seen=""
  while [ -e "/proc/$1" ]; do
    sleep "${{STUB_WATCH_SECONDS:-{WATCH_SECONDS}}}"
    if [ -z "$armed" ]; then
      if listening "$2"; then
        armed=1
        seen=$(stubs_of "$1")
        printf '%s\\n' "$1" $seen > "$(stub_state).tmp" && mv -f "$(stub_state).tmp" "$(stub_state)"
      fi
      continue
    fi
    s=$(gone_stub "$1" $seen) || continue
    [ -e "/proc/$1" ] || exit 0  # the server itself ended (its stubs with it)
    rm -f "$(stub_state)"
    echo "error: the Python stub of model instance $s died (tritonserver would stay ready and fail every" \\
      "request to it); stopping the server so the platform restarts this rank" >&2
    kill -TERM "$1" 2>/dev/null
    i=0
    while [ -e "/proc/$1" ] && [ "$i" -lt "${{STUB_STOP_GRACE_SECONDS:-{STOP_GRACE_SECONDS}}}" ]; do
      sleep 1
      i=$((i + 1))
    done
    kill -KILL "$1" 2>/dev/null
    exit 5
  done
}}
serve_watched() {{  # $1 HTTP port, then the server's argv: run it, watched; its exit status, or 5 for a dead stub
  port="$1"
  shift
  rm -f "$(stub_state)"  # a record of an earlier container's server (WORK outlives it)
  "$@" &
  server=$!
  (set +e; watch_stubs "$server" "$port") &
  watcher=$!
  # a shutdown stops the stubs first: the watchdog goes before the server is told to stop
  trap 'kill "$watcher" 2>/dev/null; kill -TERM "$server" 2>/dev/null || :' TERM INT
  while :; do
    status=0
    wait "$server" || status=$?
    [ -e "/proc/$server" ] || break  # reaped (else a signal interrupted the wait)
  done
  watched=0
  wait "$watcher" || watched=$?  # it ends within STUB_WATCH_SECONDS of the server
  [ "$watched" -ne 5 ] || exit 5
  return "$status"
}}
"""


def ready_script(http_port: int) -> str:
    """/bin/sh for the engine pod's readiness probe: `stubs_ready`, then tritonserver's own /v2/health/ready."""
    url = shlex.quote(f"http://127.0.0.1:{http_port}/v2/health/ready")
    return f"""#!/bin/sh
# Readiness probe of the engine runtime: tritonserver answers ready even after a Python stub died, so the stubs the
# watchdog recorded must be alive too (stubs_ready), and then the server must say ready.
set -eu
{STUB_WATCH}stubs_ready
exec curl --fail --silent --show-error --max-time 4 --output /dev/null {url}
"""
