"""CLI plumbing shared by every invoke task: one definition of the spec flags, one error-to-exit mapping."""

from __future__ import annotations

import functools
import inspect
import math
import re
import sys
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from pipeline.core.errors import PipelineError, SpecError, io_error, os_error_in
from pipeline.core.spec import AUTO, SECTIONS, BuildSpec
from pipeline.stages.check import resolve_checked_spec


@dataclass(frozen=True)
class Flag:
    name: str  # python parameter name (invoke shows it with dashes)
    field: str | None  # resolve_spec override name; None: handled specially
    help: str
    default: Any = None


def _spec_help(field: str) -> str:
    for cls in SECTIONS.values():
        if field in cls.model_fields:
            return cls.model_fields[field].description or field
    return field


def metavar(annotation: Any) -> str | None:
    """How help shows a flag's value: INT, FLOAT, a|b|c for choices, STRING; None for a switch or unknown type."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is Literal:
        return "|".join(str(a) for a in args)
    if origin in (typing.Union, types.UnionType):
        kinds = [metavar(a) for a in args if a is not type(None)]
        return kinds[0] if len(kinds) == 1 else None
    if origin in (list, tuple):
        return metavar(args[0]) if args else None
    return {int: "INT", float: "FLOAT", str: "STRING", bool: "BOOL"}.get(annotation)


def _spec_metavar(field: str | None) -> str | None:
    for cls in (BuildSpec, *SECTIONS.values()):
        if field in cls.model_fields:
            kind = metavar(cls.model_fields[field].annotation)
            return f"{kind}|{AUTO}" if field == "precision" else kind  # `auto`: resolve_spec's request, never held
    return None


def _flag(name: str, field: str | None = None, help: str | None = None, default: Any = None) -> Flag:
    field = name if field is None else field
    return Flag(name, field, help or _spec_help(field), default)


# Every task that takes a build spec takes exactly these flags (values arrive as strings; pydantic coerces).
SPEC_FLAGS: tuple[Flag, ...] = (
    Flag("model", "model", "registry model name (llama-70b, qwen2.5-7b, qwen3-8b, mistral-7b, mixtral-8x7b, tiny-llama, ...) or "
         "hf:ORG/NAME[@REVISION] (numbers from that Hub repo's config.json)"),
    _flag("precision"),
    _flag("kv_cache"),
    _flag("tp"),
    _flag("pp"),
    _flag("moe_ep"),
    _flag("gpu"),
    _flag("gpu_count"),
    _flag("nodes"),
    _flag("gpus_per_node"),
    _flag("draft"),
    _flag("draft_len"),
    _flag("draft_precision"),
    _flag("draft_tp"),
    _flag("draft_max_batch", "draft_max_batch_size"),
    _flag("max_batch", "max_batch_size"),
    _flag("max_input_len"),
    _flag("max_seq_len"),
    _flag("max_num_tokens"),
    _flag("tokens_per_block"),
    _flag("calib_data"),
    _flag("calib_size"),
    _flag("calib_seq_len"),
    _flag("max_ppl_delta", "max_ppl_delta_pct"),
    _flag("mem_fraction", "kv_cache_free_gpu_mem_fraction"),
    _flag("decoupled"),
    _flag("gpu_price", "gpu_price_per_hour"),
    Flag("target", "target", "serving target: trtllm (GPU, TensorRT-LLM) or reference (CPU PyTorch backend)"),
    Flag("runtime", "runtime", "TensorRT-LLM runtime: engine (trtllm-build engines) or pytorch (quantized HF "
         "checkpoint on the PyTorch backend / LLM API)"),
    Flag("spec", None, "YAML file with a whole spec; flags override it"),
    Flag("models_file", None, "extra model registry YAML (entries override the packaged ones)"),
    Flag("no_kv_reuse", None, "disable KV-cache reuse (prefix caching)", False),
    Flag("no_chunked_context", None, "disable chunked context", False),
    Flag("no_quality_gate", None, "record but do not enforce the calibration quality gate", False),
    Flag("no_multiple_profiles", None, "build a single TensorRT optimization profile", False),
    Flag("tp_across_nodes", None, "allow a TP group to span nodes (all-reduce over the network; slow)", False),
)


def spec_from_flags(values: dict[str, Any]):
    """Resolve a validated `BuildSpec` from the spec flags' values, unset engine limits chosen by the memory model
    (`pipeline.planning.limits_choice`)."""

    overrides = {f.field: values.get(f.name) for f in SPEC_FLAGS if f.field}
    if values.get("no_kv_reuse"):
        overrides["enable_kv_cache_reuse"] = False
    if values.get("no_chunked_context"):
        overrides["enable_chunked_context"] = False
    if values.get("no_quality_gate"):
        overrides["quality_gate"] = False
    if values.get("no_multiple_profiles"):
        overrides["multiple_profiles"] = False
    if values.get("tp_across_nodes"):
        overrides["tp_across_nodes"] = True
    return resolve_checked_spec(spec_file=values.get("spec"), models_file=values.get("models_file"), **overrides)


def int_option(name: str, value: Any, *, maximum: float, minimum: float = 1, default: Any = None,
               kind: type = int) -> Any:
    """A task's own numeric option (invoke hands over strings): None gives `default`; a value that is not a finite
    number within `minimum`..`maximum` (every option has a finite bound) raises `SpecError`."""
    if value is None or value == "":
        return default
    flag = "--" + name.replace("_", "-")
    what = "an integer" if kind is int else "a number"
    given = repr(value) if len(repr(value)) <= 40 else repr(value)[:30] + "...(long)"
    try:
        number = kind(value)
    except (TypeError, ValueError, OverflowError):  # int() refuses over 4,300 digits with a ValueError
        raise SpecError(f"{flag}={given}: expected {what} >= {minimum:g}") from None
    if not math.isfinite(number):  # NaN passes every comparison, inf every minimum
        raise SpecError(f"{flag}={given}: expected a finite number >= {minimum:g}")
    if number < minimum:
        raise SpecError(f"{flag}={number}: must be >= {minimum:g}")
    if number > maximum:
        most = f"{maximum:g}" if isinstance(maximum, float) else maximum
        raise SpecError(f"{flag}={given if len(str(number)) > 40 else number}: must be within {minimum:g}..{most}")
    return number


def exit_on_error(fn: Callable) -> Callable:
    """Map `PipelineError` to one line on stderr and its exit code (`pipeline.core.errors` documents them), and an
    `OSError` (disk full, file too large, permission; also as reported by native libraries such as safetensors) to
    one line and exit 5; never a traceback for these."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except PipelineError as exc:
            print(f"error: {exc}", file=sys.stderr)
            raise SystemExit(exc.exit_code) from None
        except Exception as exc:
            if (os_exc := os_error_in(exc)) is None:
                raise  # a bug: keep the traceback
            err = io_error(os_exc, f"`invoke {wrapper.__name__.replace('_', '-')}`")
            print(f"error: {err}", file=sys.stderr)
            raise SystemExit(err.exit_code) from None

    return wrapper


