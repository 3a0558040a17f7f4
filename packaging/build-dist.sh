#!/usr/bin/env bash
# Build what the Ansible role installs, from this checkout, on the controller:
#   OUTDIR/ckptgw-VERSION.tar.gz                 the sdist (python -m build): the sources, with the
#                                                .pyx and setup.py's generators, not what they generate
#   OUTDIR/ckptgw-VERSION-cp311-cp311-linux_x86_64.whl
#                                                the wheel, compiled from that sdist (Cython; setup.py):
#                                                a platform wheel for the Python that builds it
#   OUTDIR/ckptgw-VERSION-constraints.txt        NAME==VERSION of every dependency, with the
#                                                extras' (tryout), as pip resolves them now
# The role copies the wheel and the constraints file to each host and installs with `pip -c`,
# so every host runs the same, tested dependency versions, whenever it is (re)installed.
#
#   packaging/build-dist.sh [OUTDIR]      (default OUTDIR: <checkout>/dist)
#
# Needs the package index (or pip's configured mirror) for the build backend and the resolution.
# PYTHON names an interpreter that has `build` and pip >= 23 (default: a throwaway venv gets them).
# ckptgw has compiled extensions (nfsd/native), so the wheel installs only on that Python's version
# and platform, with a glibc no older than the build machine's: for Debian 12 hosts (python3 is
# 3.11) build with a CPython 3.11 on x86-64 Linux with glibc <= 2.36 (Debian 12 itself does).
# The build environment gets setuptools and Cython (pyproject's build-system) and needs a C
# compiler and that Python's headers.
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
# Every extension source in the sdist (nfsd/native/*.pyx, and each generator's output) is a compiled
# module in the wheel: a wheel without them would run the pure-Python engine and say nothing.
"$python" - "$work/dist/ckptgw-$version.tar.gz" "$wheel" <<'PY'
import re, sys, tarfile, zipfile
sdist, wheel = tarfile.open(sys.argv[1]), zipfile.ZipFile(sys.argv[2])
setup_py = next(m for m in sdist.getmembers() if m.name.count("/") == 1 and m.name.endswith("/setup.py"))
generated = re.findall(r'\("[^"]+\.py", "([^"]+\.pyx)"\)', sdist.extractfile(setup_py).read().decode())
sources = {m.name.split("/", 1)[1] for m in sdist.getmembers() if m.name.endswith(".pyx")} | set(generated)
modules = {n for n in wheel.namelist() if n.endswith(".so")}
missing = sorted(s for s in sources if not any(m.startswith(s[:-len(".pyx")] + ".") for m in modules))
if not sources or missing or sys.argv[2].endswith("-none-any.whl"):
    sys.exit(f"build-dist.sh: {sys.argv[2]} lacks compiled modules for {missing or 'nfsd/native'} "
             f"(sdist sources {sorted(sources)}, wheel modules {sorted(modules)})")
PY
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
