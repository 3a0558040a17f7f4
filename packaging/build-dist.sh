#!/usr/bin/env bash
# Build what the Ansible role installs, from this checkout, on the controller:
#   OUTDIR/ckptgw-VERSION.tar.gz                 the sdist (python -m build)
#   OUTDIR/ckptgw-VERSION-py3-none-any.whl       the wheel, built from that sdist
#   OUTDIR/ckptgw-VERSION-constraints.txt        NAME==VERSION of every dependency, with the
#                                                extras' (tryout), as pip resolves them now
# The role copies the wheel and the constraints file to each host and installs with `pip -c`,
# so every host runs the same, tested dependency versions, whenever it is (re)installed.
#
#   packaging/build-dist.sh [OUTDIR]      (default OUTDIR: <checkout>/dist)
#
# Needs the package index (or pip's configured mirror) for the build backend and the resolution.
# PYTHON names an interpreter that has `build` and pip >= 23 (default: a throwaway venv gets them).
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
out="$(mkdir -p "${1:-$here/dist}" && cd "${1:-$here/dist}" && pwd)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

python="${PYTHON:-}"
if [ -z "$python" ]; then
	python3 -m venv "$work/venv"
	"$work/venv/bin/python" -m pip install -q --upgrade pip build >&2
	python="$work/venv/bin/python"
fi

# Build from a copy: setuptools writes build/ and *.egg-info next to the sources it builds.
mkdir "$work/src"
git -C "$here" ls-files -z --cached --others --exclude-standard |
	(cd "$here" && xargs -0 cp --parents --no-dereference -t "$work/src" 2> /dev/null) ||
	cp -a "$here/." "$work/src"
"$python" -m build --outdir "$work/dist" "$work/src" >&2

wheel="$(ls "$work"/dist/ckptgw-*.whl)"
version="$(basename "$wheel" | cut -d- -f2)"
# Resolve (not install) the wheel with its extras; pip's report lists every distribution it would install.
"$python" -m pip install -q --dry-run --ignore-installed --report "$work/report.json" "$wheel[tryout]" >&2
"$python" - "$work/report.json" > "$work/dist/ckptgw-$version-constraints.txt" <<'PY'
import json, re, sys
report = json.load(open(sys.argv[1]))
pins = sorted((i["metadata"]["name"].lower(), i["metadata"]["version"]) for i in report["install"])
print("# ckptgw's dependencies, pinned by packaging/build-dist.sh; pip install -c this-file")
for name, version in pins:
    if name != "ckptgw":
        print(f"{re.sub(r'[-_.]+', '-', name)}=={version}")
PY
cp "$work"/dist/* "$out"/
ls "$out"/ckptgw-"$version"*
