#!/usr/bin/env bash
# Move constraints.txt to the newest versions the package's ranges allow, deliberately:
# resolve them in a scratch venv, run the whole suite there, and rewrite the pins only
# when it passes. .venv and constraints.txt are left alone otherwise.
#   usage: tools/upgrade-pins.sh PYTHON TORCH_SPEC [TORCH_PIP_ARGS...]
set -euo pipefail
cd "$(dirname "$0")/.."
python=${1:?usage: tools/upgrade-pins.sh PYTHON TORCH_SPEC [TORCH_PIP_ARGS...]}
torch_spec=${2:?usage: tools/upgrade-pins.sh PYTHON TORCH_SPEC [TORCH_PIP_ARGS...]}
shift 2
scratch=.venv-upgrade
rm -rf "$scratch"
trap 'rm -rf "$scratch"' EXIT
"$python" -m venv "$scratch"
"$scratch/bin/pip" install --quiet "$@" "$torch_spec"
"$scratch/bin/pip" install --quiet --upgrade -e '.[test]'   # no -c: the newest allowed
echo "resolved; running the suite against:"
"$scratch/bin/pip" freeze --exclude-editable | grep -i -E '^(lightning|accelerate|transformers|torchmetrics|pytest)=='
if ! "$scratch/bin/pytest" -q; then
    echo "the suite failed on the newest versions: constraints.txt unchanged" >&2
    exit 1
fi
{
    sed -n '/^#/p' constraints.txt
    "$scratch/bin/pip" freeze --exclude-editable | grep -v -E '^(torch==|#)'
} > constraints.txt.new
mv constraints.txt.new constraints.txt
echo "constraints.txt rewritten; run 'make install' to move .venv to it, and commit it"
