"""packaging/build-dist.sh: the wheel and sdist the Ansible role installs, and the pins it installs
them with. Needs the package index (the build backend and the resolution), like the script."""
from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
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


def wheel_path(dist: Path) -> Path:
    """The one wheel build-dist.sh wrote: a platform wheel (compiled extensions) for this Python."""
    wheels = sorted(dist.glob(f"ckptgw-{VERSION}-*.whl"))
    assert len(wheels) == 1, wheels
    return wheels[0]


def generated_sources() -> list[str]:
    """The .pyx files setup.py's GENERATORS write at build time (never committed, never in the sdist)."""
    import ast
    tree = ast.parse((REPO / "setup.py").read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.AnnAssign | ast.Assign):
            targets = [node.target] if isinstance(node, ast.AnnAssign) else node.targets
            if any(isinstance(t, ast.Name) and t.id == "GENERATORS" for t in targets):
                return [target for _, target in ast.literal_eval(node.value)]
    raise AssertionError("no GENERATORS in setup.py")


def test_wheel_sdist_and_constraints_are_built(dist):
    tag = f"cp{sys.version_info[0]}{sys.version_info[1]}"
    platform = sysconfig.get_platform().replace("-", "_").replace(".", "_")
    names = sorted(p.name for p in dist.iterdir())
    # a platform wheel for the Python that built it (build-dist.sh runs PYTHON=sys.executable here)
    assert names == [f"ckptgw-{VERSION}-constraints.txt", f"ckptgw-{VERSION}-{tag}-{tag}-{platform}.whl",
                     f"ckptgw-{VERSION}.tar.gz"], names
    assert wheel_path(dist).name == f"ckptgw-{VERSION}-{tag}-{tag}-{platform}.whl"


def test_sdist_has_the_sources_not_what_the_build_generates(dist):
    with tarfile.open(dist / f"ckptgw-{VERSION}.tar.gz") as sdist:
        members = {m.split("/", 1)[1] for m in sdist.getnames() if "/" in m}
    assert {"pyproject.toml", "setup.py", "nfsd/xdr/gen_cython.py", "nfsd/native/__init__.py"} <= members
    assert any(m.startswith("nfsd/xdr/") and m.endswith(".x") for m in members)
    committed = {str(p.relative_to(REPO)) for p in (REPO / "nfsd" / "native").glob("*.pyx")} - set(generated_sources())
    assert committed and committed <= members, (sorted(committed), sorted(members))
    generated = set(generated_sources())
    assert generated and not generated & members, sorted(generated & members)
    assert not [m for m in members if m.endswith((".c", ".so", ".html"))], sorted(members)


def test_wheel_has_the_compiled_extensions(dist):
    with zipfile.ZipFile(wheel_path(dist)) as wheel:
        names = wheel.namelist()
        meta = wheel.read(f"ckptgw-{VERSION}.dist-info/WHEEL").decode()
    assert "appliance/cli.py" in names
    assert any(n.startswith("nfsd/xdr/") and n.endswith(".x") for n in names)
    suffix = sysconfig.get_config_var("EXT_SUFFIX")                  # .cpython-311-x86_64-linux-gnu.so
    modules = {n for n in names if n.startswith("nfsd/native/") and n.endswith(".so")}
    assert {n for n in modules if n.startswith("nfsd/native/rpc")} == {f"nfsd/native/rpc{suffix}"}, sorted(modules)
    for pyx in generated_sources():                                   # the XDR codecs, when setup.py generates them
        assert f"{pyx[:-len('.pyx')]}{suffix}" in modules, (pyx, sorted(modules))
    assert not [n for n in names if n.endswith(".c")], "C sources in the wheel"
    assert "Root-Is-Purelib: false" in meta and "Tag: cp3" in meta, meta


def test_harness_code_is_not_shipped(dist):
    """testkit/ (what tests/ and bench/ share, issue 39) and tests/ are in neither artifact."""
    with zipfile.ZipFile(wheel_path(dist)) as wheel:
        names = wheel.namelist()
    with tarfile.open(dist / f"ckptgw-{VERSION}.tar.gz") as sdist:
        members = {m.split("/", 1)[1] for m in sdist.getnames() if "/" in m}
    for where, found in (("wheel", names), ("sdist", members)):
        shipped = sorted(n for n in found if n.startswith(("testkit/", "tests/", "bench/")))
        assert not shipped, (where, shipped[:10])


def test_moto_is_only_in_the_tryout_extra(dist):
    with zipfile.ZipFile(wheel_path(dist)) as wheel:
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
