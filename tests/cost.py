"""How tests check that work on hostile input stays linear, without a stopwatch.

A wall-clock bound ("under 10 s") failed in CI on a loaded 2-core host: a 1 MB redaction read 13 s of wall time
and a 500 kB PromQL name 62 s while the real-stack half ran beside it, though neither is slow. So these checks
compare the same input at two sizes, in CPU time this thread spent (time spent waiting for a core does not
count): with 8 times the input, linear work takes about 8 times as long, quadratic work 64 times, and
backtracking far more. The host's speed cancels out of the ratio.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable
from typing import TypeVar

In = TypeVar("In")
Out = TypeVar("Out")

GROWTH = 8
# Linear work grows 8 times; 24 leaves three times that for caches and allocation, a third of quadratic's 64.
MOST_RATIO = 24.0
# Below this the small run is timer and allocator noise, not the work: the ratio is taken against it instead.
FLOOR_S = 0.002


def cpu_seconds(work: Callable[[In], Out], given: In) -> tuple[float, Out]:
    """CPU seconds this thread spent on work(given), with the garbage collector paused, and what it returned."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        started = time.thread_time()
        out = work(given)
        return time.thread_time() - started, out
    finally:
        if enabled:
            gc.enable()


def assert_linear(work: Callable[[In], Out], make: Callable[[int], In], size: int) -> Out:
    """Assert that work(make(size)) costs at most MOST_RATIO times work(make(size // GROWTH)); return its result.

    The small size runs three times and the best counts; a large run over the bound is run once more, since
    noise only ever adds time.
    """
    small_input = make(max(1, size // GROWTH))
    small = min(cpu_seconds(work, small_input)[0] for _ in range(3))
    large_input = make(size)
    large, out = cpu_seconds(work, large_input)
    bound = MOST_RATIO * max(small, FLOOR_S)
    if large > bound:
        large = min(large, cpu_seconds(work, large_input)[0])
    assert large <= bound, (
        f"{GROWTH} times the input cost {large / max(small, FLOOR_S):.0f} times the CPU time "
        f"({small:.4f} s -> {large:.4f} s), more than {MOST_RATIO:.0f}: the work is not linear in its input"
    )
    return out


def assert_bounded(work: Callable[[In], Out], given: In, most_cpu_s: float) -> Out:
    """Assert that work(given) spends at most most_cpu_s of this thread's CPU time; return its result.

    For work whose cost must not depend on the input's size at all (a bounded head, a memo): the bound is a
    generous multiple of the bounded cost, and CPU time does not count waiting for a core.
    """
    spent, out = cpu_seconds(work, given)
    if spent > most_cpu_s:
        spent = min(spent, cpu_seconds(work, given)[0])
    assert spent <= most_cpu_s, f"the work took {spent:.3f} s of CPU time, more than {most_cpu_s} s"
    return out


def shrunk(text: str, ends: int = 16) -> Callable[[int], str]:
    """make(n) for assert_linear(work, make, GROWTH): text with its middle cut to n / GROWTH of its length.

    Its first and last `ends` characters stay, so a hostile line keeps the head and tail its shape depends on
    ("The node" + 60,000 spaces + "has been marked") at every size.
    """
    head, middle, tail = text[:ends], text[ends:-ends], text[-ends:]
    return lambda n: head + middle[: len(middle) * n // GROWTH] + tail
