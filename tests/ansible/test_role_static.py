"""The role without a host: lint, argument specs, rendered files, coverage of ckptgw's options."""
from __future__ import annotations

import difflib
import http.server
import json
import re
import shutil
import subprocess
import sys
import threading
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


README_VARIABLE = re.compile(r"^- `(ckptgw_\w+)`, (?:default `([^`]*)`|(required), no default|default: (.*))"
                             r"(?:, one of ((?:`[^`]+`(?:, )?)+))?:$")


def test_readme_lists_every_variable_with_its_default_as_plain_text():
    """The role README's variables: one list item each (`- `name`, default `value`[, one of ...]:`
    and the meaning on indented lines), readable as plain text and in GitHub, no line over 100
    characters and no table. Exactly the variables of defaults/main.yml (and the required ones),
    each with the default that file gives and the choices of meta/argument_specs.yml."""
    options, defaults = spec_options(), role_defaults()
    text = (ROLE / "README.md").read_text()
    section = text[text.index("## Variables"):text.index("## Testing")]
    assert not [line for line in section.splitlines() if line.startswith("|")], "a table in the variables"
    listed, problems = {}, []
    for line in section.splitlines():
        if line.startswith("- `ckptgw_"):
            m = README_VARIABLE.match(line)
            if not m:
                problems.append(f"not in the list's form: {line}")
                continue
            name, default, required, described, choices = m.groups()
            assert name not in listed, f"{name} listed twice"
            listed[name] = (default, required, described, choices)
    readme_names, expected = set(listed), set(defaults) | {k for k, v in options.items() if v.get("required")}
    assert readme_names == expected, f"only in README: {sorted(readme_names - expected)}; " \
                                     f"only in defaults/main.yml: {sorted(expected - readme_names)}"
    for name, (default, required, described, choices) in listed.items():
        if required:
            problems += [f"{name}: required in README, not in argument_specs"] if not options[name].get("required") else []
        elif default is not None and default != json.dumps(defaults[name]):
            problems.append(f"{name}: README default `{default}`, defaults/main.yml {json.dumps(defaults[name])}")
        spec_choices = options[name].get("choices")
        if (choices and re.findall(r"`([^`]+)`", choices)) != (spec_choices and [str(c) for c in spec_choices]):
            problems.append(f"{name}: README choices {choices}, argument_specs {spec_choices}")
    assert not problems, "\n".join(problems)
    long = [line for line in section.splitlines() if len(line) > 100]
    assert not long, long


def test_packaged_unit_is_the_role_template_rendered_with_the_defaults(ansible_bin, tmp_path):
    """The unit has one source, the role's template; packaging/systemd/ckptgw.service (for packagers
    and tests/appliance/test_systemd_unit.py) is its rendering with the role's defaults, identical
    from [Unit] on: a change to either alone fails here, showing the difference."""
    packaged = ANSIBLE_DIR.parent / "packaging" / "systemd" / "ckptgw.service"
    run = render(ansible_bin, tmp_path, ckptgw_admin_group="")
    assert run.returncode == 0, run.tail()

    def body(text: str) -> list[str]:
        lines = text.splitlines(keepends=True)
        return lines[lines.index("[Unit]\n"):]

    rendered, committed = body((tmp_path / "ckptgw.service").read_text()), body(packaged.read_text())
    assert "SupplementaryGroups" not in "".join(rendered)      # haclient: a pair's unit only
    diff = "".join(difflib.unified_diff(committed, rendered, "packaging/systemd/ckptgw.service",
                                        "templates/ckptgw.service.j2 rendered with the role's defaults"))
    assert not diff, "edit the template and copy its rendering into packaging/systemd/ckptgw.service:\n" + diff


