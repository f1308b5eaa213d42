"""The installed command `trtllm-pipeline` (pipeline.cli.console): the package's own collection from any directory,
typed help, --version, and exit 2 with one line for a command line that does not parse."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
from invoke.util import helpline

from pipeline import __version__
from pipeline.cli import commands
from pipeline.cli.console import namespace
from pipeline.cli.flags import sentence_first

ROOT = Path(__file__).resolve().parents[2]
MAIN = "from pipeline.cli.console import main; main()"


def console(*args: str, cwd: Path, python: str = sys.executable, env=None) -> subprocess.CompletedProcess:
    return subprocess.run([python, "-c", MAIN, *args], cwd=cwd, capture_output=True, text=True, timeout=120,
                          env=env)


@pytest.mark.parametrize("args, problem, fix", [
    (("nosuchtask",), "unknown task 'nosuchtask'", "trtllm-pipeline --list"),
    (("plan", "--bogus"), "unknown flag '--bogus' of `plan`", "trtllm-pipeline plan --help"),
    (("plan", "--model"), "--model needs a value (--model=VALUE)", "trtllm-pipeline plan --help"),
    (("--help", "nosuch"), "unknown task 'nosuch'", "trtllm-pipeline --list"),
])
def test_parse_errors_exit_2_with_one_line(tmp_path, args, problem, fix):
    r = console(*args, cwd=tmp_path)
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and problem in lines[0] and fix in lines[0], r.stderr
    assert r.stdout == ""


def test_invoke_in_the_checkout_exits_2_for_parse_errors_too():
    for args in (("nosuchtask",), ("check", "--model")):
        r = subprocess.run([sys.executable, "-m", "invoke", *args], cwd=ROOT, capture_output=True, text=True,
                           timeout=120)
        assert r.returncode == 2 and r.stderr.startswith("error: ") and "`invoke " in r.stderr, r.stderr


def test_version_and_list_from_an_empty_directory(tmp_path):
    r = console("--version", cwd=tmp_path)
    assert r.returncode == 0 and r.stdout.strip() == f"trtllm-pipeline {__version__}"
    r = console("--list", cwd=tmp_path)
    assert r.returncode == 0 and "build" in r.stdout and "smoke" in r.stdout
    r = console("--print-completion-script", "bash", cwd=tmp_path)
    assert r.returncode == 0 and "complete -F _complete_trtllm-pipeline" in r.stdout and "trtllm-pipeline" in r.stdout
    r = console("--complete", "--", "trtllm-pipeline", "pla", cwd=tmp_path)
    assert "plan" in r.stdout.split()
    assert list(tmp_path.iterdir()) == []


def test_help_shows_each_flags_type(tmp_path):
    r = console("plan", "--help", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    for spec in ("--tp=INT", "--gpu-price=FLOAT", "--input-len=INT", "--acceptance=FLOAT",
                 "--target=trtllm|reference", "--precision=CHOICE", "--decoupled=BOOL", "--spec=STRING"):
        assert spec in r.stdout, spec
    assert "(one of: bf16, fp16, fp8, int4_awq, w4a8_awq, int8_sq)" in " ".join(r.stdout.split())
    assert "--tp=STRING" not in r.stdout
    r = console("build", "--help", cwd=tmp_path)
    assert "--from=CHOICE" in r.stdout and "--until=CHOICE" in r.stdout  # from_ is --from


def test_list_shows_whole_first_sentences():
    for task in namespace.tasks.values():
        line = helpline(task)
        assert line.endswith("."), (task.name, line)
    check = helpline(namespace.tasks["check"])
    assert check.startswith("Validate a build spec") and check.endswith("(exit 4 naming the numbers and ways out).")
    assert helpline(namespace.tasks["check"]) == sentence_first(commands.check_command.__doc__.strip()).split("\n")[0]


def test_sentence_first():
    assert sentence_first("Do a\nthing, e.g. this. Then\nmore.\n\nArgs:\n    x: y") == \
        "Do a thing, e.g. this.\nThen more.\n\nArgs:\n    x: y"
    assert sentence_first("One line") == "One line"


def _installed_venv(tmp_path: Path) -> Path:
    """A fresh venv with a real (non-editable) `pip install` of this checkout, its dependencies taken from the
    test venv's site-packages (offline, fast)."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    (Path(site) / "_parent_venv.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-build-isolation", "--no-deps", str(ROOT)],
                   check=True, timeout=600, capture_output=True)
    return venv


