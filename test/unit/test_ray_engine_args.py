"""RayEngine's own arguments are checked before Ray starts or any actor is placed."""

from __future__ import annotations

import pytest

from sglang.srt.entrypoints.ray_engine import RayEngine


@pytest.mark.parametrize("group", ["pg-1", {"CPU": 1}, [{"CPU": 1}]])
def test_a_placement_group_that_is_not_a_group_is_a_type_error_naming_it(group):
    with pytest.raises(TypeError, match="placement_group must be a .*PlacementGroup"):
        RayEngine(model_path="unused", placement_group=group)