def test_the_role_reads_nothing_outside_itself():
    """Installed alone (ansible-galaxy), the role has what it deploys: every src of a copy or
    template task is in its files/ or templates/, or is an artifact it is given (the wheel and the
    constraints file, ckptgw_dist_dir / ckptgw_wheel / ckptgw_constraints). No path climbs out of
    the role except ckptgw_dist_dir's default, the checkout's dist/ for the role in a checkout."""
    artifacts = {"{{ ckptgw_wheel_file }}", "{{ ckptgw_constraints_file }}"}
    for path in sorted((ROLE / "tasks").glob("*.yml")) + [ROLE / "handlers" / "main.yml"]:
        for task in yaml.safe_load(path.read_text()) or []:
            for block in [task, *task.get("block", [])]:
                for module in ("ansible.builtin.copy", "ansible.builtin.template"):
                    src = (block.get(module) or {}).get("src")
                    if src is None:
                        continue
                    where = ROLE / ("templates" if module.endswith("template") else "files") / src
                    assert src in artifacts or ("/" not in src and where.is_file()), f"{path.name}: {block['name']}: {src}"
    climbing = []
    for path in sorted(p for p in ROLE.rglob("*") if p.is_file() and p.suffix in (".yml", ".j2")):
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if ("playbook_dir" in line or "role_path }}/.." in line or "inventory_dir" in line) \
                    and not line.lstrip().startswith("#"):
                climbing.append(f"{path.relative_to(ROLE)}:{n}: {line.strip()}")
    assert climbing == ['defaults/main.yml:23: ckptgw_dist_dir: "{{ role_path }}/../../../dist"'], climbing


def test_galaxy_metadata():
    meta = yaml.safe_load((ROLE / "meta" / "main.yml").read_text())["galaxy_info"]
    assert meta["role_name"] == "ckptgw" and meta["namespace"] == "ckptgw"
    assert meta["license"] == "Apache-2.0" and meta["min_ansible_version"] == "2.16"
    assert meta["platforms"] == [{"name": "Debian", "versions": ["bookworm"]}]
    assert yaml.safe_load((ROLE / "meta" / "main.yml").read_text())["dependencies"] == []


class _ReloadRecorder(http.server.BaseHTTPRequestHandler):
    posts: list[str] = []

    def do_POST(self):                      # noqa: N802 - http.server's name
        type(self).posts.append(self.path)
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args):
        pass


