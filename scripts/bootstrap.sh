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
# Reinstall when the package's build inputs changed since the last install: pyproject.toml, and
# what setup.py compiles (the native engine's .pyx/.pxd, the .x text its codecs are generated from).
stale() {
	[ ! -f "$stamp" ] && return 0
	[ -n "$(find "$here/pyproject.toml" "$here/setup.py" "$here/nfsd/native" "$here/nfsd/xdr" \
		\( -name '*.toml' -o -name '*.py' -o -name '*.pyx' -o -name '*.pxd' -o -name '*.x' \) \
		-newer "$stamp" -print -quit 2> /dev/null)" ]
}
if stale; then
	"$venv/bin/python" -m pip install -q --upgrade pip > /dev/null
	"$venv/bin/python" -m pip install -q -e "$here$extras" >&2
	touch "$stamp"
fi
echo "$venv"
