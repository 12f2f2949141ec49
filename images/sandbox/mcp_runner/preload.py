"""Preloading: the user's interpreter of a pool sandbox imports a list of modules before
the runner says `R`, so that the request path is dispatch plus the user's own code.

The server names the modules in the container's environment (`MCPX_PRELOAD`, comma
separated, dotted names allowed; `MCPX_PRELOAD_MEMORY`, the percent of the sandbox's memory
limit the preloaded interpreter may hold), which the runner takes out of its environment
before anything else starts: the user's code never sees them. Cold sandboxes get neither
and preload nothing (a cold run must not wait for imports it did not ask for).

In the child, before it waits on fd 3 (see `stubs`): the figures set-up runs first (so a
preloaded `matplotlib.pyplot` selects the sandbox backend exactly as the user's import
would), then each module is imported in order. A module the environment lacks
(`ModuleNotFoundError` of the module itself) is skipped: nothing of it is left in
`sys.modules`. After each import the sandbox's memory is read; past the budget the child
stops and says so. It then writes one line on fd 4:

    P <cpu_ms> <loaded,..> <missing,..> <stopped_at or ->

and waits for its job. The runner reads that line before it says `R`. When an import
failed otherwise (an exception at import time) or went over the budget, the interpreter
may hold half of a module: it is discarded and started again with only the modules that
imported cleanly and fit, and the rest is reported as dropped.

Each sandbox imports its modules itself (no fork of a preloaded interpreter), so module
state seeded at import (numpy's global random state, `random`, hash seeds) differs from
sandbox to sandbox as it would without preloading.

While a one-shot run's code runs, the runner reads its file as the job sent it (the source,
not the interpreter's state, which the code controls) for the modules it imports, up to two levels deep
(`scipy.stats`, `sklearn.linear_model`: importing a package's top level often imports
little), and keeps those the environment's package directories hold (as the interpreter
listed them before the user's code ran; the standard library, the workspace and /tmp are
not among them). It adds them to the report (`imported`), with the preload's figures
(`preload`): the server learns from them (see `src/backend/preload.rs`).
"""

# `ast` (with `contextlib`) is imported here, while the sandbox waits, not by
# `imports_of` after the run: loading it took 3 ms on a quiet machine and up to 50 ms on a
# loaded one, between the code's last output and the report (traced with strace).
import ast
import os
import re
import select
import time

from mcp_runner import cgroup, stubs
from mcp_runner.child import Child

NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}(\.[A-Za-z_][A-Za-z0-9_]{0,63}){0,7}$")
# Modules named, and imported modules reported, at most.
MAX_MODULES = 32
# Source bytes of the entry file read for its imports, at most.
MAX_SOURCE = 1 << 20
# Seconds the runner waits for the preload line: below the server's 30 s for a sandbox to
# become ready. Past it the interpreter is started again without the list, which is not
# dropped (a loaded machine is no reason to give a module up for good).
PRELOAD_DEADLINE = 20.0

# Runs in the child interpreter, between the figures set-up and the stub's own code. Names
# it defines are cleared with `__main__` before the user's code runs.
PRELOAD_CODE = r"""
def _mcp_preload(figures, names, budget):
    save = figures()
    import os, sys, time
    cpu0 = time.process_time()
    def used():
        for path, keys in (('/sys/fs/cgroup/memory/memory.stat', ('total_rss', 'total_mapped_file')),
                           ('/sys/fs/cgroup/memory.stat', ('anon', 'file_mapped'))):
            try:
                with open(path) as f:
                    vals = dict(l.split()[:2] for l in f if l.strip())
                return sum(int(vals[k]) for k in keys)
            except (OSError, KeyError, ValueError):
                pass
        return None
    loaded, missing, stopped = [], [], '-'
    for name in names:
        try:
            __import__(name)
            loaded.append(name)
            if name == 'pandas':
                try:
                    # Its first frame operation loads what the import leaves for later
                    # (some 1 ms of the user's first call otherwise); nothing of it stays.
                    import pandas
                    pandas.DataFrame({'a': [1, 2]}).sum()
                except Exception:
                    pass
            if name == 'matplotlib.pyplot':
                try:
                    # Warm pyplot's own path (figure manager, axes, renderer, fonts, the
                    # PNG writer) as the user's first figure takes it, into memory only,
                    # and close it: pyplot numbers figures from the highest open one, so
                    # with none left open the user's first is still figure 1, and the
                    # sandbox backend's count of saved figures is untouched.
                    import io
                    import matplotlib.pyplot as plt
                    import mcp_backend
                    plt.plot([1, 2, 3])
                    plt.savefig(io.BytesIO(), format='png')
                    plt.close('all')
                except Exception:
                    pass
        except ModuleNotFoundError as e:
            if e.name is not None and (e.name == name or name.startswith(e.name + '.')):
                missing.append(name)
            else:
                stopped = name
                break
        except BaseException:
            stopped = name
            break
        if budget:
            u = used()
            if u is not None and u > budget:
                stopped = name
                break
    cpu_ms = int((time.process_time() - cpu0) * 1000)
    try:
        sites = '\x1f'.join(p for p in sys.path if p.endswith('-packages'))
        os.write(4, ('P %d %s %s %s\nS %s\n' % (cpu_ms, ','.join(loaded) or '-', ','.join(missing) or '-', stopped, sites)).encode())
    except OSError:
        pass
    return lambda: save
_mcp_figures = _mcp_preload(_mcp_figures, __NAMES__, __BUDGET__)
"""


