#!/usr/bin/env bash
# The GPU check on a fresh GPU machine, in one command (bench/README.md, "GPU check"):
#   scripts/gpu-check.sh OUT_DIR [more `python -m bench gpu` options, e.g. --dry-run]
# A virtualenv over the machine's python3 that keeps its CUDA torch (--system-site-packages),
# the project with its test and bench extras, then `python -m bench gpu --out OUT_DIR`.
# Offline: put wheels in .whl/ (or WHEELS=dir) and pip installs from there alone; if they do not
# cover every dependency, the project is installed without them and the check still runs: a step
# whose imports are missing fails alone and says so in the report.
set -euo pipefail
out=${1:?usage: scripts/gpu-check.sh OUT_DIR [python -m bench gpu options]}
shift
out=$(mkdir -p "$out" && cd "$out" && pwd)
cd "$(dirname "$0")/.."
venv=${GPU_CHECK_VENV:-build/venv-gpu}
wheels=${WHEELS:-.whl}
python3 -m venv --system-site-packages "$venv"
. "$venv/bin/activate"
if [ -d "$wheels" ]; then
  offline=(--no-index --find-links "$wheels" --no-build-isolation)
  if ! python -m pip install -q "${offline[@]}" -e ".[test,bench]"; then
    echo "gpu-check: the wheels in $wheels do not cover every dependency; installing what is there" >&2
    python -m pip install -q "${offline[@]}" --no-deps "$wheels"/*.whl || true
    python -m pip install -q "${offline[@]}" --no-deps -e .
  fi
else
  python -m pip install -q -e ".[test,bench]"
fi
export RAY_AUTH_MODE=disabled PYTHONUNBUFFERED=1
exec python -m bench gpu --out "$out" "$@"
