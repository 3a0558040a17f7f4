"""packaging/build-dist.sh: the wheel and sdist the Ansible role installs, and the pins it installs
them with. Needs the package index (the build backend and the resolution), like the script."""
from __future__ import annotations

import os
import subprocess
import sys
import tarfile
import tomllib
import zipfile
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
PROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
VERSION = PROJECT["version"]

pytestmark = pytest.mark.timeout(900)


@pytest.fixture(scope="module")
def dist(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    proc = subprocess.run(["bash", str(REPO / "packaging" / "build-dist.sh"), str(out)], capture_output=True,
                          text=True, env=dict(os.environ, PYTHON=sys.executable), timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return out


def test_wheel_sdist_and_constraints_are_built(dist):
    names = sorted(p.name for p in dist.iterdir())
    assert names == [f"ckptgw-{VERSION}-constraints.txt", f"ckptgw-{VERSION}-py3-none-any.whl",
                     f"ckptgw-{VERSION}.tar.gz"], names
    with tarfile.open(dist / f"ckptgw-{VERSION}.tar.gz") as sdist:
        members = sdist.getnames()
    assert f"ckptgw-{VERSION}/pyproject.toml" in members
    assert any(m.startswith(f"ckptgw-{VERSION}/nfsd/xdr/") and m.endswith(".x") for m in members)
    with zipfile.ZipFile(dist / f"ckptgw-{VERSION}-py3-none-any.whl") as wheel:
        assert "appliance/cli.py" in wheel.namelist()
        assert any(n.startswith("nfsd/xdr/") and n.endswith(".x") for n in wheel.namelist())


def test_moto_is_only_in_the_tryout_extra(dist):
    with zipfile.ZipFile(dist / f"ckptgw-{VERSION}-py3-none-any.whl") as wheel:
        metadata = wheel.read(f"ckptgw-{VERSION}.dist-info/METADATA").decode()
    requires = [line.split(":", 1)[1].strip() for line in metadata.splitlines() if line.startswith("Requires-Dist:")]
    moto = [r for r in requires if r.lower().startswith("moto")]
    assert moto and all('extra == "tryout"' in r or 'extra == "test"' in r for r in moto), moto
    assert "Provides-Extra: tryout" in metadata


def test_constraints_pin_every_dependency_and_the_extra(dist):
    lines = (dist / f"ckptgw-{VERSION}-constraints.txt").read_text().splitlines()
    pins = dict(line.split("==") for line in lines if line and not line.startswith("#"))
    assert all(v and "*" not in v for v in pins.values())
    assert "ckptgw" not in pins
    wanted = [d.split(">")[0].split("[")[0].split("=")[0].strip().lower()
              for d in PROJECT["dependencies"] + PROJECT["optional-dependencies"]["tryout"]]
    assert not [w for w in wanted if w not in pins], (wanted, sorted(pins))
    assert {"botocore", "s3transfer", "werkzeug"} <= set(pins)          # transitive ones too


def test_role_installs_this_version_and_never_from_the_public_index_by_default():
    role = REPO / "ansible" / "roles" / "ckptgw"
    defaults = yaml.safe_load((role / "defaults" / "main.yml").read_text())
    assert defaults["ckptgw_version"] == VERSION
    assert defaults["ckptgw_install_source"] == "wheel" and defaults["ckptgw_extras"] == []
    assert "--index-url' in ckptgw_pip_extra_args" in (role / "tasks" / "assert.yml").read_text()
