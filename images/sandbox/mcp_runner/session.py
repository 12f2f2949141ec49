"""A session: after the job's files, messages arrive on stdin one at a time (`u32 length,
JSON`), each answered by frames that end with an `X` report, until stdin closes or the
interpreter dies:

  {"kind": "cell", "code": ..., "output_limit": ...}   (no `kind`: a cell)
      runs in the session's interpreter (see `stubs.REPL_CODE`): its output, figures and
      changed files, then a report with exit_code 0, or 1 when the cell raised, and the
      modules its source imports (`imported`, as a one-shot run's); `ended` when the
      interpreter exited, after which no further message is served.
  {"kind": "files", "tar_len": N} then N bytes of tar
      unpacked into the workspace by the runner itself, as safely as the job's archive;
      the interpreter does not run and its state is untouched. Exit code 0, or 1 with the
      reason on stderr (`E`); the session goes on either way.
"""

import json
import os
import select
import signal
import struct
import time

from mcp_runner import cgroup, frames, limits, netrelay, output, preload, toolrelay
from mcp_runner.watch import Watch
from mcp_runner.workspace import Refused, note_written, unpack, why


def serve(child, job):
    """Serve messages until stdin closes or the interpreter is gone."""
    stdin = frames.INBOX
    relay = toolrelay.make(child)
    sel = Watch()
    # Code mode's requests are relayed while a cell runs (see `toolrelay`).
    sel.register(relay.fd, "tools")
    sel.register(child.out_r, (b"O", 0))
    sel.register(child.err_r, (b"E", 1))
    sel.register(child.st_r, "status")
    sel.register(job.wake_r, None)
    # Egress: the code's connections, relayed while a cell runs (see `netrelay`).
    if netrelay.NET is not None:
        netrelay.NET.attach(sel)
    while True:
        # A warm-up starts once no message came for WARM_AFTER and runs until done or a
        # message comes (see `warm_up`); then, between messages, every process of the code
        # is stopped (see `hold`).
        if job.warm_next is not None:
            modules, job.warm_next = job.warm_next, None
            if quiet_for(stdin, WARM_AFTER):
                warm_up(child, job, modules)
        if job.warming:
            job.warming = False
            settle_warm_up(stdin, child, job)
        # A message already waiting (a session's first cell comes with its job): nothing
        # to hold still for.
        held = not waiting(stdin)
        if held:
            hold(True)
        try:
            msg = frames.read_message(stdin)
            if held:
                hold(False)
            kind = msg.get("kind", "cell")
            if kind == "files":
                tar = frames.read_exact(stdin, int(msg["tar_len"]))
            elif kind == "net":
                # A stream's bytes sent before the last cell ended: its stream is gone.
                frames.read_exact(stdin, int(msg.get("len", 0)))
                continue
        except (EOFError, ValueError, KeyError, TypeError, AttributeError):
            child.discard()
            return
        if kind == "files":
            put_files(tar, job)
        elif kind == "tool":
            pass  # the answer to a call of a cell that has ended: nobody waits for it
        elif kind == "cell":
            if run_cell(stdin, sel, child, job, msg, relay):
                return
        else:
            child.discard()
            frames.fail("unknown session message %r" % (kind,))


def hold(still):
    """Stop (`still`) or continue every process in the sandbox but the runner: what a cell
    left running (a thread, a child) computes only while a cell runs. `kill(-1)` from the
    runner, PID 1 of the sandbox's PID namespace, reaches every other process of it, also
    those the code moved to another process group or session, and a stop cannot be caught;
    the kernel (or gVisor's) sends it atomically with respect to fork. A system call each
    way, where Docker's pause under gVisor cost 300-400 ms at the next cell (issue 43).
    Sent twice: a process stopped mid-`fork` is stopped with its child the second time.

    A stop is complete before this returns (every thread of the others in state `T`, at
    most STOP_SETTLE seconds): under gVisor (runsc 2026-11, ptrace platform) a SIGCONT that
    comes while the stop is still going on sometimes leaves the process stopped for good
    (measured with numpy's threads: 2 in 300 and 2 in 600 rounds of stop and continue at
    once, every thread in state T until a second SIGCONT; 0 in 800 when the stop had
    settled first; runc: 0 in 1,000): a session's cell then waited out its timeout."""
    if os.getpid() != 1:
        return  # kill(-1) would reach processes that are not the sandbox's
    sig = signal.SIGSTOP if still else signal.SIGCONT
    for _ in range(2 if still else 1):
        try:
            os.kill(-1, sig)
        except OSError:
            pass  # nothing else is left (ESRCH)
    if still:
        end = time.monotonic() + STOP_SETTLE
        while running() and time.monotonic() < end:
            time.sleep(0.0005)


# Seconds `hold(True)` waits for the stop to reach every thread (one stuck in an
# uninterruptible wait may take longer: it is not waited for beyond this).
STOP_SETTLE = 0.05


