"""Deploy with ansible/site.yml to a real Debian 12 host (qemu, software emulation) over SSH.

One VM for the module, the tests run in order against it:
  first run (fresh host) -> service active, NFS mount from the guest's own kernel client works
  -> second run changes nothing, and (at the same time) --check --diff previews a config change
     without applying it
  -> the applied config change reloads the service (same PID, a reload in the journal)
  -> the unit under systemd: a bad config ends `failed` with exit 78 and no restart, a good one
     (without cache_dir: $STATE_DIRECTORY/cache) runs with the watchdog fed, pinned versions installed.
Meanwhile a second VM from the same image, another fresh host, gets --check --diff: it previews the
install and touches nothing (run in a thread beside the first run: the two would otherwise take turns
on an idle CPU).
The guest has no network but its forwarded SSH port: ckptgw is installed from the wheel of
this checkout (packaging/build-dist.sh) plus the image's wheelhouse (the role's offline path).
"""
from __future__ import annotations

import json
import shlex
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml

from guestimage import DEPLOY_USER, GUEST_WHEELHOUSE, REPO
from guestvm import GuestVM
from playbook import report, run_playbook
from testkit.logjson import json_lines

pytestmark = [pytest.mark.ansible, pytest.mark.slow]

HOST = "testgw"
SECRET_KEY = "test-secret-must-never-be-printed-0123456789"


def inventory(path: Path, vm: GuestVM, dist: Path) -> Path:
    hosts = {"ckptgw_gateways": {"hosts": {HOST: {
        "ansible_host": "127.0.0.1",
        "ansible_port": vm.ssh_port,
        "ansible_user": DEPLOY_USER,
        "ansible_ssh_private_key_file": str(vm.image.ssh_key),
        "ansible_ssh_common_args": "-o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null",
        "ansible_python_interpreter": "/usr/bin/python3",
        # the test's choices, as an inventory would make them
        # the role's default install: the wheel in ckptgw_dist_dir (packaging/build-dist.sh), pinned;
        # the pins are the guest wheelhouse's versions (it has no index to resolve build-dist's)
        "ckptgw_dist_dir": str(dist),
        "ckptgw_constraints": str(vm.image.constraints),
        "ckptgw_extras": ["tryout"],
        "ckptgw_wheelhouse": GUEST_WHEELHOUSE,
        "ckptgw_cache_device": "/dev/vdb",
        "ckptgw_s3_endpoint": "",                     # embedded S3: the guest has no network
        "ckptgw_s3_access_key": "AKIDTESTGATEWAY",
        "ckptgw_s3_secret_key": SECRET_KEY,
        "ckptgw_exports": [{"path": "/checkpoints", "networks": ["127.0.0.0/8"], "access": "rw",
                            "squash": "none"}],
        "ckptgw_log_level": "info",
        "ckptgw_prometheus_rules_dir": "/etc/prometheus/rules.d",      # monitoring, asked for
        "ckptgw_grafana_dashboards_dir": "/var/lib/grafana/dashboards",
    }}}}
    path.write_text(yaml.safe_dump(hosts))
    return path


def service(vm: GuestVM, prop: str) -> str:
    return vm.ssh(f"sudo systemctl show --property={prop} --value ckptgw.service").stdout.strip()


@pytest.fixture(scope="module")
def vm(guest_image):
    machine = GuestVM(guest_image, smp=2, mem_mib=2048)
    with machine:
        report(f"VM boot to SSH: {machine.boot_seconds:.0f}s (qemu TCG, 2 vCPU, 2 GiB)")
        yield machine


def playbook_runner(vm: GuestVM, ansible_bin: Path, dist: Path, inventory_dir: Path):
    """Runs the playbook against `vm`, returning the PlaybookRun; keyword args become -e variables."""
    inv = inventory(inventory_dir / "hosts.yml", vm, dist)

    def run(label: str, *args: str, **extra):
        if extra:
            args = (*args, "-e", json.dumps(extra))
        result = run_playbook(ansible_bin, inv, *args)
        report(f"{label}: {result.seconds:.0f}s, exit {result.returncode}")
        for line in result.recap_lines:
            report(f"  {line}")
        assert SECRET_KEY not in result.output, f"{label}: the S3 secret was printed"
        return result

    return run


@pytest.fixture(scope="module")
def deploy(vm, ansible_bin, ckptgw_dist, tmp_path_factory):
    return playbook_runner(vm, ansible_bin, ckptgw_dist, tmp_path_factory.mktemp("inventory"))


@pytest.fixture(scope="module")
def first_run(deploy):
    return deploy("first run (fresh host)", "--diff")


