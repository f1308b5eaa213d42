"""Which precisions of a model have a quality verdict on disk: the `precision: auto` records
(`engines/*/precision_search.json`) and the target checkpoints' quality gates (`engines/*/<checkpoint>/manifest.json`,
either runtime's export). `plan --slo` prefers the precisions checked here (`slo_search.search(quality=...)`).
"""

from __future__ import annotations

from typing import get_args

from pipeline.core.runtimes import checkpoint_format
from pipeline.core.artifacts import engines_dir
from pipeline.core.errors import IntegrityError
from pipeline.core.manifests import CheckpointManifest, PrecisionSearch
from pipeline.core.spec import Runtime


def quality_verdicts(model: str) -> dict[str, bool]:
    """precision -> whether a quality gate of `model` passed it under engines/ (one passing record wins over failing
    ones); a precision with no record is absent. Unreadable records are skipped (the build that owns them reports
    them)."""
    verdicts: dict[str, bool] = {}

    def note(precision: str, passed: bool) -> None:
        verdicts[precision] = verdicts.get(precision, False) or passed

    root = engines_dir()
    for path in root.glob("*/precision_search.json"):
        try:
            record = PrecisionSearch.read(path)
        except IntegrityError:
            continue
        if record is not None and record.model == model:
            for c in record.candidates:
                note(c.precision, c.passed)
    for runtime in get_args(Runtime):
        for directory in root.glob(f"*/{checkpoint_format(runtime).dirname}"):
            m = CheckpointManifest.read(directory, strict=False)
            if m is not None and m.role == "target" and m.model.name == model:
                note(m.recipe.precision, m.quality.passed)
    return verdicts