def test_installed_from_the_role_tarball_alone_it_checks_renders_and_deploys_monitoring(ansible_bin, tmp_path):
    """packaging/build-role.sh's tarball, installed by `ansible-galaxy role install` into an empty
    roles path, is all a controller needs besides the wheel: the playbooks pass --syntax-check,
    the templates render a config ckptgw accepts, and `tasks_from: monitoring` installs the alert
    rules and the dashboard from the installed copy, then reloads Prometheus (POST /-/reload) only
    when the rules changed, and does nothing when no Prometheus runs on the host."""
    out = subprocess.run(["bash", str(ANSIBLE_DIR.parent / "packaging" / "build-role.sh"), str(tmp_path / "dist")],
                         capture_output=True, text=True, check=True).stdout.strip()
    tarball = Path(out)
    assert tarball.name == f"ckptgw-role-{tomllib.loads((ANSIBLE_DIR.parent / 'pyproject.toml').read_text())['project']['version']}.tar.gz"
    site = tmp_path / "site"
    site.mkdir()
    (site / "requirements.yml").write_text(yaml.safe_dump([{"src": str(tarball), "name": "ckptgw"}]))
    (site / "ansible.cfg").write_text("[defaults]\nroles_path = roles\n")     # nothing of the checkout
    env = dict(ansible_env(ansible_bin), ANSIBLE_CONFIG=str(site / "ansible.cfg"))

    def ansible(*args: str, tool: str = "ansible-playbook") -> subprocess.CompletedProcess:
        return subprocess.run([str(ansible_bin / tool), *args], cwd=site, env=env, capture_output=True,
                              text=True, timeout=300, stdin=subprocess.DEVNULL)

    proc = ansible("role", "install", "-r", "requirements.yml", "-p", "roles", tool="ansible-galaxy")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    installed = site / "roles" / "ckptgw"
    assert sorted(p.name for p in (installed / "files").iterdir()) == ["ckptgw-alerts.yml", "ckptgw-dashboard.json"]
    assert (installed / "meta" / "main.yml").read_text() == (ROLE / "meta" / "main.yml").read_text()

    shutil.copy(ANSIBLE_DIR / "site.yml", site / "site.yml")
    (site / "monitoring.yml").write_text(yaml.safe_dump([{
        "name": "Alert rules and dashboard on a monitoring host", "hosts": "all", "gather_facts": False,
        "tasks": [{"name": "The role's monitoring tasks", "ansible.builtin.include_role":
                   {"name": "ckptgw", "tasks_from": "monitoring"}}]}]))
    for playbook in ("site.yml", "monitoring.yml"):
        proc = ansible("-i", "localhost,", "--syntax-check", playbook)
        assert proc.returncode == 0, proc.stdout + proc.stderr

    run = render(ansible_bin, tmp_path, ckptgw_admin_group="", ckptgw_role_dir=str(installed))
    assert run.returncode == 0, run.tail()
    assert check_config(tmp_path / "config.toml").returncode == 0

    server = http.server.HTTPServer(("127.0.0.1", 0), _ReloadRecorder)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    _ReloadRecorder.posts = []
    rules, boards = tmp_path / "rules.d", tmp_path / "dashboards"
    common = ["-i", "localhost,", "-c", "local", "monitoring.yml", "-e", json.dumps({
        "ansible_python_interpreter": str(ansible_bin / "python3"), "ckptgw_prometheus_rules_dir": str(rules),
        "ckptgw_grafana_dashboards_dir": str(boards)})]
    url = ["-e", f"ckptgw_prometheus_reload_url=http://127.0.0.1:{server.server_port}/-/reload"]
    try:
        first = ansible(*common, *url)
        assert first.returncode == 0, first.stdout + first.stderr
        assert (rules / "ckptgw-alerts.yml").read_bytes() == (ROLE / "files" / "ckptgw-alerts.yml").read_bytes()
        assert (boards / "ckptgw-dashboard.json").read_bytes() == (ROLE / "files" / "ckptgw-dashboard.json").read_bytes()
        assert _ReloadRecorder.posts == ["/-/reload"], first.stdout
        again = ansible(*common, *url)                        # nothing changed: no reload
        assert again.returncode == 0 and "changed=0" in again.stdout, again.stdout
        assert _ReloadRecorder.posts == ["/-/reload"]
    finally:
        server.shutdown()
    (rules / "ckptgw-alerts.yml").write_text("groups: []\n")     # a changed rule file, no Prometheus here
    for extra in ([], ["-e", "ckptgw_prometheus_reload_url=http://127.0.0.1:1/-/reload"]):
        proc = ansible(*common, "-e", "ckptgw_prometheus_service=ckptgw-test-no-such-prometheus", *extra)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert "RUNNING HANDLER [ckptgw : " in proc.stdout and "changed=1" in proc.stdout, proc.stdout
        (rules / "ckptgw-alerts.yml").write_text("groups: []\n")
    assert _ReloadRecorder.posts == ["/-/reload"]


