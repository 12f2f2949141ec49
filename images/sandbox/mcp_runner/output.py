"""What a run or a cell sends back besides its frames of protocol, in one place for the
one-shot run (`run`) and a session's cells (`session`): the code's output under its cap,
the reaping of every child, the figures and files it left, and the report's fields."""

import os
import time

from mcp_runner import figures, frames, limits
from mcp_runner.workspace import send_files


class Output:
    """The code's stdout (`O`, index 0) and stderr (`E`, index 1) as frames, each counted
    whole and sent up to one byte past `limit`: a server that sees more than the cap knows
    the stream was cut, even when the sandbox is killed before the report (the server keeps
    the cap, not the extra byte)."""

    def __init__(self, limit):
        self.limit = limit
        self.counts = [0, 0]

    def forward(self, kind, idx, data):
        room = self.limit + 1 - self.counts[idx]
        self.counts[idx] += len(data)
        if room > 0:
            frames.frame(kind, data[:room])

    def pump(self, fd, kind, idx):
        """Forward one read of `fd`; False at its end (or when it failed)."""
        try:
            data = os.read(fd, limits.CHUNK)
        except OSError:
            data = b""
        if data:
            self.forward(kind, idx, data)
        return bool(data)

    def drain(self, fd, kind, idx):
        """Forward all that `fd` holds now, without waiting for more."""
        os.set_blocking(fd, False)
        try:
            while True:
                try:
                    data = os.read(fd, limits.CHUNK)
                except (BlockingIOError, OSError):
                    break
                if not data:
                    break
                self.forward(kind, idx, data)
        finally:
            os.set_blocking(fd, True)

    def fields(self):
        return {"stdout_bytes": self.counts[0], "stderr_bytes": self.counts[1]}


def reap(pid):
    """Reap every child that has exited: the code, and any orphan re-parented to the
    runner (PID 1). The wait status of `pid` when it was among them, else None."""
    status = None
    while True:
        try:
            wpid, wstatus = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return status
        if wpid == 0:
            return status
        if wpid == pid:
            status = wstatus


def exit_fields(status):
    """The report's `exit_code` and `signal` from a wait status."""
    return {
        "exit_code": os.WEXITSTATUS(status) if os.WIFEXITED(status) else None,
        "signal": os.WTERMSIG(status) if os.WIFSIGNALED(status) else None,
    }


def send_returns(job, budget, clear=False):
    """Send the figures the code made and the workspace files it wrote, within `budget`
    (the job's `files_before` then holds what the next cell compares with), and with
    `clear` forget the figures sent (a session's next cell starts with none). The report's
    `artifacts_dropped` and `files_dropped`; a failure here is a note, never the run's."""
    dropped = files_dropped = 0
    try:
        dropped = figures.send_artifacts(budget)
        if job.files_before is not None:
            job.files_before, files_dropped = send_files(job.workdir, job.files_before, budget)
        if clear:
            figures.clear()
    except Exception as e:  # the program's own outcome is reported whatever happened here
        budget.note("figures or files could not be returned: %r" % (e,))
    return {"artifacts_dropped": dropped, "files_dropped": files_dropped}


def phases(*spans):
    """The run's phases for the server's trace (children of its `sandbox.run` span): one
    `[name, start, end]` per `(name, start, end)` of monotonic times, in milliseconds
    before now (the report's sending: the server places them from its arrival)."""
    now = time.monotonic()
    return [
        [name, round((now - a) * 1000, 2), round((now - b) * 1000, 2)]
        for name, a, b in spans
        if a is not None and b is not None and a <= b
    ]


def report(output, budget, returned, **fields):
    """The report of a run or cell: its own `fields`, the output counts, what came back
    (`returned`, from `send_returns`) and the budget's notes."""
    body = dict(fields)
    body.update(output.fields())
    body.update(returned)
    body["notes"] = budget.all_notes()
    return body
