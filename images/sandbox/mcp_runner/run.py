"""A one-shot run: the child runs one file; its output is pumped into frames until it has
exited and its pipes are closed (or a short grace has passed), every process it left is
reaped, and the report goes out. The backstop deadline lives here."""

import os
import resource
import selectors
import signal
import time

from mcp_runner import cgroup, figures, frames, limits, preload, toolrelay
from mcp_runner.workspace import send_files


def run(child, job):
    """Run the job's entry file in the waiting `child`, then report."""
    limit = job.output_limit
    pid, out_r, err_r = child.pid, child.out_r, child.err_r
    deadline_s = job.deadline_s
    deadline = time.monotonic() + float(deadline_s) if deadline_s else None
    timed_out = False
    exited_at = None
    preload.dispatching(child, job)
    try:
        child.go(job.entry)
    except OSError:
        pass  # the interpreter died at start-up: its stderr and status say why

    sel = selectors.DefaultSelector()
    sel.register(out_r, selectors.EVENT_READ, (b"O", 0))
    sel.register(err_r, selectors.EVENT_READ, (b"E", 1))
    sel.register(job.wake_r, selectors.EVENT_READ, None)
    # Code mode: the code's tool requests go out as `T` frames, the answers come in on
    # stdin (which the server closes right after the job when the run has no tools).
    relay = toolrelay.make(child)
    sel.register(relay.fd, selectors.EVENT_READ, "tools")
    if not frames.INBOX.eof:
        sel.register(frames.INBOX.fileno(), selectors.EVENT_READ, "stdin")
    counts = [0, 0]
    status = None

    def pump(fd, kind, idx):
        try:
            data = os.read(fd, limits.CHUNK)
        except OSError:
            data = b""
        if not data:
            sel.unregister(fd)
            os.close(fd)
            return
        # Up to one byte past the cap: a server that sees more than the cap knows the
        # stream was cut, even when the deadline kills the sandbox before the report.
        room = limit + 1 - counts[idx]
        counts[idx] += len(data)
        if room > 0:
            frames.frame(kind, data[:room])

    while True:
        open_pipes = [k for k in sel.get_map().values() if isinstance(k.data, tuple)]
        if status is not None and not open_pipes:
            break
        now = time.monotonic()
        if status is not None and now - exited_at > limits.EXIT_GRACE:
            break
        if deadline is not None and not timed_out and now >= deadline:
            # Nobody killed the sandbox at its deadline: the server is gone. Kill every
            # process but this one (PID 1), then report as the server would have.
            timed_out = True
            try:
                os.kill(-1, signal.SIGKILL)
            except OSError:
                pass
        # Once the code has exited, whatever it left running may hold the pipes open:
        # give them a short grace to flush, then report.
        if status is not None:
            wait = 0.05
        elif deadline is not None and not timed_out:
            wait = max(0.0, deadline - now)
        else:
            wait = None
        events = sel.select(timeout=wait)
        if status is not None and not events:
            break
        for key, _ in events:
            if key.data is None:
                try:
                    os.read(job.wake_r, 512)
                except OSError:
                    pass
            elif key.data == "tools":
                if not relay.from_code():
                    sel.unregister(key.fd)
            elif key.data == "stdin":
                if not relay.from_server()[0]:
                    sel.unregister(key.fd)
            else:
                pump(key.fd, *key.data)
        # Reap everything: the code, and any orphan that was re-parented to us.
        while True:
            try:
                wpid, wstatus = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if wpid == 0:
                break
            if wpid == pid:
                status = wstatus
                exited_at = time.monotonic()

    budget = limits.Budget(getattr(job, "return_limit", None))
    dropped = files_dropped = 0
    try:
        dropped = figures.send_artifacts(budget)
        if job.files_before is not None:
            files_dropped = send_files(job.workdir, job.files_before, budget)[1]
    except Exception as e:  # the program's own outcome is reported whatever happened here
        budget.note("figures or files could not be returned: %r" % (e,))
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    report = {
            "exit_code": os.WEXITSTATUS(status) if os.WIFEXITED(status) else None,
            "signal": os.WTERMSIG(status) if os.WIFSIGNALED(status) else None,
            "timed_out": timed_out,
            "cpu_ms": int((usage.ru_utime + usage.ru_stime) * 1000),
            "peak_memory_bytes": cgroup.peak_memory() or usage.ru_maxrss * 1024,
            "oom_kills": max(0, (cgroup.oom_kills() or 0) - job.oom_before),
            "stdout_bytes": counts[0],
            "stderr_bytes": counts[1],
            "artifacts_dropped": dropped,
            "files_dropped": files_dropped,
            "notes": budget.all_notes(),
        }
    preload.amend(report, child, job)
    frames.report(report)
