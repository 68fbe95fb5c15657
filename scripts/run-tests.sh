#!/usr/bin/env bash
# `make test`'s pytest: the tests that start a real stack (Ray, Prometheus, sshd, PostgreSQL, the LLM, chromium) in
# one pytest process, the rest in a second one beside it. The real-stack tests spend most of their time waiting on
# the stack (a job's steps, Ray declaring a node dead, a scrape), so the unit tests fit into that wait: on a
# 2-core machine the whole run ends minutes sooner. The real-stack tests keep one process, hence one Ray cluster,
# one Prometheus and one LLM server per run, as they share them (tests/conftest.py).
#
# (pytest-xdist's --dist loadgroup would do this from one process, but with pytest 9 it no longer groups: it sets a
# node id attribute pytest 9 does not read, so both workers would start a stack.)
#
# Usage: REAL_STACK='ray or ...' scripts/run-tests.sh [pytest args...]   (PY: the interpreter, default
# .venv/bin/python); `make test` sets both.
# The real-stack run prints as it goes; the other run's output follows it. Exit status: the first failure's, or 0.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
# The markers of the real-stack tests: the Makefile's REAL_STACK, which `make test` passes.
REAL_STACK=${REAL_STACK:?set REAL_STACK to the markers of the real-stack tests, as make test does}
base=${TMPDIR:-/tmp}/argus-pytest-$$
mkdir -p "$base"
unit_log="$base/unit.log"

# No tests selected (exit 5) on one side is fine when PYTEST_ARGS picks a subset.
ok() { [ "$1" -eq 0 ] || [ "$1" -eq 5 ]; }

# niced: the real-stack tests wait on processes that must answer in time (a raylet registering, a health check, a
# job's steps); the unit tests only need the CPU that is left. 19, not less: Ray runs its workers (the test jobs'
# ranks) at niceness 15, and unit tests at 10 took the CPU from them (the real-stack half ran twice as long).
nice -n 19 "$PY" -m pytest -m "not ($REAL_STACK)" --basetemp="$base/unit" -p no:cacheprovider --durations=25 "$@" >"$unit_log" 2>&1 &
unit_pid=$!
trap 'kill "$unit_pid" 2>/dev/null' INT TERM

echo "== the tests that start a real stack (the others run beside them; their output follows) =="
"$PY" -m pytest -m "$REAL_STACK" --basetemp="$base/stack" --durations=40 "$@"
stack_rc=$?
wait "$unit_pid"
unit_rc=$?

echo
echo "== the tests without a real stack =="
cat "$unit_log"
echo
echo "real-stack tests: exit $stack_rc; the others: exit $unit_rc"
rm -rf "$base"
if ! ok "$stack_rc"; then exit "$stack_rc"; fi
if ! ok "$unit_rc"; then exit "$unit_rc"; fi
exit 0