def sentence_first(doc: str) -> str:
    """`doc` with its whole first sentence on its first line (`--list` shows that line)."""
    head, sep, rest = doc.partition("\n\n")
    joined = " ".join(line.strip() for line in head.splitlines())
    end = re.search(r"(?<!e\.g)(?<!i\.e)\.\s", joined)
    sentence, tail = (joined[:end.start() + 1], joined[end.end():]) if end else (joined, "")
    return "\n".join(x for x in (sentence, tail) if x) + sep + rest


def split_docstring(doc: str | None) -> tuple[str, dict[str, str]]:
    """A docstring without its `Args:` section, and that section as {parameter: help} (continuation lines joined)."""
    text, _, args = inspect.cleandoc(doc or "").partition("\nArgs:\n")
    helps: dict[str, str] = {}
    name = None
    for line in args.splitlines():
        if line.startswith("        ") and name:
            helps[name] += " " + line.strip()
        elif line.startswith("    ") and ":" in line:
            name, _, text_ = line.strip().partition(":")
            helps[name.rstrip("_")] = text_.strip()
        else:
            break
    return text.rstrip(), helps


def command_task(fn: Callable, *, optional_spec: bool = False, spec_warnings: bool = True,
                 auto_precision: bool = False, **task_kwargs: Any):
    """An invoke task running the library function `fn` (`pipeline.cli.commands`), with help from its docstring.

    `fn(spec, *, own...)` also takes every spec flag and receives the validated `BuildSpec` (with
    `optional_spec=True`, None unless --model or --spec is given: `serve`/`smoke` take a repository path instead);
    `fn(own...)` takes only its own parameters. The task is named after `fn` without its `_command` suffix;
    errors print one line and exit with their code (`exit_on_error`). `spec_warnings=False`: `fn` prints the
    warnings of the spec it settles on itself (deploy picks TP/PP after the flags are read). `auto_precision`: `fn`
    takes a `precision: auto` spec (build chooses, check shows the candidates); other tasks refuse one.
    """
    from invoke import task

    name = fn.__name__.removesuffix("_command")
    doc, own_help = split_docstring(fn.__doc__)
    params = list(inspect.signature(fn).parameters.values())
    takes_spec = bool(params) and params[0].name == "spec"
    own = [p.replace(kind=inspect.Parameter.POSITIONAL_OR_KEYWORD) for p in params[int(takes_spec):]]
    names = {p.name for p in own}
    spec_flags = [f for f in SPEC_FLAGS if f.name not in names] if takes_spec else []

    def body(c, **kwargs):
        if not takes_spec:
            return fn(**kwargs)
        flag_values = {f.name: kwargs.pop(f.name, f.default) for f in spec_flags}
        spec = None
        if not optional_spec or flag_values.get("model") or flag_values.get("spec"):
            spec = spec_from_flags(flag_values)
            if spec.auto_precision is not None and not auto_precision:
                raise SpecError(f"precision=auto is chosen by `invoke build`; pass --precision "
                                f"{' or '.join(spec.auto_precision.candidates)} to `invoke {name.replace('_', '-')}`")
            for w in spec.warnings if spec_warnings else ():
                print(f"warning: {w}", file=sys.stderr)
        return fn(spec, **kwargs)

    body.__name__ = name
    body.__doc__ = sentence_first(doc)
    body.__module__ = fn.__module__
    ctx = inspect.Parameter("c", inspect.Parameter.POSITIONAL_OR_KEYWORD)
    extra = [inspect.Parameter(f.name, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=f.default)
             for f in spec_flags]
    body.__signature__ = inspect.Signature([ctx, *own, *extra])
    helps = {**({f.name: f.help for f in spec_flags}), **own_help}
    task_kwargs.setdefault("name", name.replace("_", "-"))
    made = task(exit_on_error(body), auto_shortflags=False, help=helps, **task_kwargs)
    hints = typing.get_type_hints(fn)
    kinds = {p.name.rstrip("_"): metavar(hints[p.name]) for p in own if p.name in hints}  # from_ is --from
    kinds |= {f.name: _spec_metavar(f.field) for f in spec_flags}
    made.metavars = {k: v for k, v in kinds.items() if v}  # typed help (pipeline.cli.console)
    return made
