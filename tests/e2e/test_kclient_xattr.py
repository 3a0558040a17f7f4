"""Upload state through the Linux kernel client's own xattr calls (issue 39, RFC 8276): the
gateway in try-out mode (embedded S3), mounted with vers=4.2 in the VM. One boot: a file
written and held open reads user.ckptgw.state = dirty (getfattr and os.getxattr), setfattr
and os.setxattr fail with EACCES, `ckptgw wait` on the directory and wait_uploaded() on the
file return once the uploader has put it in S3, and user.ckptgw.key names its object; the
same export mounted again with vers=4.1 makes `ckptgw wait` exit 3 naming vers=4.2.

It also records (INFO, not asserted) what a plain re-read of user.ckptgw.state returns after
the upload: the Linux client caches xattr values until the change attribute moves, which is
why appliance/waiting.py asks for a fresh `NAME.<suffix>` each time."""
from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from testkit.appliance_live import LiveDaemon

pytestmark = pytest.mark.kclient

REPO = Path(__file__).resolve().parents[2]
LINE_RE = re.compile(r"^(PASS|FAIL|INFO) (\S+)(?: (.*))?$")

GUEST = r'''
cd /mnt || exit 3
mkdir -p run1/step1
GA() { if command -v getfattr >/dev/null; then getfattr --only-values -n "$1" "$2" 2>&1;
       else "$PY" -c 'import os,sys; print(os.getxattr(sys.argv[2], sys.argv[1]).decode())' "$1" "$2" 2>&1; fi; }
"$PY" - <<'EOF'
import errno, os
p = "run1/step1/rank0.pt"
f = open(p, "wb")
f.write(os.urandom(1 << 20)); f.flush(); os.fsync(f.fileno())
v = os.getxattr(p, "user.ckptgw.state")          # open for write: never uploaded yet
print(("PASS" if v == b"dirty" else "FAIL") + " state_dirty_while_open " + v.decode())
names = [n for n in os.listxattr(p) if n.startswith("user.ckptgw.")]
print(("PASS" if names == ["user.ckptgw.state"] else "FAIL") + " listxattr " + ",".join(names))
for name in ("user.ckptgw.state", "user.mine"):
    try:
        os.setxattr(p, name, b"in_s3")
        print("FAIL setxattr_refused_" + name[5:] + " succeeded")
    except OSError as e:
        print(("PASS" if e.errno == errno.EACCES else "FAIL") + " setxattr_refused_" + name[5:] + " " + e.strerror)
f.close()
EOF
if command -v setfattr >/dev/null; then
  out=$(setfattr -n user.ckptgw.state -v in_s3 run1/step1/rank0.pt 2>&1) && echo "FAIL setfattr_refused succeeded" \
    || { case $out in *"Permission denied"*) echo "PASS setfattr_refused $out";; *) echo "FAIL setfattr_refused $out";; esac; }
else
  echo "INFO setfattr_missing the attr package is not installed on the host"
fi
if (cd "$REPO" && "$PY" -m appliance.cli wait --timeout 300 --interval 1 /mnt/run1); then
  echo "PASS ckptgw_wait_dir"; else echo "FAIL ckptgw_wait_dir rc=$?"; fi
v=$(GA user.ckptgw.pending_files.x1 run1); [ "$v" = 0 ] && echo "PASS pending_files_zero" || echo "FAIL pending_files_zero $v"
(cd "$REPO" && "$PY" - <<'EOF'
from appliance.waiting import wait_uploaded
st = wait_uploaded("/mnt/run1/step1/rank0.pt", timeout=120, interval=1)
ok = st.state == "in_s3" and st.object.get("key") == "run1/step1/rank0.pt" and st.object.get("etag")
print(("PASS" if ok else "FAIL") + " wait_uploaded_file " + repr(st.object))
EOF
)
v=$(GA user.ckptgw.key.k1 run1/step1/rank0.pt); [ "$v" = run1/step1/rank0.pt ] && echo "PASS key" || echo "FAIL key $v"
echo "INFO plain_name_after_upload $(GA user.ckptgw.state run1/step1/rank0.pt)"
# the same export over vers=4.1: no xattrs there, and `ckptgw wait` says so (exit 3)
. "$KCLIENT_GUEST_LIB"; mkdir -p /tmp/m41
if kc_mount /tmp/m41 vers=4.1; then
  out=$(cd "$REPO" && "$PY" -m appliance.cli wait --timeout 5 /tmp/m41/run1 2>&1); rc=$?
  case "$rc $out" in "3 "*"vers=4.2"*) echo "PASS wait_on_4_1_mount";; *) echo "FAIL wait_on_4_1_mount rc=$rc $out";; esac
  umount /tmp/m41
else
  echo "FAIL wait_on_4_1_mount the 4.1 mount failed"
fi
'''


@pytest.fixture
def daemon(tmp_path):
    d = LiveDaemon(tmp_path).start()
    yield d
    d.close()


def test_upload_state_xattrs_through_the_kernel_client_on_vers_4_2(daemon):
    from testkit.kclient import KernelClient, require
    require()
    kc = KernelClient(daemon.nfs_port, export="/checkpoints", vers="4.2")
    res = kc.run(GUEST, timeout=900, env={"PY": sys.executable, "REPO": str(REPO)}, cwd=str(REPO))
    results = {}
    for line in res.stdout.splitlines():
        m = LINE_RE.match(line.strip())
        if m:
            results.setdefault(m.group(2), (m.group(1), m.group(3) or ""))
    print("\n".join(f"{k}: {v}" for k, v in results.items()))
    failed = {k: v for k, v in results.items() if v[0] == "FAIL"}
    want = {"state_dirty_while_open", "listxattr", "setxattr_refused_ckptgw.state",
            "setxattr_refused_mine", "ckptgw_wait_dir",
            "pending_files_zero", "wait_uploaded_file", "key", "wait_on_4_1_mount"}
    if failed or not want <= set(results) or res.rc != 0:
        pytest.fail(f"failed: {failed}, missing: {want - set(results)}\n{res.describe(tail=60)}",
                    pytrace=False)
