"""format_bytes: the one way orch writes a size."""

from __future__ import annotations

import pytest

from orchestrator.specs.units import format_bytes


@pytest.mark.parametrize(
    ("count", "shown"),
    [
        (0, "0 B"),
        (1, "1 B"),
        (1023, "1023 B"),
        (1024, "1.0 KiB"),
        (1536, "1.5 KiB"),
        (40_000, "39.1 KiB"),
        (1024 * 1024 - 1, "1.0 MiB"),  # 1023.999 KiB rounds to 1024.0: the next unit
        (3 << 20, "3.0 MiB"),
        (int(949.1 * 2**20), "949.1 MiB"),
        (11 << 30, "11.0 GiB"),
        (2 << 40, "2.0 TiB"),
        (5 << 60, "5120.0 PiB"),  # past the last unit the number grows
        (2.5 * 2**30, "2.5 GiB"),
        (-2048, "-2.0 KiB"),
    ],
)
def test_a_size_is_written_in_the_largest_unit_that_keeps_it_at_one_or_more(
    count: float, shown: str
) -> None:
    assert format_bytes(count) == shown
