"""The task collection and the installed `trtllm-pipeline` command (an invoke `Program` over this collection).

`trtllm-pipeline TASK ...` is `invoke TASK ...` in a checkout (whose `tasks.py` re-exports this module) and works
from any directory: outputs go to $PIPELINE_ROOT or the current directory (`pipeline.core.artifacts.output_root`).
Each task is a function of `pipeline.cli.commands` (its docstring is the task's help). Exit codes (pipeline/core/errors.py):
0 ok; 2 bad input, a missing prerequisite or a command line invoke cannot parse; 3 an artifact differs from its
manifest or release record; 4 this host lacks the GPU/toolchain (or an engine was built for another); 5 the work ran
and failed (I/O error, failed requests).
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import re
import sys
from collections.abc import Callable, Iterator

from invoke import Collection, Program
from invoke.exceptions import Exit, ParseError

from pipeline import __version__
from pipeline.cli import commands
from pipeline.cli.flags import command_task
from pipeline.core.errors import SpecError

BINARY = "trtllm-pipeline"
CHOICES_INLINE = 16  # longer value lists are shown in the flag's help instead of its spec

check = command_task(commands.check_command, auto_precision=True)
plan = command_task(commands.plan_command)
download = command_task(commands.download_command)
calibrate = command_task(commands.calibrate_command)
compile_engines = command_task(commands.compile_command)
package = command_task(commands.package_command)
build = command_task(commands.build_command, auto_precision=True)
release = command_task(commands.release_command)
verify = command_task(commands.verify_command, positional=["path"])
install_repo = command_task(commands.install_repo_command)
serve = command_task(commands.serve_command, optional_spec=True)
smoke = command_task(commands.smoke_command, optional_spec=True)
bench = command_task(commands.bench_command, iterable=["concurrency"])
deploy = command_task(commands.deploy_command, optional_spec=True, spec_warnings=False,
                      iterable=["node_selector", "toleration", "rdma_resource", "nccl_env", "monitoring_label"])

namespace = Collection(check, plan, download, calibrate, compile_engines, package, build, release, verify,
                       install_repo, serve, smoke, bench, deploy)


def usage_error(exc: ParseError, binary: str) -> str:
    """One line for a command line invoke could not parse: the problem and the fix."""
    text = str(exc).strip()
    context = getattr(getattr(exc, "context", None), "name", None)
    task_help = f"{binary} {context} --help" if context else f"{binary} TASK --help"
    if m := re.match(r"No idea what '(.*)' is!", text):
        what = m.group(1)
        kind = "flag" if what.startswith("-") else "task"
        where = f" of `{context}`" if context and kind == "flag" else ""
        return (f"error: unknown {kind} {what!r}{where}; `{binary} --list` shows the tasks and `{task_help}` "
                "a task's flags")
    if m := re.match(r"Flag <Argument: ([\w-]+).*> needed value and was not given one!", text):
        flag = "--" + m.group(1).replace("_", "-")
        return f"error: {flag} needs a value ({flag}=VALUE); `{task_help}` shows what it takes"
    return f"error: {text}; `{task_help}` shows the flags"


@contextlib.contextmanager
def _usage_errors(binary: str) -> Iterator[None]:
    """Parse errors become one line and exit 2 (invoke's own handling exits 1, which pipeline/core/errors.py keeps for
    bugs)."""
    try:
        yield
    except ParseError as exc:
        raise Exit(usage_error(exc, binary), code=SpecError.exit_code) from None


def typed_help_tuples(tuples: list[tuple[str, str | None]], metavars: dict[str, str]) -> list[tuple[str, str | None]]:
    """A task's (flag spec, help) pairs with each flag's value type (INT, FLOAT, a|b|c) instead of STRING."""
    out = []
    for spec, text in tuples:
        flag = spec.split("=")[0].split(",")[-1].strip().lstrip("-").replace("-", "_")
        kind = metavars.get(flag)
        if kind and "=STRING" in spec:
            if len(kind) > CHOICES_INLINE:  # a long list of choices goes into the help, the column stays narrow
                spec, text = spec.replace("=STRING", "=CHOICE"), f"{text or ''} (one of: {kind.replace('|', ', ')})"
            else:
                spec = spec.replace("=STRING", f"={kind}")
        out.append((spec, text))
    return out


def _print_task_help(program: Program, name: str) -> None:
    context = program.parser.contexts[name]
    tuples = typed_help_tuples(context.help_tuples(), getattr(program.collection[name], "metavars", {}))
    context.help_tuples = lambda: tuples
    try:
        Program.print_task_help(program, name)
    finally:
        del context.help_tuples  # the class's method again


class PipelineProgram(Program):
    """invoke's Program with this package's collection, typed flag help, and exit 2 for unparsable command lines."""

    def parse_core(self, argv) -> None:
        with _usage_errors(self.binary):
            super().parse_core(argv)

    def parse_tasks(self) -> None:
        with _usage_errors(self.binary):
            super().parse_tasks()

    def parse_cleanup(self) -> None:
        with _usage_errors(self.binary):
            super().parse_cleanup()

    def print_task_help(self, name: str) -> None:
        _print_task_help(self, name)


def quick_exit() -> None:
    """Make interpreter shutdown skip the final garbage collection over everything the command imported (0.1-0.3 s
    per command on a small host): at exit, every live object moves to the permanent generation (`gc.freeze`).
    atexit handlers, `weakref.finalize` callbacks and the flush of stdout/stderr still run; only objects kept alive
    by reference cycles are not finalized, and our writers close their files (`with`) before returning."""
    if not getattr(quick_exit, "registered", False):
        atexit.register(gc.freeze)  # registered first, so it runs after every later-registered handler
        quick_exit.registered = True


def adopt(program: Program, binary: str = "invoke") -> None:
    """Give a running plain `invoke` Program (a checkout's `tasks.py` loading this collection) the same parse-error
    exit code and typed help. Errors found before the collection loads (a core flag such as -c without its value)
    keep invoke's exit 1."""

    def guarded(step: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            with _usage_errors(binary):
                step()
        return run

    if getattr(program, "_pipeline_adopted", False):
        return
    quick_exit()
    program.parse_tasks = guarded(program.parse_tasks)
    program.parse_cleanup = guarded(program.parse_cleanup)
    program.print_task_help = lambda name: _print_task_help(program, name)
    program._pipeline_adopted = True


program = PipelineProgram(name=BINARY, binary=BINARY, binary_names=[BINARY], namespace=namespace,
                          version=__version__)


def main(argv: list[str] | None = None) -> None:
    """Entry point of the `trtllm-pipeline` console script."""
    quick_exit()
    program.run(argv if argv is not None else sys.argv)
