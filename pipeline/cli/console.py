"""The task collection and the program that runs it: the installed `trtllm-pipeline` command, and `invoke` in a
checkout (whose `tasks.py` hands the command line to this same program, named `invoke`).

`trtllm-pipeline TASK ...` works from any directory: outputs go to $PIPELINE_ROOT or the current directory
(`pipeline.core.artifacts.output_root`). Each task is a function of `pipeline.cli.commands` (its docstring is the
task's help) with the flags `pipeline.cli.flags` lists for it. Exit codes (pipeline/core/errors.py): 0 ok; 2 bad
input, a missing prerequisite or a command line that does not parse; 3 an artifact differs from its manifest or
release record; 4 this host lacks the GPU/toolchain (or an engine was built for another); 5 the work ran and failed
(I/O error, failed requests); 141 stdout was closed early (`trtllm-pipeline plan | head`: nothing more is printed,
as a Unix tool killed by SIGPIPE reports 128 + 13).
"""

from __future__ import annotations

import atexit
import functools
import gc
import inspect
import keyword
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from invoke import Collection, Program, Task
from invoke.exceptions import Exit, ParseError
from invoke.parser import Argument, ParserContext

from pipeline import __version__
from pipeline.cli import commands
from pipeline.cli import flags as cli_flags
from pipeline.cli.flags import (
    SPEC_FLAGS,
    TASK_FLAGS,
    exit_on_error,
    option,
    sentence_first,
    spec_from_flags,
    value_name,
)
from pipeline.core.errors import SpecError

BINARY = "trtllm-pipeline"
CHOICES_INLINE = 16  # longer value lists are shown in the flag's help instead of its spec
SIGPIPE_EXIT = 141  # 128 + SIGPIPE, what a shell reports for a writer whose reader went away
CORE_HELP = {"help", "list", "version", "complete", "print-completion-script"}  # core flags `--help` shows


@dataclass(frozen=True)
class TaskDef:
    """A task: its function, whether it takes a spec (`required`, `optional`: only with --model or --spec, or
    None), and its positional flags. `spec_warnings=False`: the function prints the warnings of the spec it settles
    on itself. `auto_precision`: it takes a `precision: auto` spec (build chooses, check shows the candidates)."""

    fn: Callable[..., Any]
    spec: Literal["required", "optional"] | None = "required"
    positional: tuple[str, ...] = ()
    spec_warnings: bool = True
    auto_precision: bool = False


TASKS: dict[str, TaskDef] = {
    "check": TaskDef(commands.check_command, auto_precision=True),
    "plan": TaskDef(commands.plan_command),
    "download": TaskDef(commands.download_command),
    "calibrate": TaskDef(commands.calibrate_command),
    "compile": TaskDef(commands.compile_command),
    "package": TaskDef(commands.package_command),
    "build": TaskDef(commands.build_command, auto_precision=True),
    "release": TaskDef(commands.release_command),
    "verify": TaskDef(commands.verify_command, spec=None, positional=("path",)),
    "install_repo": TaskDef(commands.install_repo_command, spec=None),
    "serve": TaskDef(commands.serve_command, spec="optional"),
    "smoke": TaskDef(commands.smoke_command, spec="optional"),
    "bench": TaskDef(commands.bench_command),
    "deploy": TaskDef(commands.deploy_command, spec="optional", spec_warnings=False),
}


def _param(flag: str) -> str:
    return flag + "_" if keyword.iskeyword(flag) else flag  # `from` is --from


def _help(task: str, flag: str) -> str:
    opt = option(task, flag)
    kind = value_name(opt)
    if kind and len(kind) > CHOICES_INLINE:  # a long list of choices goes into the help, the column stays narrow
        return f"{opt.help} (one of: {kind.replace('|', ', ')})"
    return opt.help


