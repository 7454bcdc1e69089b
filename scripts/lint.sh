#!/usr/bin/env bash
# The project's lint, as .ci/run runs it: ruff check (the rules in pyproject.toml) and ruff format --check
# over the whole tree. --fix applies ruff's fixes and formats instead.
set -euo pipefail
cd "$(dirname "$0")/.."
RUFF=${RUFF:-.venv/bin/ruff}
if [ "${1:-}" = "--fix" ]; then
    "$RUFF" check --fix .
    "$RUFF" format .
else
    "$RUFF" check .
    "$RUFF" format --check .
fi
