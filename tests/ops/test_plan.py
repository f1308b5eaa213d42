"""`plan --slo --write-spec` (pipeline.ops.plan): what it refuses before writing."""

from __future__ import annotations

import pytest

from pipeline.core.errors import SpecError
from pipeline.core.spec import resolve_spec
from pipeline.ops.plan import write_pick
from pipeline.planning.slo_search import Slo, SloSearch, Traffic


def test_a_search_without_a_pick_writes_no_spec(tmp_path):
    spec = resolve_spec(model="llama-8b", precision="fp8")
    result = SloSearch(model="llama-8b", gpu=spec.hardware.gpu, gpu_price_per_hour=1.0, gpu_price_source="test",
                       slo=Slo(1.0, 1.0), traffic=Traffic(1024, 256), searched=3, pick=None, front=[])
    dest = tmp_path / "pick.yaml"
    with pytest.raises(SpecError, match="the search picked no configuration") as exc:
        write_pick(spec, result, str(dest))
    assert exc.value.exit_code == 2
    assert list(tmp_path.iterdir()) == []
