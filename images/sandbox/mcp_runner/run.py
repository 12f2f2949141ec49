"""A one-shot run: the child runs one file; its output is pumped into frames until it has
exited and its pipes are closed (or a short grace has passed), every process it left is
reaped, and the report goes out. The backstop deadline lives here."""

import os
import resource
import signal
import time

from mcp_runner import cgroup, frames, limits, netrelay, output, preload, toolrelay
from mcp_runner.watch import Watch


def run(child, job):
    """Run the job's entry file in the waiting `child`, then report."""
    out = output.Output(job.output_limit)
    pid, out_r, err_r = child.pid, child.out_r, child.err_r
    deadline_s = job.deadline_s
    deadline = time.monotonic() + float(deadline_s) if deadline_s else None
    timed_out = False
    exited_at = None
    preload.dispatching(child, job)
    nonce = job.nonce or os.urandom(8).hex()
    code_at = time.monotonic()
    try:
        child.go(os.path.join(job.workdir, job.entry), nonce, job.source, job.env)
    except OSError:
        pass  # the interpreter died at start-up: its stderr and status say why
    preload.scan(job)

    sel = Watch()
    sel.register(out_r, (b"O", 0))
    sel.register(err_r, (b"E", 1))
    sel.register(job.wake_r, None)
    # Code mode: the code's tool requests go out as `T` frames, the answers come in on
    # stdin (which the server closes right after the job when the run has no tools).
    relay = toolrelay.make(child)
    sel.register(relay.fd, "tools")
    if not frames.INBOX.eof:
        sel.register(frames.INBOX.fileno(), "stdin")
    # Egress: the code's connections, relayed as streams (see `netrelay`).
    if netrelay.NET is not None:
        netrelay.NET.attach(sel)
    # The stub's done line (see `Done`): the run ends there, or when the child is reaped.
    done = Done(nonce, pid)
    sel.register(child.st_r, "done")
    status = None
    # Reaped when SIGCHLD wakes the loop, not after every chunk of output (a wait4 each,
    # slow under gVisor); an exit before the loop began left its byte in the wake pipe.
    woken = False

    while True:
        open_pipes = [t for t in sel.tags.values() if isinstance(t, tuple)]
        ended = status is not None or done.said is not None
        if ended and not open_pipes:
            break
        now = time.monotonic()
        if ended and now - exited_at > limits.EXIT_GRACE:
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
        if ended:
            wait = 0.05
        elif deadline is not None and not timed_out:
            wait = max(0.0, deadline - now)
        else:
            wait = None
        events = sel.select(timeout=wait)
        if ended and not events:
            break
        for fd, tag in events:
            if tag is None:
                job.woken()
                woken = True
            elif tag == "done":
                if not done.read(fd):
                    sel.unregister(fd)
                elif done.said is not None and exited_at is None:
                    exited_at = time.monotonic()
            elif tag == "net":
                netrelay.NET.event(fd)
            elif tag == "tools":
                if not relay.from_code():
                    sel.unregister(fd)
            elif tag == "stdin":
                if not relay.from_server()[0]:
                    sel.unregister(fd)
            elif not out.pump(fd, *tag):
                sel.unregister(fd)
                os.close(fd)
        if woken:
            woken = False
            reaped = output.reap(pid)
            if reaped is not None:
                status = reaped
                if exited_at is None:
                    exited_at = time.monotonic()

    budget = limits.Budget(getattr(job, "return_limit", None))
    returned = output.send_returns(job, budget)
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu_ms = int((usage.ru_utime + usage.ru_stime) * 1000)
    maxrss_kb = usage.ru_maxrss
    if status is None and done.said is not None:
        # Reported before the child was reaped: its own figures, from its done line.
        code, child_cpu_ms, child_rss_kb = done.said
        cpu_ms += child_cpu_ms
        maxrss_kb = max(maxrss_kb, child_rss_kb)
        fields = {"exit_code": code, "signal": None}
    else:
        fields = output.exit_fields(status)
    report = output.report(
        out,
        budget,
        returned,
        timed_out=timed_out,
        cpu_ms=cpu_ms,
        peak_memory_bytes=cgroup.peak_memory() or maxrss_kb * 1024,
        oom_kills=max(0, (cgroup.oom_kills() or 0) - job.oom_before),
        **fields,
    )
    preload.amend(report, child, job)
    ended_at = exited_at if exited_at is not None else time.monotonic()
    report["phases"] = output.phases(
        ("job", getattr(job, "arrived", None), getattr(job, "unpacked", None)),
        ("code", code_at, ended_at),
        ("report", ended_at, time.monotonic()),
    )
    frames.report(report)


class Done:
    """The stub's done line on the status channel, `D NONCE PID EXIT CPU_MS MAXRSS_KB`: the
    code has finished (threads joined, atexit handlers run, streams flushed and closed) and
    the interpreter is only exiting, which with big libraries loaded takes milliseconds of
    unmapping that need not delay the report. Believed only when it names this run's nonce
    and the child's pid (not a process the code forked, which also returns through the
    stub) and its fields are numbers; anything else there is ignored (the run then ends
    when the child is reaped, as it does when the code leaves by `os._exit` or a signal)."""

    def __init__(self, nonce, pid):
        self.nonce = nonce
        self.pid = pid
        self.said = None
        self.pending = b""

    def read(self, fd):
        """Read what is there; False at EOF (or an error)."""
        try:
            chunk = os.read(fd, 4096)
        except OSError:
            return False
        if not chunk:
            return False
        lines = (self.pending + chunk).split(b"\n")
        self.pending = lines.pop()[: limits.MAX_STATUS_LINE]
        for line in lines:
            parts = line.split(b" ")
            if self.said is None and len(parts) == 6 and parts[0] == b"D":
                if parts[1].decode("ascii", "replace") != self.nonce:
                    continue
                try:
                    pid, code, cpu_ms, rss_kb = (int(x) for x in parts[2:])
                except ValueError:
                    continue
                if pid == self.pid:
                    self.said = (code, cpu_ms, rss_kb)
        return True
