"""invoke tasks of a checkout: the package's own collection (`pipeline.cli.console`, installed as `trtllm-pipeline`).

`invoke --list` shows them; `invoke TASK --help` the flags. Exit codes: see `pipeline.cli.console`.
"""

from __future__ import annotations

import invoke.main

from pipeline.cli.console import (  # noqa: F401  (invoke loads `namespace`; the task names stay importable)
    adopt,
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
    serve,
    smoke,
    verify,
)

adopt(invoke.main.program)
