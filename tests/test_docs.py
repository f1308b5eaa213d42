"""The docs: README.md is the front door (at most 300 lines), docs/ is a MkDocs site that builds strictly (every
page in the nav, every link and anchor valid), and every repository file README and the pages name exists."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from markdown.extensions.toc import slugify

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
README_MAX_LINES = 300

# The checkout's top-level folders: a path in a page that starts with one of them names a file of the repository.
SOURCE_ROOTS = ("pipeline", "scripts", "benchmarks", "tests", "docs", ".ci", "engines", "triton_repo")
# Paths the pipeline writes when it runs, named in the pages by where they appear (only their README.md is tracked).
GENERATED = {
    "engines/": "stage outputs (checkpoints, engines, refs, logs) under $PIPELINE_ROOT/engines",
    "triton_repo/": "model repositories the package stage writes under $PIPELINE_ROOT/triton_repo",
}
_FENCE = re.compile(r"^(```|~~~).*?^\1[ \t]*$", re.M | re.S)
_SPAN = re.compile(r"(`+)(.+?)\1", re.S)
_LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
_TOKEN = re.compile(r"[A-Za-z0-9_.*<>\-/]+")
_MODULE = re.compile(r"pipeline(?:\.[A-Za-z_]\w*)+")


def _code(text: str) -> tuple[list[str], str]:
    """The code (fenced blocks and inline spans) of a Markdown text, and the text without it."""
    blocks = [m.group(0) for m in _FENCE.finditer(text)]
    rest = _FENCE.sub("", text)
    spans = [m.group(2) for m in _SPAN.finditer(rest)]
    return blocks + spans, _SPAN.sub("", rest)


def _path_problem(token: str, root: Path) -> str | None:
    """Why `token`, a path relative to the checkout, names nothing there (None: it does, or it is not such a path)."""
    token = token.removeprefix("./").rstrip(".")
    if "/" not in token or token.split("/", 1)[0] not in SOURCE_ROOTS:
        return None
    if any(token.startswith(prefix) for prefix in GENERATED):
        return None
    pattern = re.sub(r"<[^>]*>", "*", token)
    if "*" in pattern:
        return None if any(root.glob(pattern.rstrip("/"))) else f"{token}: matches no file"
    return None if (root / token).exists() else f"{token}: no such file"


def _module_problem(dotted: str, root: Path) -> str | None:
    """Why `pipeline.a.b[.name]` names no module of the checkout or no top-level name defined in one."""
    parts = dotted.split(".")
    for n in range(len(parts), 0, -1):
        base = root.joinpath(*parts[:n])
        source = base.with_suffix(".py") if base.with_suffix(".py").is_file() else base / "__init__.py"
        if source.is_file():
            rest = parts[n:]
            if not rest:
                return None
            defined = re.search(rf"^(?:def|class|async def) {rest[0]}\b|^{rest[0]}\s*[:=]", source.read_text(), re.M)
            return None if defined and len(rest) <= 2 else f"{dotted}: {'.'.join(parts[:n])} defines no {rest[0]}"
    return f"{dotted}: no such module"


def _anchors(page: Path) -> set[str]:
    """The heading anchors MkDocs gives a Markdown page (toc's default slugify)."""
    code_free = _FENCE.sub("", page.read_text())
    return {slugify(re.sub(r"[`*]", "", m.group(1)).strip(), "-") for m in re.finditer(r"^#+\s+(.+?)\s*#*$", code_free,
                                                                                          re.M)}


def _link_problem(target: str, base: Path) -> str | None:
    """Why a relative link `target` from a file in `base` leads nowhere (a missing file, or a missing anchor)."""
    if re.match(r"[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
        return None  # another site (http:, mailto:), or an anchor of the same page (MkDocs checks the pages' own)
    path, _, anchor = target.partition("#")
    dest = base / path
    if not dest.exists():
        return f"link {target}: no such file"
    if anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
        return f"link {target}: {path} has no heading #{anchor}"
    return None


def path_problems(text: str, root: Path = ROOT, base: Path | None = None) -> list[str]:
    """What in Markdown `text` names a repository file, module or link target that does not exist: paths and
    `pipeline.*` modules in code (fenced or inline) relative to `root`, and relative links resolved from `base`
    (the page's folder; None: links are not checked, as MkDocs checks the links between its pages)."""
    code, prose = _code(text)
    problems = []
    for chunk in code:
        for token in _TOKEN.findall(chunk):
            if (problem := _path_problem(token, root)) is not None:
                problems.append(problem)
        for dotted in _MODULE.findall(chunk):
            if (problem := _module_problem(dotted, root)) is not None:
                problems.append(problem)
    if base is not None:
        for target in _LINK.findall(prose):
            if (problem := _link_problem(target, base)) is not None:
                problems.append(problem)
    return sorted(set(problems))


def _pages() -> list[Path]:
    return sorted((ROOT / "docs").rglob("*.md"))


def test_readme_is_a_front_door():
    text = README.read_text()
    assert len(text.splitlines()) <= README_MAX_LINES
    # the main job on the embedded tiny model, and the test command CI runs (.ci/run), word for word
    assert "bash scripts/setup.sh && .venv/bin/invoke build --model tiny-llama" in text
    assert "bash scripts/setup.sh && .venv/bin/python -m pytest -q" in text
    assert "bash scripts/setup.sh && .venv/bin/python -m pytest -q" in (ROOT / ".ci" / "run").read_text()
    # every page of the site is reachable from the README
    linked = {(ROOT / t.partition("#")[0]).resolve() for t in _LINK.findall(_code(text)[1])}
    assert [p for p in _pages() if p.resolve() not in linked] == []


def test_readme_names_only_existing_paths():
    assert path_problems(README.read_text(), base=ROOT) == []


@pytest.mark.parametrize("page", _pages(), ids=lambda p: str(p.relative_to(ROOT / "docs")))
def test_docs_page_names_only_existing_paths(page):
    assert path_problems(page.read_text()) == []


def test_the_checker_finds_planted_bad_paths():
    planted = "\n".join([
        "Flags live in `pipeline/cli/flags/flags/flags/flags/console.py`; see [errors](docs/no-such-page.md) and",
        "[the planner's keys](docs/planner.md#no-such-heading), `benchmarks/no_such_*.py`, `pipeline.core.errors.Nope`",
        "and `pipeline.no_such_module`.",
        "```",
        "python scripts/no_such_script.py --out engines/<build-id>/x   # the output is generated: not checked",
        "```",
        "Real ones pass: `pipeline/core/errors.py`, `benchmarks/*.py`, `scripts/setup.sh`, `tests/data/aiconfigurator_slo*`,",
        "`pipeline.core.errors.HostError`, [planner](docs/planner.md#operating-point), `triton_repo/<name>/ensemble`,",
        "`$WORK/serve/x`, [NVIDIA](https://developer.nvidia.com).",
    ])
    assert path_problems(planted, base=ROOT) == [
        "benchmarks/no_such_*.py: matches no file",
        "link docs/no-such-page.md: no such file",
        "link docs/planner.md#no-such-heading: docs/planner.md has no heading #no-such-heading",
        "pipeline.core.errors.Nope: pipeline.core.errors defines no Nope",
        "pipeline.no_such_module: pipeline defines no no_such_module",
        "pipeline/cli/flags/flags/flags/flags/console.py: no such file",
        "scripts/no_such_script.py: no such file",
    ]


def test_source_roots_exist():
    assert [name for name in SOURCE_ROOTS if not (ROOT / name).is_dir()] == []


def _mkdocs(config: Path, site: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(config),
                           "--site-dir", str(site)], capture_output=True, text=True, timeout=300)


def test_mkdocs_build_strict(tmp_path):
    run = _mkdocs(ROOT / "mkdocs.yml", tmp_path / "site")
    assert run.returncode == 0, run.stderr
    built = {p.relative_to(tmp_path / "site") for p in (tmp_path / "site").rglob("index.html")}
    for page in _pages():
        rel = page.relative_to(ROOT / "docs").with_suffix("")
        expected = Path("index.html") if rel.name == "index" else rel / "index.html"
        assert expected in built, page


def test_mkdocs_strict_refuses_a_broken_anchor(tmp_path):
    """The site's settings make a link to a missing heading fail the build, not just log it."""
    shutil.copytree(ROOT / "docs", tmp_path / "docs")
    shutil.copy(ROOT / "mkdocs.yml", tmp_path / "mkdocs.yml")
    page = tmp_path / "docs" / "troubleshooting.md"
    page.write_text(page.read_text() + "\nSee [the planner](planner.md#no-such-heading).\n")
    run = _mkdocs(tmp_path / "mkdocs.yml", tmp_path / "site")
    assert run.returncode != 0 and "no-such-heading" in run.stderr
