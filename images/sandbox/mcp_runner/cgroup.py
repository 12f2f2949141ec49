"""What the kernel says the sandbox used: the container's cgroup (v1 or v2) is the
whole sandbox, so these figures include everything the code started."""


# Files found missing once (cgroup v1's under v2 and the reverse; all of them under gVisor,
# which shows no cgroup files): not looked for again, each look is a system call on the
# report's path.
MISSING = set()


def read_int(path, prefix=None):
    if path in MISSING:
        return None
    try:
        with open(path) as f:
            for line in f:
                if prefix is None:
                    return int(line.strip())
                if line.startswith(prefix):
                    return int(line.split()[1])
    except FileNotFoundError:
        MISSING.add(path)
    except (OSError, ValueError, IndexError):
        pass
    return None


def look_once():
    """Read what a run's report reads, once while the sandbox is made: a file missing here
    then costs no run anything."""
    oom_kills()
    peak_memory()


def oom_kills():
    v1 = read_int("/sys/fs/cgroup/memory/memory.oom_control", "oom_kill ")
    if v1 is not None:
        return v1
    return read_int("/sys/fs/cgroup/memory.events", "oom_kill ")


def peak_memory():
    for path in ("/sys/fs/cgroup/memory/memory.max_usage_in_bytes", "/sys/fs/cgroup/memory.peak"):
        v = read_int(path)
        if v is not None:
            return v
    return None


def cpu_ns():
    """CPU time of the whole sandbox so far, nanoseconds."""
    v = read_int("/sys/fs/cgroup/cpuacct/cpuacct.usage")
    if v is None:
        v = read_int("/sys/fs/cgroup/cpu,cpuacct/cpuacct.usage")
    if v is None:
        usec = read_int("/sys/fs/cgroup/cpu.stat", "usage_usec ")
        v = usec * 1000 if usec is not None else None
    return v


def cpu_limit():
    """The sandbox's CPU quota in cores (1.5 for `--cpus 1.5`), or None where none is set
    or the cgroup files are not visible (gVisor)."""
    try:
        with open("/sys/fs/cgroup/cpu.max") as f:
            quota, period = f.read().split()[:2]
        if quota != "max":
            return int(quota) / int(period)
        return None
    except (OSError, ValueError):
        pass
    for d in ("/sys/fs/cgroup/cpu", "/sys/fs/cgroup/cpu,cpuacct"):
        quota = read_int(d + "/cpu.cfs_quota_us")
        period = read_int(d + "/cpu.cfs_period_us")
        if quota is not None and period:
            return quota / period if quota > 0 else None
    return None
