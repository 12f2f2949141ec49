"""The CPU share a sandbox is given, where no cgroup file shows its quota (gVisor).

Run by `doctor` as a job of its own, with room in memory for its processes (under a
128 MiB limit gVisor's reclaim slowed eight forks of Python to half their pace).
"""
import json
import os
import time

# The CPU share is measured by the progress of busy loops, not by the CPU time the kernel
# reports: under gVisor (ptrace platform) a task is charged for the time its host thread was
# meant to run, throttled or not, so getrusage() showed 0.84 cores and more under a
# 0.5-core quota that the host's cgroup did enforce (its cpuacct showed 0.50). A loop that
# reads the clock only advances while its thread really runs: a step of less than
# BURN_STEP is time it ran, a longer one is time it waited (throttled, or preempted by
# other load). BURN_PROCS loops ask for far more than any quota this check uses: without a
# quota they get more than a core on a two-core host unless it is saturated.
BURN_PROCS = 12
# Forking Python under gVisor takes tens of milliseconds each: the loops start together
# once all are made, and only the window after that is measured.
BURN_SETTLE = 0.8
BURN_WALL = 2.0
BURN_STEP = 0.001


def busy_loop(start, until):
    time.sleep(max(0.0, start - time.monotonic()))
    last = time.monotonic()
    ran = 0.0
    while last < until:
        now = time.monotonic()
        if now - last < BURN_STEP:
            ran += now - last
        last = now
    return ran


def burn():
    r, w = os.pipe()
    start = time.monotonic() + BURN_SETTLE
    pids = []
    for _ in range(BURN_PROCS):
        pid = os.fork()
        if pid == 0:
            os.close(r)
            os.write(w, ("%f\n" % busy_loop(start, start + BURN_WALL)).encode())
            os._exit(0)
        pids.append(pid)
    os.close(w)
    for pid in pids:
        os.waitpid(pid, 0)
    with os.fdopen(r) as f:
        ran = [float(x) for x in f.read().split()]
    return {"ran_s": sum(ran), "wall_s": BURN_WALL, "procs": len(ran)}


print(json.dumps(burn()))
