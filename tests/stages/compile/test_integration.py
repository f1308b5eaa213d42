"""Compile plan from REAL calibrate-stage exports of the generated tiny pair (ModelOpt on CPU; slow).

Checks that the planner accepts what `run_calibrate` actually writes (config.json fields, mapping, tokenizer/,
manifest key) — the fabricated configs of the other compile tests are modelled on it.
"""

from __future__ import annotations

import pytest

from pipeline.stages.compile import plan_compile
from pipeline.stages.compile.manifest import check_same_tokenizer, checkpoint_identity
from tests.support import calibrate_fixtures

PAIR = {"precision": "fp8", "kv_cache": "fp8", "draft": "tiny-llama-draft"}


@pytest.mark.slow
def test_plan_from_calibrated_tiny_pair(tiny_models, tmp_path):
    target = calibrate_fixtures.calibrated(tiny_models, **PAIR)
    draft = calibrate_fixtures.calibrated(tiny_models, role="draft", **PAIR)
    spec = calibrate_fixtures.make_spec(**PAIR)
    plan = plan_compile(spec, checkpoint_dir=target.path, output_dir=target.path.parent / "engine",
                        draft_checkpoint_dir=draft.path)
    assert not plan.target.checkpoint_derived and plan.target.rank_files == ["rank0.engine"]
    assert plan.target.options["--gpt_attention_plugin"] == "bfloat16"
    assert plan.target.options["--use_fp8_context_fmha"] == "enable"
    assert plan.draft.output_dir == str(target.path.parent / "draft_engine")
    assert check_same_tokenizer(target.path, draft.path) == target.manifest.tokenizer == draft.manifest.tokenizer
    assert checkpoint_identity(target.path).key == target.manifest.key
