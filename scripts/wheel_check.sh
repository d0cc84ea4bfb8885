#!/usr/bin/env bash
# The product as a user installs it: builds the wheel, installs it into a fresh virtual
# environment (dependencies from PyPI), and runs the main job from an empty directory with no
# checkout beside it (the embedded digits come from the wheel's package data).
#
#   bash scripts/wheel_check.sh              # both steps, in a temporary directory
#   bash scripts/wheel_check.sh build DIR    # only build and install, into DIR (kept)
#   bash scripts/wheel_check.sh run DIR      # only the main job, from DIR's install (removed)
#
# (scripts/test.sh builds while the 1-rank MPI tests leave a core free, and runs at the end.)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
MODE="${1:-all}"
case "$MODE" in
    all) WORK="$(mktemp -d "${TMPDIR:-/tmp}/spdnn-wheel.XXXXXX")" ;;
    build|run) WORK="${2:?wheel_check.sh $MODE: give the directory}" ;;
    *) echo "wheel_check.sh: unknown step '$MODE' (all, build DIR or run DIR)" >&2; exit 2 ;;
esac
[ "$MODE" = build ] || trap 'rm -rf "$WORK"' EXIT
if [ "$MODE" != run ]; then
    python3 -m pip wheel --quiet --disable-pip-version-check --no-deps -w "$WORK/dist" "$ROOT"
    # The environment without a pip of its own (ensurepip: 6 s); uv (scripts/venv.sh installs it:
    # the same packages in a third of pip's time) or else this pip installs into it.
    python3 -m venv --without-pip "$WORK/venv"
    if command -v uv >/dev/null; then
        uv pip install --quiet --compile-bytecode --python "$WORK/venv/bin/python" "$WORK"/dist/*.whl
    else
        python3 -m pip --python "$WORK/venv/bin/python" install --quiet \
            --disable-pip-version-check "$WORK"/dist/*.whl
    fi
fi
[ "$MODE" = build ] && exit 0
# The main job's two scripts, alone in an empty directory: venv.sh finds the environment made
# (the stamp) and no pyproject.toml to install from, so nothing comes from the checkout.
mkdir -p "$WORK/job/scripts"
cp "$ROOT/scripts/main.sh" "$ROOT/scripts/venv.sh" "$WORK/job/scripts/"
touch "$WORK/venv/.spdnn-installed"
cd "$WORK/job"
env -u PYTHONPATH SPDNN_VENV="$WORK/venv" SPDNN_OUT="$WORK/job/out" bash scripts/main.sh \
    | tee "$WORK/main.log"
# What the main job promises to print: both plans side by side, the hypergraph plan's saving,
# and the counted traffic equal to each plan's prediction.
summary="$(sed -n '/^== 5\./,$p' "$WORK/main.log")"
for expected in "hypergraph " "block " "fewer rows" "counted traffic equals each plan"; do
    grep -qF -- "$expected" <<<"$summary" || { echo "main job: '$expected' missing"; exit 1; }
done
# As root (CI), the emulated network is permitted: the epochs over 100 Mbit/s must be there.
if [ "$(id -u)" = 0 ]; then
    grep -qF "hypergraph plan's epoch is" <<<"$summary" \
        || { echo "main job: the times over the emulated link are missing"; exit 1; }
fi
"$WORK/venv/bin/python" -c "import spdnn, sys; assert '$ROOT' not in spdnn.__file__, spdnn.__file__; print('wheel:', spdnn.__file__)"
