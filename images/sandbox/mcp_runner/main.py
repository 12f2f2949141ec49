"""Start-up: become an unkillable, undumpable PID 1, start the user's interpreter, say
`R`, then read the job, unpack its files and run it once or serve it as a session."""

import os
import signal
import sys
import time

from mcp_runner import cgroup, figures, frames, netrelay, preload, run, session
from mcp_runner.job import read_job
from mcp_runner.stubs import REPL_STUB, STUB
from mcp_runner.workspace import WORKDIR, Refused, snapshot, unpack


def not_dumpable():
    """prctl(PR_SET_DUMPABLE, 0) through `_ctypes` alone: the `ctypes` package around it
    cost 7 ms more of every sandbox's start under gVisor (measured: 10-11 ms against 3-4)
    for one call. The whole package if that fails."""
    try:
        import _ctypes

        class Int(_ctypes._SimpleCData):
            _type_ = "i"

        class Function(_ctypes.CFuncPtr):
            _flags_ = _ctypes.FUNCFLAG_CDECL
            _restype_ = Int

        class Libc:
            _handle = _ctypes.dlopen(None, 0)

        prctl = Function(("prctl", Libc))
    except Exception:
        try:
            import ctypes

            prctl = ctypes.CDLL(None).prctl
        except Exception:
            return
    prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE = 4


def wait_for_job(limit):
    """Block until stdin has data; exit quietly if none comes within `limit` seconds (a
    pool container whose server is gone)."""
    if limit is None:
        return
    import select

    ready, _, _ = select.select([sys.stdin.buffer.fileno()], [], [], limit)
    if not ready:
        os._exit(0)


# The thread pools of numerical libraries size themselves by the host's cores, not by the
# sandbox's CPU quota: OpenBLAS starts one thread per core when numpy is imported. On a
# machine of many cores that is many threads fighting over one CPU's quota; here (2 cores,
# `--cpus 1`) it cost a quarter of the CPU of importing numpy and pandas (399 -> 296 ms)
# and a millisecond of the interpreter's exit. Sized to the quota unless the environment
# says otherwise.
THREAD_POOL_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMEXPR_NUM_THREADS")


def size_thread_pools():
    """Size them to the CPU limit the server gives (`MCPX_CPUS`, taken out of the
    environment), else to the cgroup's quota where it is visible (not under gVisor)."""
    try:
        cores = float(os.environ.pop("MCPX_CPUS"))
    except (KeyError, ValueError):
        cores = cgroup.cpu_limit()
    if cores is None or cores <= 0:
        return
    n = str(max(1, int(cores + 0.999)))
    for name in THREAD_POOL_VARS:
        os.environ.setdefault(name, n)


def wake_on_sigchld():
    """A pipe that becomes readable whenever a child exits, so that the select loops see
    an exit at once."""
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    return wake_r


def main():
    not_dumpable()
    # Files the job writes are made 0644 by this (see `workspace.unpack`), whatever the
    # container's default.
    os.umask(0o022)
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    # As PID 1 the runner only receives the signals it handles: Python's own SIGINT
    # handler would let the code interrupt it, so it goes.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    default_python = sys.argv[1] if len(sys.argv) > 1 else "/usr/bin/python3"
    try:
        wait_limit = float(os.environ.pop("MCPX_WAIT_LIMIT"))
    except (KeyError, ValueError):
        wait_limit = None
    names, percent = preload.wanted()
    state = preload.State(names, percent)
    size_thread_pools()
    figures.seed_matplotlib_cache()
    try:
        # The interpreter imports the preload list (if any) before the runner says `R`.
        child = preload.start(default_python, "/workspace", STUB, state)
    except OSError as e:
        frames.fail("could not start the interpreter: %s" % e)
    preload.mark_ready(state)
    # Set up now, not on the run's path (each a few system calls, slow under gVisor): the
    # workspace as the job will find it (files the code makes or changes are returned,
    # see `files_before`), the run's nonce (see `run.Done`).
    cgroup.look_once()
    wake_r = wake_on_sigchld()
    workspace_before = snapshot(WORKDIR)
    nonce = os.urandom(8).hex()
    frames.frame(b"R")
    wait_for_job(wait_limit)
    arrived = time.monotonic()
    job, archive = read_job(frames.INBOX, default_python)
    job.arrived = arrived
    # The job is ours: a sandbox that dies from here on took this job with it (the server
    # runs a job again elsewhere only when its sandbox died before this).
    frames.frame(b"S")

    # What the archive writes is added to the snapshot taken before `R` as it is written
    # (a walk of the workspace here was a millisecond of every run under gVisor).
    stats = dict(workspace_before) if job.return_files and job.workdir == WORKDIR else None
    try:
        # A one-shot run keeps its entry file's bytes for the imports scan.
        keep = None if job.session else job.entry
        job.source = unpack(archive, job.workdir, [], keep=keep, stats=stats)
    except Refused as e:
        frames.fail(str(e))
    except OSError as e:
        frames.fail(
            "could not unpack the job into %s: %s (the workspace size limit?)" % (job.workdir, e)
        )
    del archive
    if job.return_files:
        job.files_before = stats if stats is not None else snapshot(job.workdir)
    job.nonce = nonce
    job.oom_before = cgroup.oom_kills() or 0
    job.wake_r = wake_r
    job.preload = state
    # Egress (#41): listening before the code runs; the proxy variables it is given.
    job.env = netrelay.start(job)

    if job.session:
        if job.python == child.python and job.workdir == WORKDIR:
            # The waiting interpreter becomes the session's, what it preloaded loaded.
            try:
                child.serve(job.env)
            except OSError:
                pass  # it died waiting: the first cell finds it gone and says so
            session.serve(child, job)
            return
        child.discard()
        # The session's interpreter starts now, with the variables in its environment.
        os.environ.update(job.env)
        if job.env:
            os.environ.pop("NO_PROXY", None)
            os.environ.pop("no_proxy", None)
        try:
            again = preload.State(preload.again(state), percent)
            job.preload = again
            repl = preload.start(job.python, job.workdir, REPL_STUB, again)
        except OSError as e:
            frames.fail("could not start %s: %s" % (job.python, e))
        session.serve(repl, job)
        return

    if job.python != child.python:
        child.discard()
        try:
            # On the request path now: nothing is preloaded here.
            job.preload = preload.State([], percent)
            child = preload.start(job.python, job.workdir, STUB, job.preload)
        except OSError as e:
            frames.fail("could not start %s: %s" % (job.python, e))
    job.unpacked = time.monotonic()
    run.run(child, job)
    # The report is out (flushed) and every process of the run reaped: leave at once. The
    # server removes the container as soon as the report arrives; a runner still tearing
    # its interpreter down then is killed, and a kill costs the daemon more than an exit.
    os._exit(0)