def running():
    """Whether a thread of a process of the sandbox other than the runner is not yet
    stopped (its /proc stat state neither `T`, stopped, nor `Z`/`X`, gone)."""
    me = str(os.getpid())
    try:
        pids = [p for p in os.listdir("/proc") if p.isdigit() and p != me]
    except OSError:
        return False
    for pid in pids:
        try:
            tasks = os.listdir("/proc/%s/task" % pid)
        except OSError:
            continue  # gone
        for task in tasks:
            try:
                with open("/proc/%s/task/%s/stat" % (pid, task), "rb") as f:
                    line = f.read()
            except OSError:
                continue
            end = line.rfind(b")")
            if line[end + 2 : end + 3] not in (b"T", b"Z", b"X", b"t"):
                return True
    return False


def waiting(stdin):
    """Whether the next message (or its start) is already here."""
    return not quiet_for(stdin, 0)


def quiet_for(stdin, seconds):
    """Whether no message comes within `seconds` (nor is here already)."""
    if stdin.buf or stdin.eof:
        return False
    try:
        return not select.select([stdin.fileno()], [], [], seconds)[0]
    except (OSError, ValueError):
        return True


# Seconds a warm-up may take before the sandbox is held still anyway (it goes on with the
# next cell, stopped mid-import and continued: consistent, only later).
WARM_DEADLINE = 30.0
# Seconds without a message after a cell before its warm-up starts: a client sending its
# next cell at once (a script, a notebook's run-all) never meets a warm-up that is only
# starting (its thread being made, its first module's files counted), which held such a
# cell 10-30 ms (issue 43, measured); a person or a model takes longer than this.
WARM_AFTER = 0.1


def warm_up(child, job, modules):
    """Tell the interpreter to import `modules` while the session waits (issue 43, see
    `stubs.WARM_CODE`), within the memory budget of preloads; the sandbox is held still
    once it is done (see `settle_warm_up`)."""
    names = [
        m
        for m in modules
        if isinstance(m, str) and preload.NAME.match(m) and m not in job.warmed
    ]
    if not names:
        return  # all asked for was imported or skipped: the list empties
    state = getattr(job, "preload", None)
    percent = state.percent if state is not None else 50
    job.warm_seq += 1
    body = json.dumps(
        {
            "modules": names[: preload.MAX_MODULES],
            "budget": preload.budget_bytes(percent),
            "cpus": cgroup.cpu_limit(),
            "seq": job.warm_seq,
        }
    ).encode()
    try:
        os.write(child.go_w, b"W" + struct.pack(">I", len(body)) + body)
    except OSError:
        return
    job.warming = True


def settle_warm_up(stdin, child, job):
    """Wait until the warm-up says it is done (its line names this warm-up's `seq`: what it
    imported or skipped is not asked for again, see `job.warmed`), the next message comes
    (the cell runs at once; the warm-up stops after its module) or WARM_DEADLINE passes.
    Only then held still: a warm-up held mid-import holds its module's lock until the next
    message lets it go on."""
    end = time.monotonic() + WARM_DEADLINE
    pending = b""
    while not stdin.buf and not stdin.eof:
        left = end - time.monotonic()
        if left <= 0:
            return
        try:
            r, _, _ = select.select([stdin.fileno(), child.st_r], [], [], left)
        except InterruptedError:
            continue
        if stdin.fileno() in r:
            return
        try:
            chunk = os.read(child.st_r, 65536)
        except OSError:
            chunk = b""
        if not chunk:
            return  # the interpreter is gone: the next cell says so
        pending = (pending + chunk)[-65536:]
        lines = pending.split(b"\n")
        pending = lines.pop()
        for line in lines:
            try:
                done = json.loads(line)
            except ValueError:
                continue
            if isinstance(done, dict) and done.get("seq") == job.warm_seq:
                for key in ("warm", "skipped"):
                    job.warmed.update(m for m in done.get(key) or [] if isinstance(m, str))
                return


def put_files(tar, job):
    """Unpack a `files` message into the workspace and report."""
    written = []
    error = None
    try:
        unpack(tar, job.workdir, written)
    except Refused as e:
        error = str(e)
    except OSError as e:
        error = why(e, job.workdir)
    except Exception as e:  # a malformed archive: refused, the session goes on
        error = "could not unpack the files: %r" % (e,)
    if job.files_before is not None:
        # The server's files, not the code's: not returned after the next cell.
        note_written(job.workdir, job.files_before, written)
    err = b""
    if error is not None:
        err = (error + "\n").encode("utf-8", "replace")
        frames.frame(b"E", err)
    frames.report(
        {
            "exit_code": 0 if error is None else 1,
            "signal": None,
            "cpu_ms": None,
            "peak_memory_bytes": cgroup.peak_memory(),
            "oom_kills": 0,
            "stdout_bytes": 0,
            "stderr_bytes": len(err),
            "artifacts_dropped": 0,
            "files_dropped": 0,
        }
    )


