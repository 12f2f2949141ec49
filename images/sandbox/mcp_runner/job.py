"""The job: what the header the server sends first asks for (see `protocol.rs`'s
`JobHeader`), and what the runner learns while setting it up."""

import os

from mcp_runner import frames
from mcp_runner.workspace import WORKDIR


class Job:
    def __init__(self, header, default_python):
        self.session = header.get("mode") == "session"
        # Bytes of tar that follow the header.
        self.tar_len = int(header["tar_len"])
        # The file to run, relative to workdir (a one-shot run only).
        self.entry = header.get("entry") if self.session else str(header["entry"])
        self.workdir = header.get("workdir", WORKDIR)
        self.python = header.get("python", default_python)
        self.output_limit = int(header.get("output_limit", 1 << 20))
        # Bytes of figures and files one run (or cell) may return in all (None: the default).
        self.return_limit = header.get("return_limit")
        self.return_files = bool(header.get("return_files"))
        # Seconds after which the runner kills the code itself (None: never).
        self.deadline_s = header.get("deadline_s")
        # Egress (#41): listen for the code's connections and relay them (`netrelay`).
        self.egress = bool(header.get("egress"))
        # With egress: the server's interception CA (PEM, public), added to the bundle.
        self.egress_ca = header.get("egress_ca")
        # The variables the code is given for it (set by `netrelay.start`).
        self.env = {}
        # Set once the archive is unpacked: the workspace as the code finds it (None unless
        # files are returned), and the OOM kills counted before the code started.
        self.files_before = None
        self.oom_before = 0
        # Named by the child's done line (see `run.Done`); made before the job came.
        self.nonce = None
        # Readable whenever a child exits (SIGCHLD), to wake the select loops.
        self.wake_r = None
        # What the last cell asked to warm up, not yet started (see `session.warm_up`),
        # and whether a warm-up was started after the last cell.
        self.warm_next = None
        self.warming = False
        # The last warm-up's number, and what warm-ups imported or skipped (never asked
        # for again; each report names them, `warmed`).
        self.warm_seq = 0
        self.warmed = set()
        # What the preload of the code's interpreter did (`preload.State`), for the report.
        self.preload = None
        # The entry file's bytes as the archive held them (a one-shot run), and the modules
        # it imports (`preload.scan`, while the code runs).
        self.source = None
        self.imported = []

    def woken(self):
        """Empty the wake pipe: a child exited, and the select loop reaps and looks again."""
        try:
            os.read(self.wake_r, 512)
        except OSError:
            pass


def read_job(stdin, default_python):
    """The header and the archive from stdin, or `F` and exit."""
    try:
        # One read of what has come (most jobs whole, under 64 KiB): the length, the header
        # and the archive then come from the buffer, not a read each (slow under gVisor).
        # The server sends nothing more before the run's report, so nothing is read early.
        stdin.fill()
        job = Job(frames.read_message(stdin), default_python)
        archive = frames.read_exact(stdin, job.tar_len)
    except (EOFError, ValueError, KeyError) as e:
        frames.fail("bad job input: %s" % e)
    return job, archive
