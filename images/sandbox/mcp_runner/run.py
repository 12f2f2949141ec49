"""A one-shot run: the child runs one file; its output is pumped into frames until it has
exited and its pipes are closed (or a short grace has passed), every process it left is
reaped, and the report goes out. The backstop deadline lives here."""

import os
import resource
import selectors
import signal
import time

from mcp_runner import cgroup, frames, limits, output, preload, toolrelay


def run(child, job):
    """Run the job's entry file in the waiting `child`, then report."""
    out = output.Output(job.output_limit)
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
    status = None

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
                job.woken()
            elif key.data == "tools":
                if not relay.from_code():
                    sel.unregister(key.fd)
            elif key.data == "stdin":
                if not relay.from_server()[0]:
                    sel.unregister(key.fd)
            elif not out.pump(key.fd, *key.data):
                sel.unregister(key.fd)
                os.close(key.fd)
        reaped = output.reap(pid)
        if reaped is not None:
            status, exited_at = reaped, time.monotonic()

    budget = limits.Budget(getattr(job, "return_limit", None))
    returned = output.send_returns(job, budget)
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    report = output.report(
        out,
        budget,
        returned,
        timed_out=timed_out,
        cpu_ms=int((usage.ru_utime + usage.ru_stime) * 1000),
        peak_memory_bytes=cgroup.peak_memory() or usage.ru_maxrss * 1024,
        oom_kills=max(0, (cgroup.oom_kills() or 0) - job.oom_before),
        **output.exit_fields(status),
    )
    preload.amend(report, child, job)
    frames.report(report)