def wanted():
    """The modules to preload and the memory percent, taken out of the environment."""
    raw = os.environ.pop("MCPX_PRELOAD", "")
    percent = os.environ.pop("MCPX_PRELOAD_MEMORY", "")
    names = []
    for n in raw.split(","):
        n = n.strip()
        if n and NAME.match(n) and n not in names and len(names) < MAX_MODULES:
            names.append(n)
    try:
        percent = max(0, min(100, int(percent)))
    except ValueError:
        percent = 50
    return names, percent


def budget_bytes(percent):
    limit = cgroup.read_int("/sys/fs/cgroup/memory/memory.limit_in_bytes")
    if limit is None:
        limit = cgroup.read_int("/sys/fs/cgroup/memory.max")
    if limit is None or limit >= 1 << 60:
        return 0
    return limit * percent // 100


def stub_for(base, names, budget):
    """The child's code: the figures set-up, the preload, then `base`'s own code."""
    code = (
        PRELOAD_CODE.replace("__NAMES__", repr(list(names)))
        .replace("__BUDGET__", str(int(budget)))
    )
    # `base` is FIGURES_CODE + the stub's code: the preload goes between them.
    assert base.startswith(stubs.FIGURES_CODE)
    return stubs.FIGURES_CODE + code + base[len(stubs.FIGURES_CODE) :]


def read_lines(fd, deadline):
    """The preload's two lines (`P`, `S`) from `fd` within `deadline` seconds: (P line,
    directories); "late" past the deadline; None when the interpreter died first (EOF) or
    said something else."""
    buf = b""
    end = time.monotonic() + deadline
    while buf.count(b"\n") < 2 and len(buf) < 65536:
        left = end - time.monotonic()
        if left <= 0:
            return "late"
        r, _, _ = select.select([fd], [], [], left)
        if not r:
            return "late"
        try:
            c = os.read(fd, 65536 - len(buf))
        except OSError:
            return None
        if not c:
            return None
        buf += c
    lines = buf.decode("utf-8", "replace").split("\n")
    if len(lines) < 2 or not lines[1].startswith("S "):
        return None
    return lines[0].strip(), [d for d in lines[1][2:].split("\x1f") if d.startswith("/")]


def names_of(field):
    return [] if field == "-" else [n for n in field.split(",") if NAME.match(n)]


class State:
    """What the preload of this sandbox did, for the report."""

    def __init__(self, names, percent):
        self.names = names
        self.percent = percent
        self.loaded = []
        self.missing = []
        self.dropped = []
        self.cpu_ms = 0
        self.memory_bytes = None
        self.ready_cpu_ms = None
        self.ready_memory_bytes = None
        # The child's CPU when its preload was done, and what it used after that while it
        # waited (numpy's BLAS threads spin for a while after the import): neither is the
        # run's.
        self.done_cpu_ns = None
        self.waiting_cpu_ms = 0
        # The environment's package directories, as the interpreter said before the
        # user's code ran: imported names are checked against them.
        self.site_dirs = []

    def fields(self):
        return {
            "loaded": self.loaded,
            "missing": self.missing,
            "dropped": self.dropped,
            "cpu_ms": self.cpu_ms,
            "memory_bytes": self.memory_bytes,
            "ready_cpu_ms": self.ready_cpu_ms,
            "ready_memory_bytes": self.ready_memory_bytes,
        }


def start(python, workdir, base, state):
    """Start the child with `base` as its stub and `state.names` preloaded; return it once
    the preload is done (restarted without what failed or did not fit)."""
    names = list(state.names)
    budget = budget_bytes(state.percent)
    for _attempt in range(2):
        child = Child(python, workdir, stub_for(base, names, budget))
        got = read_lines(child.st_r, PRELOAD_DEADLINE)
        if got == "late":
            child.discard()
            names = []
            break
        parts = got[0].split(" ") if got else []
        if len(parts) != 5 or parts[0] != "P":
            # The interpreter died while importing (the OOM killer) or hung: nothing of
            # the list is kept.
            child.discard()
            state.dropped += [n for n in names if n not in state.missing + state.dropped]
            state.loaded = []
            names = []
            continue
        try:
            state.cpu_ms = int(parts[1])
        except ValueError:
            state.cpu_ms = 0
        loaded, missing, stopped = names_of(parts[2]), names_of(parts[3]), parts[4]
        state.missing = sorted(set(state.missing) | set(missing))
        if stopped == "-":
            state.site_dirs = got[1]
            state.loaded = loaded
            state.memory_bytes = used_memory()
            state.done_cpu_ns = cpu_ns_of(child.pid)
            return child
        # Half-imported or over the budget: start clean with what went well.
        child.discard()
        keep = [n for n in loaded if n != stopped]
        state.dropped += [
            n for n in names if n not in keep and n not in state.missing + state.dropped
        ]
        state.loaded = []
        names = keep
    child = Child(python, workdir, stub_for(base, names, 0))
    got = read_lines(child.st_r, PRELOAD_DEADLINE)
    if not isinstance(got, tuple):
        got = None
    parts = got[0].split(" ") if got else []
    state.loaded = names_of(parts[2]) if len(parts) == 5 else []
    state.site_dirs = got[1] if got else []
    state.memory_bytes = used_memory()
    return child


