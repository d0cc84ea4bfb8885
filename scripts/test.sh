#!/usr/bin/env bash
# The full test suite on a fresh machine: sets up ./.venv from PyPI (MPI included), lints, runs
# the serial tests, then the MPI tests under 1, 2, 3 and 4 ranks. Each run has an outer timeout so a
# hung rank fails the suite instead of stalling it.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/venv.sh

# Shared-memory segments left by aborted MPI runs (MPICH keeps them in /dev/shm).
find /dev/shm -maxdepth 1 -user "$(id -u)" -name 'mpich_shm_*' -mmin +60 -delete 2>/dev/null || true

PYTEST=(python -m pytest --color=no -q -rs --timeout=300 --timeout-method=thread)

step() {
    local name=$1; shift
    echo "== $name"
    set +e
    "$@"
    local rc=$?
    set -e
    if [ $rc -eq 5 ]; then
        echo "FAILED: $name collected no tests (pytest exit 5)"; exit 1
    elif [ $rc -ne 0 ]; then
        echo "FAILED: $name (exit $rc)"; exit $rc
    fi
}

step "ruff" ruff check spdnn tests scripts $( [ -d partition ] && echo partition )
step "serial tests" timeout 1200 "${PYTEST[@]}" -m "not mpi" tests
for n in 1 2 3 4; do
    step "MPI tests, $n ranks" env MPIEXEC_TIMEOUT=900 timeout 960 \
        mpiexec -n "$n" "${PYTEST[@]}" --with-mpi -m mpi tests
done
echo "== all test runs passed"
