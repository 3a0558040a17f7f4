"""The role without a host: lint, argument specs, rendered files, coverage of ckptgw's options."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tomllib
from dataclasses import MISSING, fields
from pathlib import Path

import pytest
import yaml

from playbook import ANSIBLE_DIR, ansible_env, run_playbook

pytestmark = pytest.mark.ansible

ROLE = ANSIBLE_DIR / "roles" / "ckptgw"
HERE = Path(__file__).resolve().parent
SECRET = "s3cr3t+/KEY\"with'quotes"

# Role defaults that differ from ckptgw's own on purpose (a service, not a try-out run).
DELIBERATE_OVERRIDES = {
    "ckptgw_listen": "a gateway serves the network; exports still admit loopback only",
    "ckptgw_cache_dir": "FHS location for the service's state",
    "ckptgw_admin_socket_mode": "0660 so members of the admin group can use the socket",
    "ckptgw_admin_group": "the role creates ckptgw-admin for operators",
}


def spec_options() -> dict:
    return yaml.safe_load((ROLE / "meta" / "argument_specs.yml").read_text())["argument_specs"]["main"]["options"]


def role_defaults() -> dict:
    return yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())


def render(ansible_bin: Path, tmp_path: Path, **variables):
    variables.setdefault("ckptgw_s3_endpoint", "")
    variables.setdefault("ckptgw_cache_fs_uuid", "0f0e0d0c-0000-4000-8000-000000000001")
    variables.update(out_dir=str(tmp_path), ansible_python_interpreter=str(ansible_bin / "python3"))
    extra = tmp_path / "vars.json"
    extra.write_text(json.dumps(variables))
    return run_playbook(ansible_bin, Path("localhost,"), "-e", f"@{extra}", playbook=HERE / "render.yml",
                        timeout=300)


def check_config(path: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", "from appliance.cli import main; main()", "check-config", str(path)],
                          capture_output=True, text=True)


def test_ansible_lint_production_profile(ansible_bin):
    proc = subprocess.run([str(ansible_bin / "ansible-lint"), "--nocolor", "--profile", "production",
                           "site.yml", "roles/ckptgw"], cwd=ANSIBLE_DIR, env=ansible_env(ansible_bin),
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]


def test_defaults_render_a_config_ckptgw_accepts(ansible_bin, tmp_path):
    run = render(ansible_bin, tmp_path, ckptgw_admin_group="")   # the group does not exist on this machine
    assert run.returncode == 0, run.tail()
    proc = check_config(tmp_path / "config.toml")
    assert proc.returncode == 0, proc.stderr


def test_example_inventory_renders_a_config_ckptgw_accepts(ansible_bin, tmp_path):
    group_vars = yaml.safe_load((ANSIBLE_DIR / "inventory/example/group_vars/ckptgw_gateways/main.yml").read_text())
    vault = yaml.safe_load((ANSIBLE_DIR / "inventory/example/group_vars/ckptgw_gateways/vault.yml").read_text())
    run = render(ansible_bin, tmp_path, **group_vars, **vault, ckptgw_admin_group="")
    assert run.returncode == 0, run.tail()
    proc = check_config(tmp_path / "config.toml")
    assert proc.returncode == 0, proc.stderr
    config = tomllib.loads((tmp_path / "config.toml").read_text())
    assert config["exports"] == [{"path": "/checkpoints", "networks": ["10.20.0.0/16"], "access": "rw",
                                  "squash": "root"}]
    assert config["s3"]["endpoint"] == "https://s3.eu-west-1.amazonaws.com"
    assert config["upload"]["bytes_per_second"] == "500MB"
    series = config["retention"]["series"][0]
    assert series["pattern"] == "runs/llama/step-{step}/**"
    assert series["transitions"] == [{"after": "7d", "storage_class": "GLACIER_IR"}]


def test_credentials_go_to_the_environment_file_only(ansible_bin, tmp_path):
    run = render(ansible_bin, tmp_path, ckptgw_s3_endpoint="https://s3.example.com",
                 ckptgw_s3_access_key="AKIDTEST", ckptgw_s3_secret_key=SECRET, ckptgw_admin_group="")
    assert run.returncode == 0, run.tail()
    assert SECRET not in run.output, "a secret was printed"
    assert "AKIDTEST" not in (tmp_path / "config.toml").read_text()
    env = (tmp_path / "ckptgw.env").read_text()
    assert 'AWS_ACCESS_KEY_ID="AKIDTEST"' in env
    assert 'AWS_SECRET_ACCESS_KEY="s3cr3t+/KEY\\"with\'quotes"' in env
    assert "AWS_SESSION_TOKEN" not in env


def test_scoped_admin_tokens_render_with_their_secrets_in_files_only(ansible_bin, tmp_path):
    tokens = [{"name": "training-jobs", "scope": "flush", "token": SECRET},
              {"name": "grafana", "scope": "read", "token_env": "CKPTGW_READ_TOKEN"},
              {"name": "ops", "scope": "admin", "token_file": "/etc/ckptgw/ops.token"}]
    run = render(ansible_bin, tmp_path, ckptgw_admin_group="", ckptgw_admin_listen="127.0.0.1:7077",
                 ckptgw_admin_tokens=tokens)
    assert run.returncode == 0, run.tail()
    assert SECRET not in run.output, "a secret was printed"
    text = (tmp_path / "config.toml").read_text()
    assert SECRET not in text and SECRET not in (tmp_path / "restart-settings.json").read_text()
    proc = check_config(tmp_path / "config.toml")
    assert proc.returncode == 0, proc.stderr
    assert tomllib.loads(text)["admin"]["tokens"] == [
        {"name": "training-jobs", "scope": "flush", "token_file": "/etc/ckptgw/admin-training-jobs.token"},
        {"name": "grafana", "scope": "read", "token_env": "CKPTGW_READ_TOKEN"},
        {"name": "ops", "scope": "admin", "token_file": "/etc/ckptgw/ops.token"}]
    run = render(ansible_bin, tmp_path, ckptgw_admin_tokens=[{"name": "x", "scope": "root", "token": "t"}])
    assert run.returncode != 0 and "root" in run.output, run.tail()


def test_bad_variable_fails_early_naming_it(ansible_bin, tmp_path):
    run = render(ansible_bin, tmp_path, ckptgw_log_level="verbose")
    assert run.returncode != 0
    assert "ckptgw_log_level" in run.output and "debug, info, warning, error" in run.output, run.tail()
    run = render(ansible_bin, tmp_path, ckptgw_exports=[{"path": "/x", "acces": "rw"}])
    assert run.returncode != 0
    assert "acces" in run.output, run.tail()


def test_a_variable_for_every_config_option():
    from appliance import config as cfg
    options = spec_options()
    missing = []
    for section, cls in cfg.SECTIONS.items():
        for f in fields(cls):
            name = f"ckptgw_{f.name}" if section == "server" else f"ckptgw_{section}_{f.name}"
            if name not in options:
                missing.append(f"[{section}] {f.name} -> {name}")
    for table, cls, spec in [("exports", cfg.ExportSettings, options["ckptgw_exports"]["options"]),
                             ("admin.tokens", cfg.AdminToken, options["ckptgw_admin_tokens"]["options"]),
                             ("retention.series", cfg.SeriesRule, options["ckptgw_retention_series"]["options"]),
                             ("transitions", cfg.Transition,
                              options["ckptgw_retention_series"]["options"]["transitions"]["options"])]:
        missing += [f"[[{table}]] {f.name}" for f in fields(cls) if f.name not in spec]
    assert not missing, "config options without a role variable: " + ", ".join(missing)


def test_role_defaults_are_ckptgw_defaults():
    from appliance import config as cfg
    defaults = role_defaults()
    differ = []
    for section, cls in cfg.SECTIONS.items():
        for f in fields(cls):
            name = f"ckptgw_{f.name}" if section == "server" else f"ckptgw_{section}_{f.name}"
            if name in DELIBERATE_OVERRIDES or name not in defaults or f.default is MISSING \
                    or "table_array" in f.metadata:
                continue
            parsed = f.metadata["parse"](defaults[name]) if defaults[name] not in (None,) else None
            if parsed != f.default:
                differ.append(f"{name}: role {defaults[name]!r} -> {parsed!r}, ckptgw {f.default!r}")
    assert not differ, "role defaults drifted from ckptgw's: " + "; ".join(differ)


def test_every_variable_is_specified_defaulted_and_documented():
    options, defaults = spec_options(), role_defaults()
    readme = (ROLE / "README.md").read_text()
    required = {k for k, v in options.items() if v.get("required")}
    assert set(defaults) | required == set(options), set(defaults) ^ set(options)
    undocumented = [name for name in options if f"`{name}`" not in readme]
    assert not undocumented, f"not in the role's README: {undocumented}"


def test_unit_follows_the_packaged_unit(ansible_bin, tmp_path):
    packaged = ANSIBLE_DIR.parent / "packaging" / "systemd" / "ckptgw.service"
    if not packaged.exists():
        pytest.skip("packaging/systemd/ckptgw.service not there yet")
    run = render(ansible_bin, tmp_path, ckptgw_admin_group="")
    assert run.returncode == 0, run.tail()

    def directives(text: str) -> dict[str, str]:
        out = {}
        for line in text.splitlines():
            if "=" in line and not line.lstrip().startswith(("#", ";")):
                key, value = line.split("=", 1)
                out[key.strip()] = value.strip()
        return out

    ours, theirs = directives((tmp_path / "ckptgw.service").read_text()), directives(packaged.read_text())
    # With the role's default paths and user, every directive of the packaged unit is the same.
    differ = {key: (ours.get(key), value) for key, value in theirs.items() if ours.get(key) != value}
    assert not differ, f"role unit vs packaging unit (role, packaging): {differ}"


@pytest.mark.parametrize("mountpoint", ["/var/lib/ckptgw", "/srv/ckpt-cache/gw_1.d"])
def test_cache_mount_unit_is_named_as_systemd_escape_names_it(ansible_bin, tmp_path, mountpoint):
    escape = shutil.which("systemd-escape")
    if not escape:
        pytest.skip("no systemd-escape on this machine")
    run = render(ansible_bin, tmp_path, ckptgw_admin_group="", ckptgw_cache_device="/dev/vdb",
                 ckptgw_cache_mountpoint=mountpoint, ckptgw_cache_dir=f"{mountpoint}/cache")
    assert run.returncode == 0, run.tail()
    expected = subprocess.run([escape, "--path", "--suffix=mount", mountpoint], capture_output=True, text=True,
                              check=True).stdout.strip()
    assert (tmp_path / "cache-mount-unit-name").read_text().strip() == expected


# What the guest's python3 reports (Debian 12 on x86-64), as tasks/assert.yml's probe reads it.
DEBIAN12_X86_64 = {"version": "3.11.2", "minor": 11, "interpreter": "cp311", "abi": "cp311",
                   "platform": "linux_x86_64", "machine": "x86_64"}


def test_default_wheel_is_the_one_platform_wheel_and_its_tags_must_suit_the_host(ansible_bin, tmp_path):
    """ckptgw_wheel "": the one ckptgw-VERSION-*.whl in ckptgw_dist_dir (none or two: none picked, the
    play fails naming them); its tags against the host's Python (a wheel for another one fails)."""
    version = role_defaults()["ckptgw_version"]
    cases, expected = [], []

    def case(files: list[str], suits, host=DEBIAN12_X86_64, wheel: str = ""):
        dist = tmp_path / f"dist{len(cases)}"
        dist.mkdir()
        for name in files:
            (dist / name).write_bytes(b"")
        cases.append({"dist_dir": str(dist), "wheel": wheel and str(dist / wheel), "host": json.dumps(host)})
        expected.append((files, wheel, suits))

    case([f"ckptgw-{version}-cp311-cp311-linux_x86_64.whl", f"ckptgw-{version}-constraints.txt",
          "ckptgw-0.0.9-cp311-cp311-linux_x86_64.whl"], True)                  # build-dist.sh's; an older version beside it
    case([f"ckptgw-{version}-cp312-cp312-linux_x86_64.whl"], False)                # built with another Python
    case([f"ckptgw-{version}-cp311-cp311-linux_aarch64.whl"], False)               # another machine
    case([f"ckptgw-{version}-cp311-cp311-macosx_11_0_arm64.whl"], False)
    case([f"ckptgw-{version}-py3-none-any.whl"], True)                             # a pure wheel suits any host
    case([f"ckptgw-{version}-cp39-abi3-manylinux_2_17_x86_64.manylinux2014_x86_64.whl"], True)
    case([f"ckptgw-{version}-cp312-abi3-manylinux_2_17_x86_64.whl"], False)        # abi3 from 3.12 on
    case([f"ckptgw-{version}-cp311-cp311-linux_x86_64.whl"], False,
         host=dict(DEBIAN12_X86_64, version="3.12.3", minor=12, interpreter="cp312", abi="cp312"))
    case([], None)                                                                 # nothing built
    case([f"ckptgw-{version}-cp311-cp311-linux_x86_64.whl", f"ckptgw-{version}-py3-none-any.whl"], None)
    case([f"ckptgw-{version}-py3-none-any.whl", "ckptgw-0.2.0-cp311-cp311-linux_x86_64.whl"], True,
         wheel="ckptgw-0.2.0-cp311-cp311-linux_x86_64.whl")                        # named: no glob

    run = render(ansible_bin, tmp_path, ckptgw_admin_group="", wheel_cases=cases)
    assert run.returncode == 0, run.tail()
    for index, (files, wheel, suits) in enumerate(expected):
        got = json.loads((tmp_path / f"wheel-{index}.json").read_text())
        wheels = sorted(f for f in files if f.startswith(f"ckptgw-{version}-") and f.endswith(".whl"))
        picked = wheel or (wheels[0] if len(wheels) == 1 else "")
        assert Path(got["wheel_file"]).name == picked, (files, got)
        assert [Path(w).name for w in got["dist_wheels"]] == wheels, (files, got)
        assert got["suits"] == suits, (files, got)
        if picked:
            picked_version = picked.split("-")[1]
            assert got["wanted_version"] == picked_version
            assert got["constraints_file"].endswith(f"/ckptgw-{picked_version}-constraints.txt"), got
