#!/usr/bin/env bash
# The native RPC layer (nfsd/native/rpc.pyx) under AddressSanitizer: build the extensions with
# CKPTGW_ASAN=1 in a temporary copy of the tree (never in place: the checkout's normal build
# stays), then run the differential fuzz loop of tests/fuzz/test_rpc_native_fuzz.py there with
# libasan preloaded. Fails on any ASan report, any finding of the loop, or a build that did not
# come out instrumented.
#
#   tests/fuzz/asan_rpc.sh [INPUTS [SEED]]     default 20000 inputs, seed 37
#
# PYTHONMALLOC=malloc: bytearrays below 512 bytes would otherwise live in pymalloc's arenas,
# where ASan cannot see an overflow; detect_leaks=0: CPython keeps memory until exit.
set -euo pipefail
inputs="${1:-20000}"
seed="${2:-37}"
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
		echo "asan_rpc.sh: no Python with Cython for ABI $want (pip install Cython)" >&2
		exit 2
	}
fi
libasan="$(gcc -print-file-name=libasan.so)"
[ -f "$libasan" ] || {
	echo "asan_rpc.sh: gcc has no libasan.so ($libasan)" >&2
	exit 2
}

tmp="$(mktemp -d "${TMPDIR:-/tmp}/ckptgw-asan-rpc.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
(cd "$root" && git ls-files -z | tar --null --ignore-failed-read -T - -cf - 2> /dev/null) | tar -xf - -C "$tmp"
# Only nfsd/native/rpc.pyx is needed (it imports no other native module): in the copy, the other
# .pyx go and setup.py's generators are switched off (the generated XDR codec takes minutes to
# compile under ASan). CKPTGW_ASAN_ALL=1 builds everything.
if [ -z "${CKPTGW_ASAN_ALL:-}" ]; then
	find "$tmp/nfsd/native" -name '*.pyx' ! -name rpc.pyx -delete
	sed -i 's/^GENERATORS: \(.*\) = .*/GENERATORS: \1 = []/' "$tmp/setup.py"
fi

echo "asan_rpc.sh: building in $tmp with $build_py" >&2
(cd "$tmp" && CKPTGW_ASAN=1 "$build_py" setup.py build_ext --inplace --force > "$tmp/build.log" 2>&1) || {
	tail -40 "$tmp/build.log" >&2
	exit 2
}
so="$(ls "$tmp"/nfsd/native/rpc.*.so)"
if ! nm -D "$so" | grep -q __asan_report; then
	echo "asan_rpc.sh: $so is not instrumented" >&2
	exit 2
fi

log="$tmp/run.log"
start=$(date +%s)
set +e
(cd "$tmp" && LD_PRELOAD="$libasan" ASAN_OPTIONS="detect_leaks=0:halt_on_error=1" PYTHONMALLOC=malloc \
	PYTHONDONTWRITEBYTECODE=1 "$py" -m tests.fuzz.test_rpc_native_fuzz --inputs "$inputs" --seed "$seed" \
	--crash-dir "${CKPTGW_FUZZ_CRASH_DIR:-$tmp/crashes}") > "$log" 2>&1
rc=$?
set -e
elapsed=$(($(date +%s) - start))
cat "$log"
if ! grep -q "^native module: $tmp/" "$log"; then
	echo "asan_rpc.sh: FAIL: the run did not load the instrumented module from $tmp" >&2
	exit 1
fi
if grep -q "AddressSanitizer" "$log"; then
	echo "asan_rpc.sh: FAIL: AddressSanitizer report (inputs=$inputs seed=$seed, ${elapsed} s)" >&2
	exit 1
fi
if [ "$rc" -ne 0 ]; then
	echo "asan_rpc.sh: FAIL: exit status $rc (inputs=$inputs seed=$seed, ${elapsed} s)" >&2
	exit 1
fi
echo "asan_rpc.sh: OK: inputs=$inputs seed=$seed seconds=$elapsed asan_reports=0 findings=0"
