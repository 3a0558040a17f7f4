#!/usr/bin/env bash
# Build the Ansible role as a tarball `ansible-galaxy role install` takes:
#   OUTDIR/ckptgw-role-VERSION.tar.gz     ckptgw/ (the role: tasks, handlers, templates, files/
#                                          with the alert rules and the dashboard, meta/ with
#                                          galaxy_info) and nothing outside it
# VERSION is pyproject.toml's. Install it on a controller with a requirements file:
#   - src: ./ckptgw-role-0.1.0.tar.gz     (or an https:// URL)
#     name: ckptgw
#   ansible-galaxy role install -r requirements.yml -p roles/
# The role is self-contained: the unit, the alert rules and the dashboard are inside it; the wheel and
# the constraints file come from packaging/build-dist.sh's output (ckptgw_dist_dir or ckptgw_wheel).
# Reproducible: sorted members, root-owned, the time of the last commit touching the role.
#
#   packaging/build-role.sh [OUTDIR]      (default OUTDIR: <checkout>/dist)
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
out="$(mkdir -p "${1:-$here/dist}" && cd "${1:-$here/dist}" && pwd)"
version="$(sed -n 's/^version *= *"\([^"]*\)".*/\1/p' "$here/pyproject.toml" | head -n 1)"
mtime="$(git -C "$here" log -1 --format=%ct -- ansible/roles/ckptgw 2> /dev/null || true)"
tarball="$out/ckptgw-role-$version.tar.gz"
tar --create --sort=name --owner=0 --group=0 --numeric-owner --mode='u+rwX,go+rX,go-w' \
	--mtime="@${mtime:-0}" --exclude='__pycache__' --exclude='*.retry' --exclude='.*' \
	-C "$here/ansible/roles" ckptgw | gzip -n > "$tarball"
echo "$tarball"
