# Sourced by the study scripts (studies/*/run.sh, finish.sh): the commands they run, found the way README sets them
# up. `ddl`: $DDL when set, else this repository's .venv/bin/ddl (what scripts/setup.sh makes), else `ddl` on PATH
# (an activated venv, `pip install .`); `py`, for benchmarks/tools/: $PYTHON, else .venv/bin/python, else python3.
# Where none is found, one line on stderr and exit 2 (not a `command not found` deep inside a log).
_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
_script=$(basename "$0")
if [ -n "${DDL:-}" ]; then
  ddl=$DDL
elif [ -x "$_root/.venv/bin/ddl" ]; then
  ddl=$_root/.venv/bin/ddl
else
  ddl=ddl
fi
if ! command -v "$ddl" > /dev/null 2>&1; then
  echo "$_script: no ddl command (DDL=${DDL:-unset}, no $_root/.venv/bin/ddl, none on PATH): run \`bash scripts/setup.sh\`, activate a venv that has it, or set DDL" >&2
  exit 2
fi
if [ -n "${PYTHON:-}" ]; then
  py=$PYTHON
elif [ -x "$_root/.venv/bin/python" ]; then
  py=$_root/.venv/bin/python
else
  py=python3
fi