def host_state(vm: GuestVM) -> str:
    """What a deployment would change on the host: the role's paths, accounts, units and the cache disk."""
    script = ("for p in /etc/ckptgw /opt/ckptgw /var/lib/ckptgw /etc/systemd/system/ckptgw.service; do"
              " if sudo test -e $p; then echo \"exists $p\"; fi; done;"
              " getent passwd ckptgw || true; getent group ckptgw || true;"
              " echo \"vdb: $(sudo blkid --probe --output export /dev/vdb | tr '\\n' ' ')\";"
              " systemctl list-unit-files --no-legend 'ckptgw*' 'var-lib-ckptgw*' || true")
    return vm.ssh(script).stdout


@pytest.fixture(scope="module")
def fresh_check(guest_image, ansible_bin, ckptgw_dist, tmp_path_factory):
    """--check --diff on a fresh host, with the host's state before and after: a second VM from
    the same image, in a thread, so that it runs while the first run deploys the module's VM (the
    first test asks for both). A Future of (PlaybookRun, state before, state after)."""
    inventory_dir = tmp_path_factory.mktemp("inventory-fresh")

    def check():
        with GuestVM(guest_image, smp=2, mem_mib=1024) as fresh:
            report(f"fresh VM for --check, boot to SSH: {fresh.boot_seconds:.0f}s (qemu TCG, 2 vCPU, 1 GiB)")
            before = host_state(fresh)
            run = playbook_runner(fresh, ansible_bin, ckptgw_dist, inventory_dir)(
                "--check --diff on the fresh host", "--check", "--diff")
            return run, before, host_state(fresh)

    with ThreadPoolExecutor(max_workers=1) as pool:
        yield pool.submit(check)


def journal(vm: GuestVM, lines: int = 60) -> str:
    return vm.ssh(f"sudo journalctl --no-pager -u ckptgw.service -n {lines}", check=False).stdout


def journal_events(vm: GuestVM) -> list[dict]:
    """The service's structured log records in its journal (JSON lines: [log] format auto, no TTY)."""
    return json_lines(vm.ssh("sudo journalctl --no-pager -o cat -u ckptgw.service", check=False).stdout)


def test_check_mode_on_a_fresh_host_previews_and_changes_nothing(fresh_check, first_run):
    run, before, after = fresh_check.result()
    assert run.returncode == 0, run.tail()
    recap = run.recap(HOST)
    assert recap["failed"] == 0 and recap["changed"] > 0, run.tail()
    # the preview names what the first run would do: the unit file and the config with its contents
    assert "+[Service]" in run.output and "+[server]" in run.output, run.tail()
    assert before == after, f"--check changed the host:\n--- before\n{before}\n--- after\n{after}"
    assert "exists" not in after and "ckptgw:" not in after and "TYPE=" not in after, after


def test_first_run_deploys_an_active_service(vm, first_run):
    assert first_run.returncode == 0, first_run.tail() + "\n--- journal of ckptgw.service\n" + journal(vm)
    recap = first_run.recap(HOST)
    assert recap["failed"] == 0 and recap["unreachable"] == 0 and recap["changed"] > 0
    assert vm.ssh("sudo systemctl is-active ckptgw.service", check=False).stdout.strip() == "active", journal(vm)
    assert vm.ssh("sudo systemctl is-enabled ckptgw.service").stdout.strip() == "enabled"
    assert service(vm, "User") == "ckptgw"
    # the platform wheel's compiled engine, installed as built (the guest has no compiler) and running
    listening = [e for e in journal_events(vm) if e.get("event") == "nfsd_listening"]
    assert listening and all(e.get("rpc_engine") == "native" for e in listening), listening or journal(vm)
    native = vm.ssh("command -v cc || command -v gcc || echo no-compiler; cd /opt/ckptgw/venv &&"
                    " ls lib/python3*/site-packages/nfsd/native && bin/python -c 'import nfsd.native.rpc, nfsd.native.xdr_nfs4'",
                    check=False)
    assert native.returncode == 0 and "no-compiler" in native.stdout, native.stdout + native.stderr
    assert "rpc.cpython-311-x86_64-linux-gnu.so" in native.stdout, native.stdout
    report(f"guest: nfsd_listening rpc_engine={listening[-1].get('rpc_engine')} "
           f"event_loop={listening[-1].get('event_loop')}; " + " ".join(native.stdout.split()[1:]))
    pid = service(vm, "MainPID")
    assert vm.ssh(f"ps -o user= -p {pid}").stdout.strip() == "ckptgw"
    # the cache lives on the disk the inventory named, mounted by UUID
    assert vm.ssh("sudo findmnt --noheadings --output SOURCE --target /var/lib/ckptgw/cache").stdout.strip() == "/dev/vdb"
    assert vm.ssh("sudo stat -c '%U:%G %a' /var/lib/ckptgw/cache").stdout.strip() == "ckptgw:ckptgw 750"
    # credentials: root-only environment file, not in the config
    assert vm.ssh("sudo stat -c '%U %a' /etc/ckptgw/ckptgw.env").stdout.strip() == "root 600"
    assert SECRET_KEY not in vm.ssh("sudo cat /etc/ckptgw/config.toml").stdout
    assert vm.ssh("sudo /opt/ckptgw/venv/bin/ckptgw check-config /etc/ckptgw/config.toml").returncode == 0
    # the alert rules and the dashboard, asked for by the inventory, from the role's files/; the
    # Prometheus reload they notify does nothing on this host, which runs no Prometheus
    rules = vm.ssh("cat /etc/prometheus/rules.d/ckptgw-alerts.yml").stdout
    assert rules == (REPO / "ansible/roles/ckptgw/files/ckptgw-alerts.yml").read_text()
    lines = first_run.output.splitlines()
    assert any(line.startswith("RUNNING HANDLER [ckptgw : Look for a running Prometheus]") for line in lines)
    reload_at = [i for i, line in enumerate(lines) if line.startswith("RUNNING HANDLER [ckptgw : Reload Prometheus through systemd]")]
    assert len(reload_at) == 1 and lines[reload_at[0] + 1].startswith("skipping:"), first_run.tail()
    board = vm.ssh("cat /var/lib/grafana/dashboards/ckptgw-dashboard.json").stdout
    assert json.loads(board)["uid"] == "ckptgw-overview"


