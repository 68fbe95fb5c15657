"""The linear-time check itself: it passes linear work and fails quadratic work, whatever the host's speed."""

from __future__ import annotations

import re

import pytest

from tests.cost import assert_bounded, assert_linear, shrunk


def a_run(n: int) -> str:
    return "a" * n + "b"


def test_linear_work_passes() -> None:
    assert assert_linear(lambda text: text.count("b"), lambda n: "ab" * n, 400_000) == 400_000


def test_quadratic_work_fails() -> None:
    # re.search retries a+x from every start of the run: n**2 steps
    with pytest.raises(AssertionError, match="not linear"):
        assert_linear(re.compile(r"a+x").search, a_run, 16_000)


def test_bounded_work_over_its_bound_fails() -> None:
    assert assert_bounded(len, "x" * 1000, most_cpu_s=0.5) == 1000
    with pytest.raises(AssertionError, match="more than"):
        assert_bounded(re.compile(r"a+x").search, a_run(16_000), most_cpu_s=0.001)


def test_shrunk_keeps_both_ends_and_scales_the_middle() -> None:
    make = shrunk("The node " + " " * 800 + "has marked", ends=9)
    assert make(8) == "The node " + " " * 800 + "has marked"
    assert make(1) == "The node " + " " * 100 + "as marked"  # an eighth of the 801 characters between the ends