def make_task(name: str, d: TaskDef) -> Task:
    """The invoke task `name` running `d.fn`: one keyword parameter per flag of the table (the signature invoke
    reads), the spec flags resolved into the `BuildSpec` the function receives, errors as one line
    (`exit_on_error`)."""
    spec_flags = SPEC_FLAGS if d.spec else ()
    flags = (*TASK_FLAGS[name], *spec_flags)

    def body(c, **values):
        values = {key.rstrip("_"): value for key, value in values.items()}
        if d.spec is None:
            return d.fn(**values)
        given = {flag: values.pop(flag, None) for flag in spec_flags}
        spec = None
        if d.spec == "required" or given.get("model") or given.get("spec"):
            spec = spec_from_flags(given)
            if spec.auto_precision is not None and not d.auto_precision:
                raise SpecError(f"precision=auto is chosen by `{cli_flags.PROGRAM} build`; pass --precision "
                                f"{' or '.join(spec.auto_precision.candidates)} to `{cli_flags.PROGRAM} "
                                f"{cli_flags.task_name(name)}`")
            for w in spec.warnings if d.spec_warnings else ():
                print(f"warning: {cli_flags.for_program(w)}", file=sys.stderr)
        return d.fn(spec, **values)

    body.__name__ = name
    body.__doc__ = sentence_first(inspect.cleandoc(d.fn.__doc__ or ""))
    body.__module__ = d.fn.__module__
    params = [inspect.Parameter("c", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    for flag in flags:
        switch = option(name, flag).kind is bool and option(name, flag).field is None  # a spec bool takes a value
        default = inspect.Parameter.empty if flag in d.positional else (False if switch else None)
        params.append(inspect.Parameter(_param(flag), inspect.Parameter.POSITIONAL_OR_KEYWORD, default=default))
    # what invoke's Task.argspec reads (inspect.signature honours `__signature__`, which functions do not declare)
    setattr(body, "__signature__", inspect.Signature(params))
    iterable = [flag for flag in flags if option(name, flag).kind is list]
    return Task(exit_on_error(body), name=cli_flags.task_name(name), auto_shortflags=False,
                help={flag: _help(name, flag) for flag in flags}, positional=list(d.positional), iterable=iterable)


check, plan, download, calibrate, compile_engines, package, build, release, verify, install_repo, serve, smoke, \
    bench, deploy = (make_task(name, d) for name, d in TASKS.items())
namespace = Collection(check, plan, download, calibrate, compile_engines, package, build, release, verify,
                       install_repo, serve, smoke, bench, deploy)


def typed_help_tuples(task: str, tuples: list[tuple[str, str | None]]) -> list[tuple[str, str | None]]:
    """A task's (flag spec, help) pairs with each flag's value type (INT, FLOAT, a|b|c) instead of STRING."""
    out = []
    for spec, text in tuples:
        flag = spec.split("=")[0].split(",")[-1].strip().lstrip("-").replace("-", "_")
        kind = value_name(option(task, flag)) if flag in (*TASK_FLAGS[task], *SPEC_FLAGS) else None
        if kind and "=STRING" in spec:
            spec = spec.replace("=STRING", "=CHOICE" if len(kind) > CHOICES_INLINE else f"={kind}")
        out.append((spec, text))
    return out


def _argument(ctx: ParserContext | None, initial: ParserContext, flag: str) -> Argument | None:
    """What `flag` sets: an argument of the task context `ctx` (`--no-x`: `--x`), else a core flag."""
    found = ctx.flags.get(ctx.inverse_flags.get(flag, flag)) if ctx else None
    return found or initial.flags.get(flag)


def _diagnose(tokens: list[str], contexts: dict[str, ParserContext],
              initial: ParserContext) -> tuple[str, str, str | None] | None:
    """The first thing wrong in `tokens` (a command line invoke refused): ("task", word, None), ("flag", word,
    task) or ("value", flag, task); None when it is something else."""
    ctx, waiting, positional = None, None, 0
    for token in tokens:
        if waiting is not None:
            waiting = None
            continue
        if token.startswith("-") and len(token) > 1:
            name = token.split("=", 1)[0]
            arg = _argument(ctx, initial, name)
            if arg is None:
                return "flag", name, ctx.name if ctx else None
            if arg.takes_value and not arg.optional and "=" not in token:
                waiting = name
        elif positional:
            positional -= 1
        elif token in contexts:
            ctx = contexts[token]
            positional = len(ctx.positional_args)
        else:
            return "task", token, None
    if waiting is not None:
        return "value", waiting, ctx.name if ctx else None
    return None


def _names(flag_spec: str) -> set[str]:
    """{"h", "help"} of "-h [STRING], --help[=STRING]"."""
    return {part.split()[0].split("=")[0].split("[")[0].lstrip("-") for part in flag_spec.split(",")}


class PipelineProgram(Program):
    """invoke's Program over this package's collection: `--help` lists the tasks, task help shows each flag's type,
    a command line that does not parse is one line naming this program and exit 2, a closed stdout a quiet exit."""

    def __init__(self, binary: str = BINARY, *, invoke_flags: bool = False) -> None:
        super().__init__(name=binary, binary=binary, binary_names=[binary], namespace=namespace, version=__version__)
        self.invoke_flags = invoke_flags

    def core_args(self):
        """invoke's core flags; run as `invoke` also -c/-r/--no-dedupe (`invoke -r DIR TASK` command lines)."""
        return super().core_args() + (super().task_args() if self.invoke_flags else [])

    def run(self, argv=None, exit: bool = True) -> None:
        cli_flags.PROGRAM = self.binary
        quick_exit()
        try:
            try:
                super().run(argv, exit)
            finally:
                sys.stdout.flush()
        except BrokenPipeError:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # the exit flush must not fail again
            raise SystemExit(SIGPIPE_EXIT) from None

    def usage_error(self, exc: ParseError, tokens: list[str]) -> str:
        """One line for a command line that does not parse: the problem and the fix."""
        contexts = getattr(getattr(self, "parser", None), "contexts", {})
        found = _diagnose(tokens, contexts, self.initial_context)
        kind, word, task = found if found else (None, None, getattr(exc.context, "name", None))
        task_help = f"{self.binary} {task} --help" if task else f"{self.binary} TASK --help"
        if kind in ("task", "flag"):
            where = f" of `{task}`" if task and kind == "flag" else ""
            return (f"error: unknown {kind} {word!r}{where}; `{self.binary} --list` shows the tasks and `{task_help}` "
                    "a task's flags")
        if kind == "value":
            return f"error: {word} needs a value ({word}=VALUE); `{task_help}` shows what it takes"
        return f"error: {exc}; `{task_help}` shows the flags"

    def parse_tasks(self) -> None:
        try:
            super().parse_tasks()
        except ParseError as exc:
            raise Exit(self.usage_error(exc, self.core.unparsed), code=SpecError.exit_code) from None

    def parse_cleanup(self) -> None:
        try:
            super().parse_cleanup()
        except ParseError as exc:  # --help NAME of no task
            raise Exit(self.usage_error(exc, [str(self.args.help.value)]), code=SpecError.exit_code) from None

    def print_help(self) -> None:
        print(f"Usage: {self.binary} [--options] TASK [--task-options] ...")
        print(f"       {self.binary} TASK --help   (a task's flags)")
        print("")
        self.list_tasks()
        print("Options:")
        print("")
        self.print_columns([t for t in self.initial_context.help_tuples() if CORE_HELP & _names(t[0])])

    def print_task_help(self, name: str) -> None:
        task = name.replace("-", "_")
        tuples = typed_help_tuples(task, self.parser.contexts[name].help_tuples())
        print(f"Usage: {self.binary} {name}{' [--options]' if tuples else ''}")
        print("")
        for line in (inspect.getdoc(self.collection[name]) or "").splitlines():
            print(self.leading_indent + line if line.strip() else "")
        print("")
        print("Options:")
        self.print_columns(tuples)


@functools.cache  # once
def quick_exit() -> None:
    """Make interpreter shutdown skip the final garbage collection over everything the command imported (0.1-0.3 s
    per command on a small host): at exit, every live object moves to the permanent generation (`gc.freeze`).
    atexit handlers, `weakref.finalize` callbacks and the flush of stdout/stderr still run; only objects kept alive
    by reference cycles are not finalized, and our writers close their files (`with`) before returning."""
    atexit.register(gc.freeze)  # registered first, so it runs after every later-registered handler


def main(argv: list[str] | None = None) -> None:
    """Entry point of the `trtllm-pipeline` console script."""
    PipelineProgram().run(argv if argv is not None else sys.argv)


def run_as_invoke(argv: list[str]) -> None:
    """`invoke ...` in a checkout: the same program, named `invoke` (called by `tasks.py` as invoke loads it); exits,
    so that invoke's own program does not go on to run the command line again."""
    PipelineProgram("invoke", invoke_flags=True).run(argv)
    raise SystemExit(0)
