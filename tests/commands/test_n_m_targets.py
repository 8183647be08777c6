"""An N:M pattern fixes the sparsity at 1 - N/M: ``prune`` and ``train`` accept that value and
refuse N/M, over patterns where the two differ (1:4, 2:8; with 2:4 they are both 0.5)."""

from __future__ import annotations

import pytest

from convergent.commands.config import TrainConfig
from convergent.commands.prune import resolve_targets
from convergent.sparse import MaskSpec

# (pattern, 1 - N/M, N/M)
PATTERNS = [("1:4", 0.75, 0.25), ("2:8", 0.75, 0.25), ("3:4", 0.25, 0.75), ("2:4", 0.5, 0.5)]


@pytest.mark.parametrize(("pattern", "implied", "kept"), PATTERNS)
def test_prune_takes_one_minus_n_over_m_and_refuses_n_over_m(pattern, implied, kept):
    spec = MaskSpec(pattern=pattern)
    assert resolve_targets(None, spec) == (implied,)
    assert resolve_targets((implied,), spec) == (implied,)
    if kept != implied:
        with pytest.raises(ValueError, match=rf"1 - N/M = {implied:g} .* got {kept:g}"):
            resolve_targets((kept,), spec)


@pytest.mark.parametrize(("pattern", "implied", "kept"), PATTERNS)
def test_train_takes_one_minus_n_over_m_and_refuses_n_over_m(pattern, implied, kept):
    spec = MaskSpec(pattern=pattern)
    assert TrainConfig(sparsity=implied, mask_spec=spec).sparsity == implied
    if kept != implied:
        with pytest.raises(ValueError, match=rf"1 - N/M = {implied:g} .* got {kept:g}"):
            TrainConfig(sparsity=kept, mask_spec=spec)
