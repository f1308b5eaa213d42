"""Quality gate (quantized vs unquantized on held-out text) and the export round-trip check."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import TYPE_CHECKING

from pipeline.core.errors import CalibrationError, QualityGateFailed
from pipeline.core.manifests import QualityRecord, RoundtripCheck

if TYPE_CHECKING:  # pragma: no cover
    import torch

# Round-trip tolerances. ModelOpt's exporter quantizes by dividing by the scale while its fake quantizer multiplies
# by the inverse, so a few elements land on the neighbouring FP8/INT4 code: FP8 exports calibrated on CPU reproduce
# the fake-quant logits bit for bit (the exported reference computes with the checkpoint's scales, `export.snap_*`),
# GPU-calibrated ones (bf16 weights, CUDA kernels) and INT8-SQ exports to ~1e-6..3e-3 (relative to max |logit|),
# INT4/W4A8-AWQ ones somewhat less (compare those by perplexity and top-1 agreement). A corrupted scale or a sharding
# bug breaks these bounds by far.
ROUNDTRIP_TOL = {
    "exact": {"max_rel_logit_err": 1e-2, "min_top1": 0.98, "max_ppl_rel_diff_pct": 0.1},
    "awq": {"max_rel_logit_err": 5e-2, "min_top1": 0.98, "max_ppl_rel_diff_pct": 0.5},
    # ModelOpt's HF export quantizes weights as w / (amax/448) where the fake quantizer uses w * (448/amax): ties
    # round apart by one FP8/INT4 step now and then, which on a tiny model moves perplexity by ~0.1 %.
    "hf_export": {"max_rel_logit_err": 5e-2, "min_top1": 0.98, "max_ppl_rel_diff_pct": 0.5},
}


EVAL_BATCH = 8


def _batches(samples: list[list[int]], device) -> Iterable[torch.Tensor]:
    """Equal-length samples stacked into batches of up to EVAL_BATCH (a shorter sample goes alone)."""
    import torch

    i = 0
    while i < len(samples):
        j = i + 1
        while j < len(samples) and j - i < EVAL_BATCH and len(samples[j]) == len(samples[i]):
            j += 1
        yield torch.tensor(samples[i:j], dtype=torch.long, device=device)
        i = j


def reference_logprobs(model, samples: list[list[int]], device) -> list[torch.Tensor]:
    """Next-token log-probabilities of the unquantized model (float32, CPU), one tensor per sample."""
    import torch

    out: list[torch.Tensor] = []
    with torch.no_grad():
        for ids in _batches(samples, device):
            out.extend(torch.log_softmax(model(ids).logits[:, :-1].float(), -1).cpu().unbind(0))
    return out


def compare(model, samples: list[list[int]], ref: list[torch.Tensor], device, *, threshold_pct: float,
            enforced: bool, heldout_fingerprint: str) -> QualityRecord:
    """Perplexity of both models, relative delta (%), mean KL(base || quant) and top-1 agreement: the manifest's
    quality record (`enforced`: whether `gate` raises on a failure; the held-out set's fingerprint)."""
    import torch

    nll_b = nll_q = kl = agree = 0.0
    n = 0
    with torch.no_grad():
        refs = iter(ref)
        for ids in _batches(samples, device):
            lps = torch.log_softmax(model(ids).logits[:, :-1].float(), -1).cpu()
            for row, lp_q in zip(ids.cpu(), lps):
                lp_b, tgt = next(refs), row[1:]
                nll_b -= lp_b.gather(-1, tgt[:, None]).sum().item()
                nll_q -= lp_q.gather(-1, tgt[:, None]).sum().item()
                kl += (lp_b.exp() * (lp_b - lp_q)).sum().item()
                agree += (lp_b.argmax(-1) == lp_q.argmax(-1)).sum().item()
                n += tgt.numel()
    if n == 0:
        raise CalibrationError("held-out evaluation has no tokens; the bundled corpus' held-out split is empty")
    ppl_b, ppl_q = math.exp(nll_b / n), math.exp(nll_q / n)
    delta = (ppl_q - ppl_b) / ppl_b * 100.0
    ok = math.isfinite(delta) and delta <= threshold_pct
    return QualityRecord(ppl_base=ppl_b, ppl_quant=ppl_q, ppl_delta_pct=delta, kl_mean=kl / n,
                         top1_agreement=agree / n, tokens=n, threshold_pct=threshold_pct, passed=ok,
                         enforced=enforced, heldout_fingerprint=heldout_fingerprint)


def gate(report: QualityRecord, *, what: str) -> None:
    """Raise when the gate trips and is enforced (the numbers are in the manifest either way)."""
    if report.passed or not report.enforced:
        return
    raise QualityGateFailed(
        f"quality gate failed for {what}: held-out perplexity {report.ppl_base:.4f} -> {report.ppl_quant:.4f} "
        f"({report.ppl_delta_pct:+.3f} % > {report.threshold_pct:g} %); choose a higher precision, more/better "
        "calibration data, raise --max-ppl-delta, or pass --no-quality-gate",
        expected=report.threshold_pct, actual=report.ppl_delta_pct,
    )


def roundtrip(loaded, reference, samples: list[list[int]], device, *, awq: bool = False,
              tier: str | None = None) -> RoundtripCheck:
    """Compare the re-loaded checkpoint's logits with the (exported) fake-quant model's on held-out tokens, within
    the tolerance `tier` of ROUNDTRIP_TOL (default: "awq" or "exact")."""
    import torch

    tol = ROUNDTRIP_TOL[tier or ("awq" if awq else "exact")]
    max_err = max_ref = nll_a = nll_b = 0.0
    agree = n = 0
    with torch.no_grad():
        for ids in _batches(samples, device):
            a = reference(ids).logits.float().cpu()
            b = loaded(ids.cpu()).logits.float()
            max_err = max(max_err, (a - b).abs().max().item())
            max_ref = max(max_ref, a.abs().max().item())
            agree += (a.argmax(-1) == b.argmax(-1)).sum().item()
            n += a.shape[0] * a.shape[1]
            tgt = ids[:, 1:].cpu()[..., None]
            nll_a -= torch.log_softmax(a[:, :-1], -1).gather(-1, tgt).sum().item()
            nll_b -= torch.log_softmax(b[:, :-1], -1).gather(-1, tgt).sum().item()
    rel = max_err / max(max_ref, 1e-12)
    top1 = agree / max(n, 1)
    ppl_diff = abs(math.exp((nll_b - nll_a) / max(n - len(samples), 1)) - 1) * 100
    ok = (
        math.isfinite(rel)
        and rel <= tol["max_rel_logit_err"]
        and top1 >= tol["min_top1"]
        and ppl_diff <= tol["max_ppl_rel_diff_pct"]
    )
    return RoundtripCheck(max_rel_logit_err=rel, top1_agreement=top1, ppl_rel_diff_pct=ppl_diff, tokens=n,
                          passed=ok, tolerance=tol)
