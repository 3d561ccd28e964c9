#!/usr/bin/env bash
# The test suite on a loaded machine: two busy-loop processes (each keeps one core busy) run beside `make test`,
# the suite command of README.md, for as long as it runs. A test that bets on the machine's speed (a fixed sleep,
# a wall-clock bound) shows up here. Arguments go to pytest (through PYTEST_ADDOPTS), e.g.
#
#     scripts/test_under_load.sh                       # the whole suite
#     scripts/test_under_load.sh tests/sandbox/test_pool.py -x
#
# The loops are killed however the script ends; it exits with the status of `make test` (0 when the suite passes;
# make reports any failure of it as 2).
set -u
cd "$(dirname "$0")/.."

loops=()
stop_loops() {
    if ((${#loops[@]})); then
        kill "${loops[@]}" 2>/dev/null
        wait "${loops[@]}" 2>/dev/null
    fi
    return 0
}
trap stop_loops EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

for _ in 1 2; do
    python3 -c 'while True: pass' &
    loops+=($!)
done
echo "test_under_load: busy loops ${loops[*]} running beside the suite" >&2

extra=""
if (($#)); then
    extra=$(printf '%q ' "$@")
fi
PYTEST_ADDOPTS="${PYTEST_ADDOPTS:-} $extra" make --no-print-directory test
status=$?
echo "test_under_load: the suite exited with status $status" >&2
exit "$status"
