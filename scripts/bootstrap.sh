#!/usr/bin/env bash
# Create (or refresh) the project's virtualenv at .venv with ckptgw (editable) and its extras:
#   bootstrap.sh            ckptgw alone, as a production install has it
#   bootstrap.sh --tryout   plus the embedded in-memory S3 of try-out mode (moto; scripts/run)
#   bootstrap.sh --test     plus the test tools (they include moto)
# Idempotent and quiet: a second run only checks that the install is current. Prints the venv's path.
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
venv="${CKPTGW_VENV:-$here/.venv}"
case "${1:-}" in
"") extras="" ;;
--test) extras="[test]" ;;
--tryout) extras="[tryout]" ;;
*)
	echo "bootstrap.sh: unknown argument $1 (use --test, --tryout or nothing)" >&2
	exit 2
	;;
esac

if [ ! -x "$venv/bin/python" ]; then
	python3 -m venv "$venv"
fi
stamp="$venv/.ckptgw-installed$extras"
# Reinstall only when pyproject.toml changed since the last install.
if [ ! -f "$stamp" ] || [ "$here/pyproject.toml" -nt "$stamp" ]; then
	"$venv/bin/python" -m pip install -q --upgrade pip > /dev/null
	"$venv/bin/python" -m pip install -q -e "$here$extras" >&2
	touch "$stamp"
fi
echo "$venv"
