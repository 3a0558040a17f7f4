#!/usr/bin/env bash
# A native parser of client bytes under AddressSanitizer (issue 37 point 6): build the extensions
# it needs with CKPTGW_ASAN=1 in a copy of the tree (never in place: the checkout's normal build
# stays, other work imports it), then run its fuzz loop there with libasan preloaded. Fails on
# any ASan report, any finding of the loop, or a build that did not come out instrumented.
#
#   tests/fuzz/asan.sh TARGET [INPUTS [SEED]]     default 20000 inputs, seed 37
#
# TARGET     extensions built        loop
# rpc        rpc                     tests/fuzz/test_rpc_native_fuzz.py
# xdr        xdr_nfs4 (generated)    tests/fuzz/test_native_parsers_fuzz.py --target xdr
# compound   compound, xdr_nfs4      tests/fuzz/test_native_parsers_fuzz.py --target compound
#
# CKPTGW_ASAN_BUILD_DIR=DIR builds in DIR and keeps it; a later run with the same DIR reuses the
# instrumented build when the tree's sources are unchanged (the generated codec takes minutes
# to compile under ASan; runs of several targets may share DIR). CKPTGW_ASAN_ALL=1 builds every
# extension.
#
# PYTHONMALLOC=malloc: objects below 512 bytes would otherwise live in pymalloc's arenas, where
# ASan cannot see an overflow; detect_leaks=0: CPython keeps memory until exit.
set -euo pipefail
target="${1:?usage: asan.sh rpc|xdr|compound [INPUTS [SEED]]}"
inputs="${2:-20000}"
seed="${3:-37}"
case "$target" in
rpc)
	keep="rpc"
	run=(-m tests.fuzz.test_rpc_native_fuzz)
	;;
xdr)
	keep="xdr_nfs4"
	run=(-m tests.fuzz.test_native_parsers_fuzz --target xdr)
	;;
compound)
	keep="compound xdr_nfs4"
	run=(-m tests.fuzz.test_native_parsers_fuzz --target compound)
	;;
*)
	echo "asan.sh: unknown target $target (rpc, xdr, compound)" >&2
	exit 2
	;;
esac
root="$(cd "$(dirname "$0")/../.." && pwd)"
py="${CKPTGW_PYTHON:-$root/.venv/bin/python}"
[ -x "$py" ] || py="$(command -v python3)"

# Cython is a build requirement (pyproject.toml), so pip has it in its isolated build env, not
# necessarily in the venv: build with an interpreter that has it and the same ABI as $py.
build_py="$py"
if ! "$build_py" -c "import Cython" 2> /dev/null; then
	build_py=""
	want="$("$py" -c 'import sysconfig; print(sysconfig.get_config_var("SOABI"))')"
	for cand in python3 "python$("$py" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"; do
		c="$(command -v "$cand" || true)"
		[ -n "$c" ] || continue
		if "$c" -c "import Cython" 2> /dev/null &&
			[ "$("$c" -c 'import sysconfig; print(sysconfig.get_config_var("SOABI"))')" = "$want" ]; then
			build_py="$c"
			break
		fi
	done
	[ -n "$build_py" ] || {
		echo "asan.sh: no Python with Cython for ABI $want (pip install Cython)" >&2
		exit 2
	}
fi
libasan="$(gcc -print-file-name=libasan.so)"
[ -f "$libasan" ] || {
	echo "asan.sh: gcc has no libasan.so ($libasan)" >&2
	exit 2
}

if [ -n "${CKPTGW_ASAN_BUILD_DIR:-}" ]; then
	tmp="$CKPTGW_ASAN_BUILD_DIR"
	mkdir -p "$tmp"
else
	tmp="$(mktemp -d "${TMPDIR:-/tmp}/ckptgw-asan-$target.XXXXXX")"
	trap 'rm -rf "$tmp"' EXIT
fi
# The tree as it is now (tracked files, with uncommitted edits), into the build dir; a file
# whose content is unchanged keeps its mtime there, so a kept build is not redone for nothing.
stage="$(mktemp -d "${TMPDIR:-/tmp}/ckptgw-asan-stage.XXXXXX")"
(cd "$root" && git ls-files -z --cached --others --exclude-standard | tar --null --ignore-failed-read -T - -cf - 2> /dev/null) | tar -xf - -C "$stage"
if [ -z "${CKPTGW_ASAN_ALL:-}" ]; then
	for pyx in "$stage"/nfsd/native/*.pyx; do
		m="$(basename "$pyx" .pyx)"
		case " $keep " in *" $m "*) ;; *) rm -f "$pyx" ;; esac
	done
	case " $keep " in
	*" xdr_nfs4 "*) ;;
	*) sed -i 's/^GENERATORS: \(.*\) = .*/GENERATORS: \1 = []/' "$stage/setup.py" ;;
	esac
fi
# a kept dir may be shared by runs of other targets: one syncs and builds at a time, and a
# module another target built stays (setup.py builds every .pyx present; all are instrumented)
exec 9> "$tmp/.asan-build.lock"
flock 9
(cd "$stage" && find . -type f -print0) | while IFS= read -r -d '' f; do
	if ! cmp -s "$stage/$f" "$tmp/$f"; then
		mkdir -p "$(dirname "$tmp/$f")"
		cp -p "$stage/$f" "$tmp/$f"
	fi
done
rm -rf "$stage"

echo "asan.sh: building $keep in $tmp with $build_py" >&2
bstart=$(date +%s)
# no --force: setuptools rebuilds what changed (a fresh dir: everything)
(cd "$tmp" && CKPTGW_ASAN=1 "$build_py" setup.py build_ext --inplace -j 2 > "$tmp/build.log" 2>&1) || {
	tail -40 "$tmp/build.log" >&2
	exit 2
}
echo "asan.sh: build took $(($(date +%s) - bstart)) s" >&2
flock -u 9
for m in $keep; do
	so="$(ls "$tmp"/nfsd/native/"$m".*.so)"
	if ! nm -D "$so" | grep -c __asan_report > /dev/null; then  # -q would SIGPIPE nm (pipefail)
		echo "asan.sh: $so is not instrumented" >&2
		exit 2
	fi
done

log="$tmp/run-$target-$seed.log"
start=$(date +%s)
set +e
(cd "$tmp" && LD_PRELOAD="$libasan" ASAN_OPTIONS="detect_leaks=0:halt_on_error=1" PYTHONMALLOC=malloc \
	PYTHONDONTWRITEBYTECODE=1 "$py" "${run[@]}" --inputs "$inputs" --seed "$seed" \
	--crash-dir "${CKPTGW_FUZZ_CRASH_DIR:-$tmp/crashes}") > "$log" 2>&1
rc=$?
set -e
elapsed=$(($(date +%s) - start))
cat "$log"
for m in $keep; do
	if ! grep -q "^native module: $tmp/nfsd/native/$m\." "$log"; then
		echo "asan.sh: FAIL: the run did not load the instrumented $m from $tmp" >&2
		exit 1
	fi
done
if grep -q "AddressSanitizer" "$log"; then
	echo "asan.sh: FAIL: $target: AddressSanitizer report (inputs=$inputs seed=$seed, ${elapsed} s)" >&2
	exit 1
fi
if [ "$rc" -ne 0 ]; then
	echo "asan.sh: FAIL: $target: exit status $rc (inputs=$inputs seed=$seed, ${elapsed} s)" >&2
	exit 1
fi
echo "asan.sh: OK: target=$target inputs=$inputs seed=$seed seconds=$elapsed asan_reports=0 findings=0"
