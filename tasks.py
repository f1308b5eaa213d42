"""invoke tasks: wiring only. Each task is a function of `pipeline.cli.commands` (its docstring is the task's help).

`invoke --list` shows them; `invoke TASK --help` the flags. Exit codes (pipeline/core/errors.py): 0 ok; 2 bad input or
a missing prerequisite; 3 an artifact differs from its manifest or release record; 4 this host lacks the
GPU/toolchain (or an engine was built for another); 5 the work ran and failed (I/O error, failed requests).
"""

from __future__ import annotations

from pipeline.cli import commands
from pipeline.cli.flags import command_task

check = command_task(commands.check_command)
plan = command_task(commands.plan_command)
download = command_task(commands.download_command)
calibrate = command_task(commands.calibrate_command)
compile_engines = command_task(commands.compile_command)
package = command_task(commands.package_command)
build = command_task(commands.build_command)
release = command_task(commands.release_command)
verify = command_task(commands.verify_command, positional=["path"])
install_repo = command_task(commands.install_repo_command)
serve = command_task(commands.serve_command, optional_spec=True)
smoke = command_task(commands.smoke_command, optional_spec=True)
bench = command_task(commands.bench_command, iterable=["concurrency"])
deploy = command_task(commands.deploy_command, optional_spec=True, spec_warnings=False)
