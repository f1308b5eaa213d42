"""The rules `invoke check` adds to the intrinsic ones: placement on the hardware and memory fit (planner), inputs."""

from __future__ import annotations

import pytest

from pipeline.core.errors import CalibrationError, SpecError
from pipeline.core.spec import resolve_spec
from pipeline.stages.check import resolve_checked_spec


def reject(match: str, **kw):
    resolve_spec(**kw)  # the intrinsic rules alone accept it: the fit rules refuse it
    with pytest.raises(SpecError, match=match) as info:
        resolve_checked_spec(**kw)
    assert "\n" not in str(info.value)  # one line
    return str(info.value)


def test_world_size_beyond_host_gpus():
    reject(r"tp×pp=16 exceeds hardware.gpu_count=8", model="llama-70b", tp=8, pp=2)


# --- limits bounded by what fits on the GPU (planner memory model) ---------------------------------------------

def _fits_number(msg: str) -> int:
    import re

    return int(re.search(r"at most (\d+) fits", msg).group(1))


def test_absurd_max_batch_rejected_with_the_batch_that_fits():
    msg = reject(r"limits.max_batch_size=65536: .* at most \d+ fits: lower --max-batch to <= \d+",
                 model="llama-70b", precision="fp8", tp=1, max_batch_size=65536)
    best = _fits_number(msg)
    assert resolve_checked_spec(model="llama-70b", precision="fp8", tp=1, max_batch_size=best).max_batch_size == best
    reject(r"limits.max_batch_size", model="llama-70b", precision="fp8", tp=1, max_batch_size=best + 1)


def test_max_num_tokens_that_does_not_fit_rejected():
    msg = reject(r"limits.max_num_tokens=400000: .* lower --max-num-tokens to <= \d+", model="llama-70b",
                 precision="fp8", tp=1, max_num_tokens=400000)
    best = _fits_number(msg)
    assert 8192 < best < 400000
    assert resolve_checked_spec(model="llama-70b", precision="fp8", tp=1,
                                max_num_tokens=best).limits.max_num_tokens == best


def test_max_seq_len_whose_kv_does_not_fit_rejected():
    # 70B FP8 on one H100: ~9 GiB left after weights; one 131072-token sequence needs 20 GiB of FP8 KV
    msg = reject(r"limits.max_seq_len=131072: .* one 131072-token sequence's KV .* lower --max-seq-len",
                 model="llama-70b", precision="fp8", tp=1, max_seq_len=131072)
    best = _fits_number(msg)
    assert 8192 < best < 131072
    assert resolve_checked_spec(model="llama-70b", precision="fp8", tp=1, max_seq_len=best).max_seq_len == best
    assert resolve_checked_spec(model="llama-70b", precision="fp8", tp=2, max_seq_len=131072).max_seq_len == 131072


def test_draft_batch_on_a_small_gpu_rejected():
    # the 3B draft's activations and fp32 logits at batch 65536 (65536 x 128256 x 4 B = 31 GiB alone) do not fit a
    # 44.5 GiB L40S beside the 8B BF16 target
    msg = reject(r"speculation.draft_max_batch_size=65536: .* lower --draft-max-batch", model="llama-8b",
                 precision="bf16", gpu="l40s", draft="llama-3b", max_batch_size=4, draft_max_batch_size=65536)
    assert resolve_checked_spec(model="llama-8b", precision="bf16", gpu="l40s", draft="llama-3b", max_batch_size=4,
                        draft_max_batch_size=_fits_number(msg)).draft_max_batch_size == _fits_number(msg)


def test_limits_that_only_fit_together_name_all_of_them():
    # neither batch 1 at 131072 tokens nor 8192 tokens at batch 65536 fits one H100 beside 70B FP8 weights
    msg = reject(r"max_batch_size=65536, max_num_tokens=8192 and max_seq_len=131072 together need",
                 model="llama-70b", precision="fp8", tp=1, max_batch_size=65536, max_seq_len=131072)
    assert "raise --tp" in msg


def test_weights_that_do_not_fit_warn_and_leave_min_tp_to_plan():
    spec = resolve_checked_spec(model="llama-70b", precision="bf16", tp=1)
    assert any("does not fit one h100-sxm" in w and "raise --tp" in w for w in spec.warnings)
    placed = resolve_checked_spec(model="llama-70b", precision="bf16")  # no --tp: placed where it fits
    assert placed.parallelism.tp >= 2 and not [w for w in placed.warnings if "fit" in w]
    assert not [w for w in resolve_checked_spec(model="llama-70b", precision="bf16", tp=2).warnings if "fit" in w]




def test_calibration_file_that_does_not_parse_refused_by_check(tmp_path):
    bad = tmp_path / "calib.jsonl"
    bad.write_text("{not json\n")
    resolve_spec(model="tiny-llama", precision="fp8", calib_data=str(bad))  # the spec alone reads no file
    with pytest.raises(CalibrationError, match="not valid JSON"):
        resolve_checked_spec(model="tiny-llama", precision="fp8", calib_data=str(bad))