def test_restart_only_for_what_ckptgw_cannot_reload(ansible_bin, tmp_path):
    """The role restarts when a setting in vars/main.yml's ckptgw_restart_settings changed and
    otherwise reloads (SIGHUP): that list is exactly what ckptgw's reload policy marks "restart"
    (of what the role writes to config.toml; the credentials are in the environment file, whose
    change restarts). owner_domain, which ckptgw re-reads with the exports, only reloads."""
    from appliance import config as cfg
    recorded = yaml.safe_load((ROLE / "vars" / "main.yml").read_text())["ckptgw_restart_settings"]
    role = {f"{section}.{key}" for section, keys in recorded.items() for key in keys}
    restart = {key for key, effects in cfg.reload_policy().items() if "restart" in effects}
    not_in_config = {"s3.access_key", "s3.secret_key", "s3.session_token", "admin.token"}
    assert role == restart - not_in_config, (sorted(role - restart), sorted(restart - not_in_config - role))
    assert "server.owner_domain" not in role and cfg.reload_policy()["server.owner_domain"] == ("exports",)

    before, after = tmp_path / "before", tmp_path / "after"
    for out, domain in ((before, ""), (after, "example.org")):
        out.mkdir()
        run = render(ansible_bin, out, ckptgw_admin_group="", ckptgw_owner_domain=domain)
        assert run.returncode == 0, run.tail()
    assert (before / "restart-settings.json").read_text() == (after / "restart-settings.json").read_text()
    assert 'owner_domain = "example.org"' in (after / "config.toml").read_text()
    handlers = yaml.safe_load((ROLE / "handlers" / "main.yml").read_text())
    config_task = next(t for t in yaml.safe_load((ROLE / "tasks" / "config.yml").read_text())
                       if t.get("ansible.builtin.template", {}).get("src") == "config.toml.j2")
    restart_record = next(t for t in yaml.safe_load((ROLE / "tasks" / "config.yml").read_text())
                          if ".restart-settings.json" in str(t.get("ansible.builtin.copy", {}).get("dest")))
    assert config_task["notify"] == "Reload ckptgw" and restart_record["notify"] == "Restart ckptgw"
    assert {h["name"] for h in handlers} >= {"Reload ckptgw", "Restart ckptgw"}


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


# Pair mode (issue 38) as tests/ha deploys it: two nodes on the pair's segment, SBD on a shared disk.
PAIR_VARS = {
    "ckptgw_pair_enabled": True,
    "ckptgw_pair_nodes": [{"name": "gw-a", "address": "192.168.38.1"}, {"name": "gw-b", "address": "192.168.38.2"}],
    "ckptgw_pair_drbd_disk": "/dev/vdb", "ckptgw_pair_drbd_device": "/dev/drbd0",
    "ckptgw_pair_floating_ip": "192.168.38.100", "ckptgw_pair_floating_nic": "eth1",
    "ckptgw_pair_sbd_device": "/dev/vdc", "ckptgw_pair_corosync_token": 10000, "ckptgw_pair_stonith_timeout": "90s",
    "ckptgw_pair_priority_fencing_delay": 25,
    "ckptgw_s3_endpoint": "http://10.0.2.100:9000",      # S3 outside the pair (tasks/assert.yml)
}


def uncommented(text: str) -> str:
    return "".join(line for line in text.splitlines(keepends=True) if not line.startswith("#"))


def test_pair_templates_render_what_the_ha_tests_proved(ansible_bin, tmp_path):
    """The DRBD resource and corosync.conf the role writes in pair mode are, line for line, the ones
    tests/ha's harness (drbd.py, cluster.py) wrote when the failover was first proven by hand; the
    CIB has fencing, the promotable DRBD clone and the group, colocated with and ordered after the
    promotion, first promoted on the first node; config.toml names the DRBD device."""
    sys.path.insert(0, str(HERE.parent / "ha"))
    import cluster
    import drbd
    run = render(ansible_bin, tmp_path, ckptgw_admin_group="", **PAIR_VARS)
    assert run.returncode == 0, run.tail()
    nodes = ("gw-a", "gw-b")
    assert uncommented((tmp_path / "drbd.res").read_text()) == drbd.resource_file(nodes, cluster=True)
    assert uncommented((tmp_path / "corosync.conf").read_text()) == cluster.corosync_conf(nodes)
    crm = uncommented((tmp_path / "pair.crm").read_text())
    for line in ["property stonith-enabled=true stonith-timeout=90s priority-fencing-delay=25s\n",
                 "primitive fence-sbd stonith:fence_sbd \\\n    params devices=/dev/vdc \\",
                 "primitive drbd-r0 ocf:linbit:drbd \\\n    params drbd_resource=r0 \\",
                 "clone drbd-clone drbd-r0 \\\n    meta promotable=true promoted-max=1",
                 "params device=/dev/drbd0 directory=/var/lib/ckptgw/cache fstype=ext4 options=noatime \\",
                 "params ip=192.168.38.100 cidr_netmask=24 nic=eth1 \\",
                 "primitive gateway systemd:ckptgw \\",
                 "group gw cache-fs gw-ip gateway \\\n    meta priority=10\n",
                 "colocation gw-on-primary inf: gw drbd-clone:Master\n",
                 "order gw-after-promote Mandatory: drbd-clone:promote gw:start\n",
                 "location first-promotion drbd-clone rule $role=Master 50: #uname eq gw-a\n"]:
        assert line in crm, f"{line!r} not in\n{crm}"
    # the volume's I/O is frozen while a lost peer is fenced: the watchdog outwaits the stonith timeout
    unit = (tmp_path / "ckptgw.service").read_text()
    assert "WatchdogSec=120s\n" in unit
    # status reads DRBD's fence constraints from the CIB (cibadmin): Pacemaker lets haclient only
    assert "\nSupplementaryGroups=haclient\n" in unit
    config = tomllib.loads((tmp_path / "config.toml").read_text())
    assert config["pair"] == {"drbd_device": "/dev/drbd0"}
    assert check_config(tmp_path / "config.toml").returncode == 0