def cpu_ns_of(pid):
    """CPU time of process `pid` so far, all its threads, in nanoseconds (`None` where
    /proc does not say)."""
    try:
        tids = os.listdir("/proc/%d/task" % pid)
    except OSError:
        return None
    total, seen = 0, False
    for tid in tids:
        try:
            with open("/proc/%d/task/%s/schedstat" % (pid, tid)) as f:
                total += int(f.read().split()[0])
                seen = True
        except (OSError, ValueError, IndexError):
            pass
    if seen:
        return total
    try:
        with open("/proc/%d/stat" % pid) as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) * 1000000000 // os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def dispatching(child, job):
    """Just before the job goes to a preloaded child: what it used while it waited."""
    state = getattr(job, "preload", None)
    # Only a preload's report uses it (`amend`): a plain sandbox reads nothing here.
    if state is None or not state.names or state.done_cpu_ns is None:
        return
    now = cpu_ns_of(child.pid)
    if now is not None and now >= state.done_cpu_ns:
        state.waiting_cpu_ms = (now - state.done_cpu_ns) // 1000000


def used_memory():
    v = cgroup.read_int("/sys/fs/cgroup/memory/memory.usage_in_bytes")
    return v if v is not None else cgroup.read_int("/sys/fs/cgroup/memory.current")


def mark_ready(state):
    """What the sandbox used by the time it is ready (the cost of a refill inside it)."""
    ns = cgroup.cpu_ns()
    state.ready_cpu_ms = ns // 1000000 if ns is not None else None
    state.ready_memory_bytes = used_memory()


def amend(report, child, job):
    """Add the preload's figures and the imported modules to a one-shot run's report, and
    take the preload's CPU, and what the child used while it waited, out of the run's
    `cpu_ms`."""
    state = getattr(job, "preload", None)
    if state is None:
        return
    report["preload"] = state.fields()
    if state.names:
        if report.get("cpu_ms") is not None:
            spent = state.cpu_ms + state.waiting_cpu_ms
            report["cpu_ms"] = max(0, report["cpu_ms"] - spent)
    if job.imported:
        report["imported"] = job.imported


def scan(job):
    """Read what the job's file imports (for `amend`): called while the code runs (the
    runner waits for its output then), not after it, where it cost a millisecond of the
    report's path under gVisor. The file as the job sent it (`job.source`, kept from the
    archive), before the code could change it."""
    state = getattr(job, "preload", None)
    if state is not None and job.source is not None:
        job.imported = imports_of(job.source, state.site_dirs)


def imports_of(src, dirs):
    """The modules the source `src` (bytes) imports (absolute `import a.b`, `from a.b
    import c`, `from a import b` when `a.b` is a module), up to two levels deep, that the
    environment's package directories hold; at most MAX_MODULES. Read from the source:
    what the user's code asks for, not what its interpreter claims."""
    if len(src) > MAX_SOURCE or b"import" not in src:
        return []  # nothing to parse for: parsing runs beside the code, on its CPU quota
    try:
        tree = ast.parse(src)
    except Exception:  # a syntax error, a deep nesting
        return []
    found = []

    def add(name):
        parts = name.split(".")[:2]
        if any(p.startswith("_") for p in parts):
            return
        name = ".".join(parts)
        if name not in found and installed(name, dirs):
            found.append(name)

    try:
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for a in node.names:
                    add(a.name)
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                top = node.module.split(".")
                if len(top) == 1:
                    for a in node.names:
                        if a.name != "*" and installed(node.module + "." + a.name, dirs):
                            add(node.module + "." + a.name)
                add(node.module)
            if len(found) >= MAX_MODULES:
                break
    except RecursionError:
        pass
    return found[:MAX_MODULES]


def installed(name, dirs):
    """Is there a module `name` (dotted: a package's submodule) in one of the environment's
    package directories? Nothing is imported: the files are looked for."""
    parts = name.split(".")
    for d in dirs:
        base = os.path.join(d, *parts[:-1])
        last = parts[-1]
        try:
            if os.path.isdir(os.path.join(base, last)) or os.path.isfile(
                os.path.join(base, last + ".py")
            ):
                return True
            if any(e.startswith(last + ".") and e.endswith(".so") for e in os.listdir(base)):
                return True
        except OSError:
            continue
    return False


def again(state):
    """The list for a second interpreter of the same sandbox (a session's): what was asked,
    less what was dropped."""
    return [n for n in state.names if n not in state.dropped]
