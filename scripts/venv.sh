# Sourced by scripts/main.sh and scripts/test.sh: create or reuse ./.venv with spdnn installed.
# Everything comes from PyPI, the MPI implementation included (the mpich wheel).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${SPDNN_VENV:-$ROOT/.venv}"
if [ ! -x "$VENV/bin/python" ]; then
    echo "[setup] creating virtual environment $VENV"
    python3 -m venv "$VENV"
fi
stamp="$VENV/.spdnn-installed"
if [ ! -f "$stamp" ] || [ "$ROOT/pyproject.toml" -nt "$stamp" ]; then
    echo "[setup] installing spdnn and its dependencies (numpy, scipy, mpi4py, mpich, kahypar, pytest, sphinx...)"
    # Through uv where it can be had (from PyPI): the same packages as pip's resolver picks,
    # installed and byte-compiled in a third of pip's time; CI makes it on every run. Byte-
    # compiled: uv's default is not to, and where PYTHONDONTWRITEBYTECODE is set every process
    # then compiled numpy, scipy and numba again (the serial tests took nearly twice as long).
    if "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check uv >/dev/null 2>&1
    then
        "$VENV/bin/uv" pip install --quiet --compile-bytecode --python "$VENV/bin/python" \
            -e "$ROOT[test,docs]"
    else
        "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check -e "$ROOT[test,docs]"
    fi
    touch "$stamp"
fi
export PATH="$VENV/bin:$PATH"
# One thread per rank: set before numpy loads in any child process.
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}" OPENBLAS_NUM_THREADS="${OPENBLAS_NUM_THREADS:-1}" \
       MKL_NUM_THREADS="${MKL_NUM_THREADS:-1}"
# Byte-compile the checkout once (a no-op for files unchanged since): where
# PYTHONDONTWRITEBYTECODE is set, as on this CI machine, every new process (each rank of each
# job) compiled spdnn's sources again, a third more to start a job that ends on a bad file.
"$VENV/bin/python" -m compileall -q -j 0 "$ROOT/spdnn" "$ROOT/partition" >/dev/null