def test_pair_with_a_fence_agent_instead_of_sbd_and_corosync_crypto(ansible_bin, tmp_path):
    fence = ("primitive fence-gw-a stonith:fence_ipmilan params ip=10.0.0.11 username=admin password=x "
             "pcmk_host_list=gw-a\nlocation fence-gw-a-not-on-a fence-gw-a -inf: gw-a")
    run = render(ansible_bin, tmp_path, ckptgw_admin_group="",
                 **dict(PAIR_VARS, ckptgw_pair_sbd_device="", ckptgw_pair_stonith_resources=fence,
                        ckptgw_pair_floating_nic="", ckptgw_pair_corosync_authkey="k" * 128))
    assert run.returncode == 0, run.tail()
    crm = (tmp_path / "pair.crm").read_text()
    assert fence in crm and "fence_sbd" not in crm and " nic=" not in crm
    corosync = (tmp_path / "corosync.conf").read_text()
    assert "crypto_cipher: aes256" in corosync and "crypto_hash: sha256" in corosync
    assert "k" * 128 not in run.output


def test_pair_nodes_reordered_on_a_running_pair_fail_naming_the_ids(ansible_bin, tmp_path):
    """The role numbers Corosync's nodes by their place in ckptgw_pair_nodes: on a running pair a
    new order would renumber them, and a node whose id changes never rejoins (tests/ha's failback
    saw both become node 2). The same order passes; another fails before anything is written."""
    sys.path.insert(0, str(HERE.parent / "ha"))
    import cluster
    running = cluster.corosync_conf(("gw-a", "gw-b"))
    (tmp_path / "same").mkdir()
    (tmp_path / "swapped").mkdir()
    same = render(ansible_bin, tmp_path / "same", ckptgw_admin_group="", ckptgw_pair_corosync_conf_now=running,
                  **PAIR_VARS)
    assert same.returncode == 0, same.tail()
    swapped = render(ansible_bin, tmp_path / "swapped", ckptgw_admin_group="", ckptgw_pair_corosync_conf_now=running,
                     **dict(PAIR_VARS, ckptgw_pair_nodes=PAIR_VARS["ckptgw_pair_nodes"][::-1]))
    assert swapped.returncode != 0, swapped.tail()
    assert "gw-a is node 1, would be 2" in swapped.output and "gw-b is node 2, would be 1" in swapped.output, \
        swapped.tail()


def test_pair_node_without_an_address_fails_naming_it(ansible_bin, tmp_path):
    run = render(ansible_bin, tmp_path, **dict(PAIR_VARS, ckptgw_pair_nodes=[{"name": "gw-a"}, {"name": "gw-b"}]))
    assert run.returncode != 0 and "address" in run.output, run.tail()
