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
