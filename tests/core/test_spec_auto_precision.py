"""`precision: auto` in the spec: the candidates the GPU and the family's support matrix allow, in the workflow's
order; no identity (no artifact name) until a precision is chosen."""

from __future__ import annotations

import pytest

from pipeline.core.errors import SpecError
from pipeline.core.spec import auto_ladder, resolve_spec


def test_h100_tries_fp8_then_int4_awq_and_the_summary_says_auto():
    spec = resolve_spec(model="tiny-llama", precision="auto", target="reference")
    assert spec.auto_precision.candidates == ("fp8", "int4_awq") and spec.auto_precision.refused == ()
    assert "precision=auto(fp8>int4_awq) kv=per candidate" in spec.summary()
    assert spec.quantization.precision == "fp8"  # stands in for validation until build chooses


def test_a_gpu_without_fp8_tries_int8_sq_first():
    assert auto_ladder("a100") == ("int8_sq", "int4_awq")
    spec = resolve_spec(model="llama-8b", precision="auto", gpu="a100")
    assert spec.auto_precision.candidates == ("int8_sq", "int4_awq")


def test_the_support_matrix_removes_candidates_with_the_reason():
    # TensorRT-LLM 1.2.1's engine matrix: Mixtral has FP8, no W4A16 AWQ
    spec = resolve_spec(model="mixtral-8x7b", precision="auto", tp=2)
    assert spec.auto_precision.candidates == ("fp8",)
    (name, why), = spec.auto_precision.refused
    assert name == "int4_awq" and "MixtralForCausalLM has no int4_awq on the engine runtime" in why


def test_no_candidate_left_is_one_line_naming_each_reason():
    # the PyTorch runtime has no INT8-SQ linear, and Mixtral no INT4-AWQ: nothing left on an A100
    with pytest.raises(SpecError) as info:
        resolve_spec(model="mixtral-8x7b", precision="auto", gpu="a100", runtime="pytorch", tp=2)
    msg = str(info.value)
    assert msg.startswith("precision=auto: no candidate fits this spec: int8_sq: ") and "; int4_awq: " in msg


def test_auto_names_no_artifact_until_chosen_and_the_choice_does():
    spec = resolve_spec(model="tiny-llama", precision="auto", target="reference")
    with pytest.raises(SpecError, match="precision=auto names no artifact until `invoke build` has chosen one"):
        spec.identity()
    chosen = spec.with_precision("int4_awq")
    assert chosen.auto_precision is None and chosen.quantization.precision == "int4_awq"
    assert chosen.identity() == resolve_spec(model="tiny-llama", precision="int4_awq", target="reference").identity()
    assert "auto" not in chosen.summary()


def test_a_spec_file_may_say_auto(tmp_path):
    f = tmp_path / "spec.yaml"
    f.write_text("model: tiny-llama\ntarget: reference\nquantization: {precision: auto, calib_size: 8}\n")
    spec = resolve_spec(spec_file=f)
    assert spec.auto_precision.candidates == ("fp8", "int4_awq") and spec.quantization.calib_size == 8
    f.write_text("model: tiny-llama\nquantization: {precision: fp4}\n")
    with pytest.raises(SpecError, match="quantization.precision='fp4'"):
        resolve_spec(spec_file=f)


def test_other_commands_refuse_auto_with_one_line(capsys):
    import tasks

    with pytest.raises(SystemExit) as info:
        tasks.plan.body(None, model="tiny-llama", precision="auto")
    assert info.value.code == 2
    assert capsys.readouterr().err.strip() == ("error: precision=auto is chosen by `invoke build`; pass --precision "
                                               "fp8 or int4_awq to `invoke plan`")
    tasks.check.body(None, model="mixtral-8x7b", precision="auto", tp="2", skip_host_check=True)
    out, err = capsys.readouterr()
    assert "precision=auto(fp8)" in out and "precision auto: int4_awq is not a candidate: " in err