def accept_status(line, nonce):
    """The status of the running cell, from one line of the status channel: a JSON object
    naming this cell's nonce, or None (garbage, a stale or a forged line: ignored)."""
    try:
        status = json.loads(line.decode("utf-8"))
    except (ValueError, UnicodeDecodeError):
        return None
    if not isinstance(status, dict) or status.get("cell") != nonce:
        return None
    if not isinstance(status.get("ok"), bool):
        return None
    return status


def run_cell(stdin, sel, child, job, cell, relay):
    """Run one cell and report; True when the interpreter is gone (the session ended).

    The cell ends when the interpreter's stub writes a status line naming the nonce sent
    with this cell (a fresh random one per cell) on the status channel, or when the
    interpreter exits. Anything else on that channel (garbage, a line the code forged with
    no or an old nonce) is ignored, so a cell cannot end itself early by writing there
    and the cells that follow are never shifted."""
    out = output.Output(int(cell.get("output_limit", job.output_limit)))
    code = str(cell.get("code", "")).encode("utf-8", "replace")
    budget = limits.Budget(cell.get("return_limit", getattr(job, "return_limit", None)))
    cpu0, oom0 = cgroup.cpu_ns(), cgroup.oom_kills() or 0
    nonce = os.urandom(16).hex()
    code_at = time.monotonic()
    msg = nonce.encode() + struct.pack(">I", len(code)) + code
    try:
        while msg:
            msg = msg[os.write(child.go_w, msg) :]
    except OSError:
        pass
    # What the cell imports (as a one-shot run's report says it, see `preload.scan`), read
    # while it runs: the server learns what its sessions need from it.
    state = getattr(job, "preload", None)
    imported = preload.imports_of(code, state.site_dirs) if state is not None else []
    status, exited = None, None
    pending = b""
    # While the cell runs, stdin is watched too: the server never sends a message before
    # the last one's report, so stdin only becomes readable when it closes, i.e. when
    # the server's attach connection went away. Then nobody will ever collect this
    # cell or stop it: stop everything now.
    sel.register(stdin.fileno(), "stdin")
    watching = True
    while status is None and exited is None:
        for fd, tag in sel.select():
            if tag == "stdin":
                is_open, other = relay.from_server()
                if is_open:
                    # Code mode's answers went to the interpreter; an early message
                    # after all is read once this cell is done.
                    if other:
                        sel.unregister(stdin.fileno())
                        watching = False
                    continue
                try:
                    os.kill(-1, signal.SIGKILL)
                finally:
                    os._exit(0)
            if tag == "tools":
                if not relay.from_code():
                    sel.unregister(fd)
                continue
            if tag == "net":
                netrelay.NET.event(fd)
                continue
            if tag is None:
                job.woken()
            elif tag == "status":
                try:
                    chunk = os.read(child.st_r, 65536)
                except OSError:
                    chunk = b""
                if chunk:
                    pending += chunk
                    lines = pending.split(b"\n")
                    pending = lines.pop()
                    if len(pending) > limits.MAX_STATUS_LINE:
                        pending = b""
                    for line in lines:
                        if status is None and len(line) <= limits.MAX_STATUS_LINE:
                            status = accept_status(line, nonce)
                else:
                    # The interpreter is gone (OOM killer, os._exit, a crash).
                    sel.unregister(child.st_r)
                    try:
                        exited = os.waitpid(child.pid, 0)[1]
                    except ChildProcessError:
                        exited = exited if exited is not None else (9 & 0x7F)
            else:
                out.pump(fd, *tag)
        reaped = output.reap(child.pid)
        if reaped is not None:
            exited = reaped
    ended_at = time.monotonic()
    if watching:
        sel.unregister(stdin.fileno())
    if netrelay.NET is not None:
        # The server ends the cell's streams with its scope: so does the runner.
        netrelay.NET.reset()
    # What the cell printed before its status is already in the pipes: take it.
    out.drain(child.out_r, b"O", 0)
    out.drain(child.err_r, b"E", 1)
    returned = output.send_returns(job, budget, clear=True)
    cpu1 = cgroup.cpu_ns()
    report = output.report(
        out,
        budget,
        returned,
        exit_code=0 if (status or {}).get("ok") else 1,
        signal=None,
        cpu_ms=(cpu1 - cpu0) // 1000000 if cpu0 is not None and cpu1 is not None else None,
        peak_memory_bytes=cgroup.peak_memory(),
        oom_kills=max(0, (cgroup.oom_kills() or 0) - oom0),
    )
    if imported:
        report["imported"] = imported
    if job.warmed:
        report["warmed"] = sorted(job.warmed)
    if exited is not None:
        # The interpreter is gone (exit(), sys.exit(), a crash): so is the session.
        report.update(output.exit_fields(exited))
        report["ended"] = True
    report["phases"] = output.phases(("code", code_at, ended_at), ("report", ended_at, time.monotonic()))
    frames.report(report)
    if exited is None and cell.get("warm"):
        job.warm_next = cell["warm"]
    return exited is not None
