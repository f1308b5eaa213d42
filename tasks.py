"""invoke tasks: thin wiring over the `pipeline` library. `invoke --list` shows them; `invoke TASK --help` the flags."""

from __future__ import annotations

import json

from invoke import task

from pipeline.cli import SPEC_HELP, with_spec


def _help(**own: str) -> dict[str, str]:
    return {**SPEC_HELP, **own}


@task(auto_shortflags=False, help=_help())
@with_spec
def check(c, spec):
    """Validate a build spec (model, precision, KV, parallelism, speculation, GPU) and print it in one line."""
    print(spec.summary())


@task(
    auto_shortflags=False,
    help=_help(
        input_len="prompt tokens per request for capacity/throughput (default min(1024, max_input_len))",
        output_len="output tokens per request (default 256)",
        json="print the plan as JSON",
    ),
)
@with_spec
def plan(c, spec, input_len=None, output_len=None, json_=False):
    """Plan memory fit, KV capacity, concurrency, decode throughput bound and $ per 1M output tokens."""
    from pipeline.planner import format_plan, plan as make_plan

    result = make_plan(
        spec,
        input_len=int(input_len) if input_len else None,
        output_len=int(output_len) if output_len else None,
    )
    print(json.dumps(result.as_dict(), indent=2) if json_ else format_plan(result))


@task(
    name="compile",
    auto_shortflags=False,
    help=_help(
        dry_run="print the trtllm-build plan (argv, expected outputs, GPU memory) and exit; works on any machine",
        checkpoint_dir="target TensorRT-LLM checkpoint dir (default: the calibrate stage's engines/<build-id>/checkpoint)",
        draft_checkpoint_dir="draft checkpoint dir (default: the calibrate stage's draft checkpoint)",
        force="rebuild even when the engine manifest's key is current",
        json="print the plan / engine manifest as JSON",
    ),
)
@with_spec
def compile_engines(c, spec, dry_run=False, checkpoint_dir=None, draft_checkpoint_dir=None, force=False, json_=False):
    """Compile TensorRT-LLM 1.2.1 engines (target + draft) for SM 90 from the exported checkpoint(s)."""
    from pipeline.compile.cli import compile_command

    compile_command(spec, dry_run=dry_run, checkpoint_dir=checkpoint_dir, draft_checkpoint_dir=draft_checkpoint_dir,
                    force=force, as_json=json_)
