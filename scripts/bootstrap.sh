#!/usr/bin/env bash
# Create (or refresh) the project's virtualenv at .venv with ckptgw and, with --test, the test tools.
# Idempotent and quiet: a second run only checks that the install is current.
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
venv="${CKPTGW_VENV:-$here/.venv}"
extras=""
[ "${1:-}" = "--test" ] && extras="[test]"

if [ ! -x "$venv/bin/python" ]; then
    python3 -m venv "$venv"
fi
stamp="$venv/.ckptgw-installed$extras"
# Reinstall only when pyproject.toml changed since the last install.
if [ ! -f "$stamp" ] || [ "$here/pyproject.toml" -nt "$stamp" ]; then
    "$venv/bin/python" -m pip install -q --upgrade pip >/dev/null
    "$venv/bin/python" -m pip install -q -e "$here$extras"
    touch "$stamp"
fi
echo "$venv"
