"""invoke tasks of a checkout: the package's own program (`pipeline.cli.console`, installed as `trtllm-pipeline`).

When invoke loads this file to run a command line, the command line goes to that program, named `invoke`: the same
tasks, help, messages and exit codes as `trtllm-pipeline`. `invoke --list` shows the tasks; `invoke TASK --help`
the flags. Exit codes: see `pipeline.cli.console`. A bare `invoke --help` is invoke's own (printed before invoke loads
this file); `trtllm-pipeline --help` lists the tasks. Imported otherwise (tests, `Collection.from_module`), this file
only exposes the collection and its tasks.
"""

from __future__ import annotations

import sys
from pathlib import Path

from pipeline.cli.console import (  # noqa: F401  (invoke loads `namespace`; the task names stay importable)
    bench,
    build,
    calibrate,
    check,
    compile_engines,
    deploy,
    download,
    install_repo,
    namespace,
    package,
    plan,
    release,
    run_as_invoke,
    serve,
    smoke,
    verify,
)


def _run_by_invoke() -> bool:
    """Whether the running program is invoke (`invoke ...`, `inv ...`, `python -m invoke ...`)."""
    argv0 = Path(sys.argv[0]) if sys.argv and sys.argv[0] else Path()
    return argv0.name in ("invoke", "inv") or (argv0.name == "__main__.py" and argv0.parent.name == "invoke")


if _run_by_invoke():
    run_as_invoke(sys.argv)  # exits