@pytest.mark.slow
def test_installed_command_builds_and_smokes_from_an_empty_directory(tmp_path, pipeline_env):
    """`pip install <checkout>`, then `trtllm-pipeline build` and `smoke` from an empty directory: outputs land
    there, never in site-packages; smoke counts tokens the same way on HTTP and gRPC."""
    venv = _installed_venv(tmp_path)
    exe = venv / "bin" / "trtllm-pipeline"
    work = tmp_path / "empty"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "PIPELINE_ROOT"}
    env["PATH"] = f"{venv / 'bin'}:{env['PATH']}"
    where = subprocess.run([str(venv / "bin" / "python"), "-c", "import pipeline; print(pipeline.__file__)"],
                           cwd=work, env=env, capture_output=True, text=True, check=True).stdout
    assert where.startswith(str(venv)), where  # the installed copy, not the checkout
    spec = ["--model", "tiny-llama", "--precision", "fp8", "--target", "reference"]
    r = subprocess.run([str(exe), "build", *spec], cwd=work, env=env, capture_output=True, text=True, timeout=1200)
    assert r.returncode == 0, r.stderr[-3000:]
    assert sorted(p.name for p in work.iterdir()) == ["engines", "triton_repo"]
    site = Path(where).parent.parent
    assert not (site / "engines").exists() and not (site / "triton_repo").exists()
    r = subprocess.run([str(exe), "smoke", *spec], cwd=work, env=env, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    counts = [line.split(" | ")[1] for line in r.stdout.splitlines() if " tokens (counted from " in line]
    assert len(counts) == 2 and counts[0] == counts[1], r.stdout  # HTTP and gRPC: the same count, the same source


def test_typed_choices_match_the_library():
    from pipeline.cli.flags import option
    from pipeline.ops.deploy.runtime import SERVE_MODES
    from pipeline.ops.deploy.slurm import MPI_TYPES
    from pipeline.stages.build import STAGES

    for task, flag in (("build", "until"), ("build", "from"), ("build", "force")):
        assert option(task, flag).choices == STAGES
    assert option("serve", "mode").choices == SERVE_MODES == option("deploy", "serve_mode").choices
    assert option("deploy", "mpi").choices == MPI_TYPES


@pytest.mark.parametrize("cli", [
    "from pipeline.cli.console import main; main(['trtllm-pipeline', '--list'])",  # the installed command
    "import sys, runpy; sys.argv = ['invoke', '--list']; runpy.run_module('invoke', run_name='__main__')",  # tasks.py
])
def test_exit_freezes_the_heap_after_the_commands_exit_handlers(cli):
    """Shutdown skips the final collection over everything a command imported (`console.quick_exit`): by the time
    the exit handlers registered before the command run, the heap is frozen, and the command's output is out."""
    probe = "import atexit, gc; atexit.register(lambda: print('frozen objects at exit:', gc.get_freeze_count()))"
    r = subprocess.run([sys.executable, "-c", f"{probe}\n{cli}"], cwd=ROOT, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    *listing, last = r.stdout.strip().splitlines()
    assert any("build" in line for line in listing), r.stdout
    assert last.startswith("frozen objects at exit: ") and int(last.split()[-1]) > 10_000, r.stdout


def test_help_lists_the_tasks_not_invokes_own_options(tmp_path):
    r = console("--help", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("Usage: trtllm-pipeline ")
    for task in namespace.tasks:
        assert f"\n  {task} " in r.stdout, task
    for invoke_own in ("sudo", "--pty", "--echo", "--hide", "--command-timeout"):
        assert invoke_own not in r.stdout, invoke_own
    assert "--list" in r.stdout and "--version" in r.stdout


@pytest.mark.parametrize("argv, program", [
    ([sys.executable, "-c", MAIN], "trtllm-pipeline"),
    ([sys.executable, "-m", "invoke"], "invoke"),
])
def test_messages_name_the_program_the_user_ran(tmp_path, argv, program):
    other = "invoke" if program == "trtllm-pipeline" else "trtllm-pipeline"
    cwd = ROOT if program == "invoke" else tmp_path
    env = dict(os.environ, PIPELINE_ROOT=str(tmp_path / "out"), PIPELINE_CACHE=str(tmp_path / "cache"))
    for args, needle in ((["plan", "--model", "tiny-llama", "--precision", "auto"], f"`{program} build`"),
                         (["plan", "--bogus"], f"`{program} plan --help`"),
                         (["verify", "--help"], f"usage: {program} verify PATH"),
                         (["release", "--model", "tiny-llama", "--target", "reference"], f"run `{program} build`")):
        r = subprocess.run([*argv, *args], cwd=cwd, capture_output=True, text=True, timeout=120, env=env)
        assert r.returncode == 2 and needle in r.stderr, (args, r.stderr)
        assert f"`{other} " not in r.stderr and f"{other} verify" not in r.stderr, r.stderr


@pytest.mark.parametrize("argv", [
    [sys.executable, "-c", MAIN, "plan", "--model", "llama-70b", "--compare"],
    [sys.executable, "-m", "invoke", "plan", "--model", "llama-70b", "--compare"],
    [sys.executable, "-c", MAIN, "--list"],
])
def test_a_closed_stdout_exits_quietly_with_141(argv):
    """`plan | head`: the reader is gone before the command writes; no message, exit 128 + SIGPIPE."""
    proc = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()  # long before the interpreter has started and written
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 141, err
    assert err == ""


def test_a_broken_pipe_that_is_not_stdout_is_an_io_error(capsys):
    from pipeline.cli.flags import exit_on_error

    def bench():
        raise BrokenPipeError(32, "Broken pipe")  # e.g. a server's socket

    with pytest.raises(SystemExit) as info:
        exit_on_error(bench)()
    assert info.value.code == 5 and capsys.readouterr().err.startswith("error: `invoke bench` failed: ")


def test_invoke_with_a_search_root_from_another_directory(tmp_path):
    """The deployments' node scripts run `invoke -r /opt/trtllm-pipeline TASK`: invoke's -r (and -c) still work."""
    r = subprocess.run([sys.executable, "-m", "invoke", "-r", str(ROOT), "check", "--model", "tiny-llama",
                        "--skip-host-check"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.startswith("ok: tiny-llama"), r.stderr
    r = subprocess.run([sys.executable, "-m", "invoke", "-r", str(ROOT), "-c", "tasks", "nosuch"], cwd=tmp_path,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and r.stderr.startswith("error: unknown task 'nosuch'; `invoke --list`"), r.stderr


def test_a_refused_command_line_with_an_inverse_flag_is_diagnosed():
    """`--no-cache` (invoke's inverse of a switch that defaults to true) stands for `--cache`: the diagnosis reads that
    argument, and still names the flag that is missing its value after it."""
    from invoke.parser import Argument, ParserContext

    from pipeline.cli.console import _diagnose

    task = ParserContext(name="t", args=[Argument(names=("cache",), kind=bool, default=True),
                                         Argument(names=("count",), kind=int)])
    initial = ParserContext(args=[Argument(names=("help",), kind=bool)])
    assert _diagnose(["t", "--no-cache", "--count"], {"t": task}, initial) == ("value", "--count", "t")
    assert _diagnose(["t", "--no-y"], {"t": task}, initial) == ("flag", "--no-y", "t")
