"""The report's "the host was loaded" flag: how much CPU processes other than the report and
its descendants used during the run (/proc/stat's process time minus ours), not the load
average, which the benchmark's own last scenarios push up at its end. Fake /proc numbers for
the arithmetic; on this host only that our own children's CPU is ours, live or reaped."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from bench.report import OTHERS_LOADED, cpu_sample, others_cpu  # noqa: E402

HZ = os.sysconf("SC_CLK_TCK")


def proc_stat(user, nice, system, idle=0, iowait=0, irq=0, softirq=0, steal=0, guest=0):
    """A /proc/stat with the given "cpu" line, in seconds."""
    cols = " ".join(str(int(s * HZ)) for s in (user, nice, system, idle, iowait, irq, softirq,
                                               steal, guest, 0))
    return f"cpu  {cols}\ncpu0 {cols}\nintr 12 3 4\nctxt 99\n"


def test_the_hosts_process_time_is_user_nice_system():
    _, host, ours = cpu_sample(proc_stat(100, 20, 30, idle=5000, iowait=40, irq=3, softirq=9,
                                         steal=6, guest=10), ours=7.5)
    # not idle or iowait; not interrupts (no process's) or steal; guest is inside user already
    assert host == pytest.approx(150.0)
    assert ours == 7.5


def test_not_proc_stat():
    with pytest.raises(ValueError):
        cpu_sample("intr 1 2 3\n", ours=0.0)


def test_a_quiet_run_whose_own_processes_kept_both_cpus_busy_is_not_loaded():
    # 600 s on 2 CPUs: the report, its gateways, moto and Ganesha ran 1100 s; others 30 s
    start = (1000.0, 5000.0, 10.0)
    end = (1600.0, 5000.0 + 1130.0, 10.0 + 1100.0)
    assert others_cpu(start, end) == pytest.approx(0.05)
    assert others_cpu(start, end) <= OTHERS_LOADED


def test_another_workload_beside_the_run_is_loaded():
    # the run used 600 s of its 600; something else used 360 s: 0.6 CPU on average
    start = (0.0, 100.0, 0.0)
    end = (600.0, 100.0 + 960.0, 600.0)
    assert others_cpu(start, end) == pytest.approx(0.6)
    assert others_cpu(start, end) > OTHERS_LOADED


def test_never_below_zero():
    # our processes' times and /proc/stat's are sampled apart: ours may come out a little higher
    assert others_cpu((0.0, 10.0, 0.0), (10.0, 19.9, 10.0)) == 0.0


BURN = """
import sys, time
while time.process_time() < 0.3:
    pass
print("burnt", flush=True)
time.sleep(60)
"""


def test_a_childs_cpu_is_ours_while_it_runs_and_after_it_is_reaped():
    t0, _, ours0 = cpu_sample()
    child = subprocess.Popen([sys.executable, "-c", BURN], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "burnt"
        _, _, live = cpu_sample()                # counted in its own /proc/<pid>/stat
    finally:
        child.kill()
        child.wait()
        child.stdout.close()
    t1, _, reaped = cpu_sample()                 # now in our cutime + cstime
    assert live - ours0 >= 0.25
    assert reaped >= live - 0.05                 # moved, not lost (tick rounding aside)
    assert t1 > t0