def test_guest_kernel_nfs_client_writes_and_reads(vm, first_run):
    assert first_run.returncode == 0
    script = (
        "set -e; sudo mkdir -p /mnt/ckpt;"
        " sudo mount -t nfs4 -o vers=4.1 127.0.0.1:/checkpoints /mnt/ckpt;"
        " sudo dd if=/dev/urandom of=/tmp/payload bs=1M count=4 status=none;"
        " sudo cp /tmp/payload /mnt/ckpt/step-1.pt; sync;"
        " sudo umount /mnt/ckpt; sudo mount -t nfs4 -o vers=4.1 127.0.0.1:/checkpoints /mnt/ckpt;"
        " cmp /tmp/payload /mnt/ckpt/step-1.pt; ls -l /mnt/ckpt; sudo umount /mnt/ckpt")
    proc = vm.ssh(script, check=False, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "step-1.pt" in proc.stdout


@pytest.fixture(scope="module")
def second_run_and_check(vm, deploy, first_run):
    """The second run (the same variables) and --check --diff with ckptgw_log_level=debug, both
    against the deployed VM and at the same time (each mostly waits on one emulated CPU): neither
    may change the host, and the tests below check that of each. (PID before, second run, check
    run, PID after)."""
    assert first_run.returncode == 0
    pid = service(vm, "MainPID")
    with ThreadPoolExecutor(max_workers=1) as pool:
        check = pool.submit(deploy, "--check --diff with ckptgw_log_level=debug", "--check", "--diff",
                            ckptgw_log_level="debug")
        second = deploy("second run (idempotence)")
        check = check.result()
    return pid, second, check, service(vm, "MainPID")


def test_second_run_changes_nothing(second_run_and_check):
    pid, second, _, pid_after = second_run_and_check
    assert second.returncode == 0, second.tail()
    assert second.recap(HOST)["changed"] == 0, second.tail()
    assert pid_after == pid


def test_check_diff_previews_a_change_without_applying_it(vm, second_run_and_check):
    pid, _, check, pid_after = second_run_and_check
    assert check.returncode == 0, check.tail()
    assert check.recap(HOST)["changed"] >= 1
    assert '+level = "debug"' in check.output and '-level = "info"' in check.output, check.tail()
    assert 'level = "info"' in vm.ssh("sudo cat /etc/ckptgw/config.toml").stdout
    assert pid_after == pid


def test_config_change_reloads_instead_of_restarting(vm, deploy, first_run):
    """The log level and the NFSv4 id-mapping domain: both applied by a reload (SIGHUP)."""
    assert first_run.returncode == 0
    pid = service(vm, "MainPID")
    restarts = service(vm, "NRestarts")
    since = vm.ssh("date +%s").stdout.strip()
    time.sleep(1)
    change = deploy("config change ckptgw_log_level=debug ckptgw_owner_domain=example.org",
                    ckptgw_log_level="debug", ckptgw_owner_domain="example.org")
    assert change.returncode == 0, change.tail()
    assert "RUNNING HANDLER [ckptgw : Reload ckptgw]" in change.output
    assert "RUNNING HANDLER [ckptgw : Restart ckptgw]" not in change.output
    config = vm.ssh("sudo cat /etc/ckptgw/config.toml").stdout
    assert 'level = "debug"' in config and 'owner_domain = "example.org"' in config, config
    status = json.loads(vm.ssh("sudo /opt/ckptgw/venv/bin/ckptgw status --json").stdout)
    assert status["nfs"]["owner_domain"] == "example.org", status["nfs"]
    assert service(vm, "MainPID") == pid, "the daemon was restarted"
    assert service(vm, "NRestarts") == restarts
    assert vm.ssh("sudo systemctl is-active ckptgw.service").stdout.strip() == "active"
    journal = vm.ssh(f"sudo journalctl --no-pager -o cat -u ckptgw.service --since @{since}").stdout
    assert "Reloading" in journal and "Reloaded" in journal, journal[-3000:]
    assert "Stopping" not in journal and "Started" not in journal, journal[-3000:]
    report(f"reload: PID {pid} kept; journal: "
           + " | ".join(line for line in journal.splitlines() if "Reload" in line or "reload" in line)[:300])


BAD_CONFIG = "[server]\nhigh_watermark = 7\n"
# No cache_dir: under the unit it defaults to $STATE_DIRECTORY/cache = /var/lib/ckptgw/cache.
MINIMAL_CONFIG = ('[server]\nlisten = "127.0.0.1:2049"\n\n[[exports]]\npath = "/checkpoints"\n'
                  'networks = ["127.0.0.0/8"]\naccess = "rw"\nsquash = "none"\n')


def put_config(vm: GuestVM, text: str) -> None:
    vm.ssh(f"printf %s {shlex.quote(text)} | sudo tee /etc/ckptgw/config.toml >/dev/null")


def test_unit_bad_config_fails_without_a_restart_loop_good_config_runs_watched(vm, first_run):
    assert first_run.returncode == 0
    vm.ssh("sudo cp -p /etc/ckptgw/config.toml /etc/ckptgw/config.toml.role")
    try:
        put_config(vm, BAD_CONFIG)
        since = vm.ssh("date +%s").stdout.strip()
        time.sleep(1)
        start = vm.ssh("sudo systemctl restart ckptgw.service", check=False, timeout=300)
        assert start.returncode != 0, "a bad config started"
        time.sleep(15)                     # RestartSec=2s: a loop would have restarted several times
        state = {p: service(vm, p) for p in ("ActiveState", "Result", "ExecMainStatus", "NRestarts")}
        log = vm.ssh(f"sudo journalctl --no-pager -o cat -u ckptgw.service --since @{since}").stdout
        assert state == {"ActiveState": "failed", "Result": "exit-code", "ExecMainStatus": "78",
                         "NRestarts": "0"}, f"{state}\n{log[-3000:]}"
        assert "high_watermark" in log and "Scheduled restart job" not in log, log[-3000:]
        assert log.count("Starting ckptgw") == 1, log[-3000:]
        report(f"bad config: {state}; " + " | ".join(line for line in log.splitlines() if "high_watermark" in line)[:200])

        put_config(vm, MINIMAL_CONFIG)
        vm.ssh("sudo systemctl restart ckptgw.service", timeout=300)
        assert vm.ssh("sudo systemctl is-active ckptgw.service", check=False).stdout.strip() == "active", journal(vm)
        assert service(vm, "WatchdogUSec") == "30s"
        first = service(vm, "WatchdogTimestampMonotonic")
        time.sleep(5)
        assert int(service(vm, "WatchdogTimestampMonotonic")) > int(first) > 0, "the watchdog is not fed"
        assert service(vm, "NRestarts") == "0"
        status = json.loads(vm.ssh("sudo /opt/ckptgw/venv/bin/ckptgw status --json").stdout)
        assert status["cache"]["dir"] == "/var/lib/ckptgw/cache", status["cache"]
        # pinned: exactly the constraints' versions, and ckptgw the wheel's
        frozen = vm.ssh("/opt/ckptgw/venv/bin/python -m pip freeze --all").stdout
        pins = dict(line.split("==") for line in vm.image.constraints.read_text().split() if "==" in line)
        for line in frozen.split():
            if "==" in line:
                name, version = line.split("==")
                norm = name.lower().replace("_", "-").replace(".", "-")
                if norm in pins:
                    assert version == pins[norm], f"{name} {version}, pinned {pins[norm]}"
        assert "moto==" in frozen                 # ckptgw_extras: [tryout]
        assert vm.ssh("/opt/ckptgw/venv/bin/python -c \"import importlib.metadata as m; print(m.version('ckptgw'))\""
                      ).stdout.strip() == "0.1.0"
    finally:
        vm.ssh("sudo cp -p /etc/ckptgw/config.toml.role /etc/ckptgw/config.toml && "
               "sudo systemctl restart ckptgw.service", check=False, timeout=300)
