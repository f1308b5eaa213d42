"""invoke tasks of a checkout: the package's own collection (`pipeline.console`, installed as `trtllm-pipeline`).

`invoke --list` shows them; `invoke TASK --help` the flags. Exit codes: see `pipeline.console`.
"""

from __future__ import annotations

import invoke.main

from pipeline.console import (  # noqa: F401  (invoke loads `namespace`; the task names stay importable)
    adopt, bench, build, calibrate, check, compile_engines, deploy, download, install_repo, namespace, package, plan,
    release, serve, smoke, verify,
)

adopt(invoke.main.program)
