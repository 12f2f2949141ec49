"""The sandbox runner: PID 1 of every execution container.

Protocol (all integers big-endian):

  stdin   u32 header length, JSON header, then exactly `tar_len` bytes of a tar archive
          that holds regular files only (the server builds it).
  stdout  frames: 1 byte kind, u32 payload length, payload.
            b"R"  ready: the runner is up and waiting for its job (empty payload)
            b"O"  a chunk of the user's stdout
            b"E"  a chunk of the user's stderr
            b"A"  an artifact (a figure): u16 name length, name, bytes; before `X`
            b"W"  a file the code created or changed under the workspace (when the header
                  asks for `return_files`): u16 path length, path, bytes; before `X`
            b"X"  the final report, JSON: exit_code, signal, timed_out, cpu_ms,
                  peak_memory_bytes, oom_kills, stdout_bytes, stderr_bytes,
                  artifacts_dropped, files_dropped
            b"F"  the runner could not run the job, JSON: {"error": "..."}

The user's code runs as a child process whose stdout/stderr are pipes read here, so
nothing it writes can forge a frame: the runner is not dumpable (its /proc entries are
root-owned, unreachable for the same uid) and, as PID 1 of its pid namespace, it
cannot be signalled by its children. Past `output_limit` bytes a stream is drained
and counted but not forwarded, so a flood costs the user's CPU quota and nothing else.

The server enforces the run's deadline (it kills the container). The runner keeps a
backstop of its own, so that a container never outlives a server that died (kill -9, OOM,
a recreated compose service): the header's `deadline_s` (the timeout plus a grace), past
which every process of the sandbox is killed and the run reported as timed out; and
`MCPX_WAIT_LIMIT` (environment, seconds), past which a runner still waiting for its job
exits. A session's stdin closes when the server's attach connection goes away.

To keep interpreter start-up off the request path, the child Python is started before
the job arrives, with a tiny stub that waits on fd 3 for the name of the file to run and
then runs it as `__main__` (as `python -u FILE` would). A pool container is therefore
a runner and a fully started interpreter, both waiting.

Written for any Python 3.6+ and the standard library only, started with -I -S; the
interpreter for the code is argv[1] (default /usr/bin/python3).
"""

import ctypes
import json
import os
import resource
import selectors
import shutil
import signal
import stat
import struct
import sys
import tarfile
import time

OUT = sys.stdout.buffer
CHUNK = 65536


def frame(kind, payload=b""):
    OUT.write(kind + struct.pack(">I", len(payload)) + payload)
    OUT.flush()


def fail(message):
    frame(b"F", json.dumps({"error": message}).encode())
    sys.exit(0)


def read_exact(stream, n):
    parts = []
    while n > 0:
        chunk = stream.read(min(n, 1 << 20))
        if not chunk:
            raise EOFError("stdin closed early")
        parts.append(chunk)
        n -= len(chunk)
    return b"".join(parts)


def not_dumpable():
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE = 4
    except Exception:
        pass


def read_int(path, prefix=None):
    try:
        with open(path) as f:
            for line in f:
                if prefix is None:
                    return int(line.strip())
                if line.startswith(prefix):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return None


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


def open_regular(path):
    """Open `path` for reading if it is a regular file: never follows a symlink, never
    blocks on a FIFO the code left there. None otherwise."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            return None
        os.set_blocking(fd, True)
    except OSError:
        os.close(fd)
        return None
    return os.fdopen(fd, "rb")


MAX_FILES = 100
MAX_FILE_BYTES = 8 << 20
MAX_FILES_TOTAL = 32 << 20


def snapshot(root):
    """{relative path: (size, mtime_ns)} of the regular files under root (no symlinks)."""
    seen = {}
    for d, dirs, files in os.walk(root):
        dirs[:] = [x for x in dirs if not os.path.islink(os.path.join(d, x))]
        for f in files:
            p = os.path.join(d, f)
            try:
                st = os.lstat(p)
            except OSError:
                continue
            if stat.S_ISREG(st.st_mode):
                seen[os.path.relpath(p, root)] = (st.st_size, st.st_mtime_ns)
    return seen


def send_files(root, before):
    """Send the files under root that are new or changed since `before` (frames `W`:
    u16 path length, path, bytes); return (the new snapshot, how many were dropped)."""
    now = snapshot(root)
    sent = total = dropped = 0
    for rel in sorted(now):
        if before.get(rel) == now[rel]:
            continue
        size = now[rel][0]
        if sent >= MAX_FILES or size > MAX_FILE_BYTES or total + size > MAX_FILES_TOTAL:
            dropped += 1
            continue
        f = open_regular(os.path.join(root, rel))
        if f is None:
            continue
        with f:
            data = f.read(MAX_FILE_BYTES + 1)
        if len(data) > MAX_FILE_BYTES:
            dropped += 1
            continue
        raw = rel.encode("utf-8", "surrogateescape")
        if len(raw) > 4096:
            dropped += 1
            continue
        frame(b"W", struct.pack(">H", len(raw)) + raw + data)
        sent += 1
        total += len(data)
    return now, dropped


def safe_extract(data, dest):
    import io

    with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tar:
        for member in tar:
            name = os.path.normpath(member.name)
            if name.startswith(("/", "..")) or "\0" in name:
                fail("refused archive entry: %r" % member.name)
            target = os.path.join(dest, name)
            if member.isdir():
                os.makedirs(target, exist_ok=True)
            elif member.isfile():
                os.makedirs(os.path.dirname(target), exist_ok=True)
                src = tar.extractfile(member)
                with open(target, "wb") as out:
                    shutil.copyfileobj(src, out)
                os.chmod(target, 0o644)
            else:
                fail("refused archive entry that is not a regular file: %r" % member.name)


# Runs in the child interpreter: wait for the entry file's name on fd 3, then run it in
# the real `__main__` module, as `python FILE` does (so pickling functions defined there
# works), with tracebacks that start at the user's file.
FIGURES_CODE = r"""
def _mcp_figures():
    # Figures shown with plt.show() are saved by the sandbox backend (mcp_backend.py);
    # those still open when the code ends are saved by the function returned here
    # (called before interpreter shutdown: matplotlib's own atexit closes them all).
    import os, sys
    sys.path.append('/opt/mcp-code-executor/pylib')
    os.environ['MPLBACKEND'] = 'module://mcp_backend'
    def save_open():
        if 'matplotlib.pyplot' in sys.modules:
            try:
                import mcp_backend
                mcp_backend.save_all()
            except Exception as e:
                sys.stderr.write('[figure capture failed: %r]\n' % (e,))
    return save_open
"""

RUN_CODE = r"""
def _mcp_run(save_open_figures):
    import os, sys, builtins
    b = b''
    while True:
        c = os.read(3, 65536)
        if not c:
            break
        b += c
    os.close(3)
    if not b:
        os._exit(0)
    path = os.path.abspath(b.decode())
    sys.argv = [path]
    sys.path[0] = os.path.dirname(path)
    with open(path, 'rb') as f:
        code = compile(f.read(), path, 'exec', dont_inherit=True)
    loader = sys.modules['_frozen_importlib_external'].SourceFileLoader('__main__', path)
    g = sys.modules['__main__'].__dict__
    g.clear()
    g.update(__name__='__main__', __doc__=None, __package__=None, __spec__=None,
             __loader__=loader, __file__=path, __cached__=None, __builtins__=builtins)
    try:
        exec(code, g)
    except SystemExit:
        save_open_figures()
        raise
    except BaseException as e:
        tb = e.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_filename != path:
            tb = tb.tb_next
        if tb is not None:
            e.__traceback__ = tb
        sys.excepthook(type(e), e, e.__traceback__)
        save_open_figures()
        sys.exit(1)
    save_open_figures()
_mcp_run(_mcp_figures())
"""

# A session's interpreter: cells arrive on fd 3 (u32 length, source), run REPL-style in
# one persistent `__main__` (the value of a final expression is displayed), and each ends
# with a status line on fd 4.
REPL_CODE = r"""
def _mcp_repl(save_open_figures):
    import os, sys, ast, builtins, json, linecache, struct
    g = sys.modules['__main__'].__dict__
    g.clear()
    g.update(__name__='__main__', __doc__=None, __package__=None, __spec__=None,
             __loader__=None, __builtins__=builtins)
    sys.argv = ['']
    sys.path[0] = os.getcwd()
    def read_exact(n):
        b = b''
        while len(b) < n:
            c = os.read(3, n - len(b))
            if not c:
                os._exit(0)
            b += c
        return b
    n = 0
    while True:
        (size,) = struct.unpack('>I', read_exact(4))
        src = read_exact(size).decode('utf-8', 'replace')
        n += 1
        name = '<cell %d>' % n
        linecache.cache[name] = (len(src), None, src.splitlines(True), name)
        ok = True
        try:
            tree = ast.parse(src, name, 'exec')
            last = None
            if tree.body and isinstance(tree.body[-1], ast.Expr):
                last = ast.Expression(tree.body.pop().value)
            exec(compile(tree, name, 'exec'), g)
            if last is not None:
                sys.displayhook(eval(compile(last, name, 'eval'), g))
        except SystemExit:
            save_open_figures()
            raise
        except BaseException as e:
            ok = False
            tb = e.__traceback__
            while tb is not None and not tb.tb_frame.f_code.co_filename.startswith('<cell'):
                tb = tb.tb_next
            e.__traceback__ = tb
            if sys.excepthook is sys.__excepthook__:
                import traceback  # the Python one reads cell sources from linecache
                traceback.print_exception(type(e), e, tb)
            else:
                sys.excepthook(type(e), e, tb)
        save_open_figures()
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        except Exception:
            pass
        os.write(4, (json.dumps({'ok': ok}) + '\n').encode())
_mcp_repl(_mcp_figures())
"""

STUB = FIGURES_CODE + RUN_CODE
REPL_STUB = FIGURES_CODE + REPL_CODE


class Child:
    """The user's interpreter, started and waiting for the file to run."""

    def __init__(self, python, workdir, stub=None):
        self.python = python
        go_r, self.go_w = os.pipe()
        self.out_r, out_w = os.pipe()
        self.err_r, err_w = os.pipe()
        self.st_r, st_w = os.pipe()
        devnull = os.open(os.devnull, os.O_RDONLY)
        self.pid = os.fork()
        if self.pid == 0:
            try:
                os.dup2(devnull, 0)
                os.dup2(out_w, 1)
                os.dup2(err_w, 2)
                if go_r != 3:
                    os.dup2(go_r, 3)
                os.set_inheritable(3, True)  # dup2 onto itself keeps close-on-exec
                os.dup2(st_w, 4)
                os.closerange(5, 1 << 16)
                signal.signal(signal.SIGPIPE, signal.SIG_DFL)
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                signal.signal(signal.SIGINT, signal.SIG_DFL)
                os.chdir(workdir)
                os.execv(python, [python, "-u", "-c", stub or STUB])
            except BaseException as e:
                os.write(2, ("could not start %s: %s\n" % (python, e)).encode())
            os._exit(127)
        for fd in (go_r, out_w, err_w, st_w, devnull):
            os.close(fd)

    def go(self, entry):
        os.write(self.go_w, entry.encode())
        os.close(self.go_w)

    def discard(self):
        for fd in (self.go_w, self.out_r, self.err_r, self.st_r):
            try:
                os.close(fd)
            except OSError:
                pass
        try:
            os.kill(self.pid, signal.SIGKILL)
            os.waitpid(self.pid, 0)
        except OSError:
            pass


FIGURES = "/tmp/.mcp-figures"
MAX_ARTIFACTS = 10
MAX_ARTIFACT_BYTES = 4 << 20


def send_artifacts():
    """Send the figures the code produced (frames `A`: u16 name length, name, bytes);
    return how many were over the caps and dropped."""
    try:
        names = sorted(os.listdir(FIGURES))
    except OSError:
        return 0
    sent = dropped = 0
    for name in names:
        f = open_regular(os.path.join(FIGURES, name))
        if f is None:
            continue
        with f:
            data = f.read(MAX_ARTIFACT_BYTES + 1)
        if sent >= MAX_ARTIFACTS or len(data) > MAX_ARTIFACT_BYTES:
            dropped += 1
            continue
        raw = name.encode("utf-8", "replace")[:255]
        frame(b"A", struct.pack(">H", len(raw)) + raw + data)
        sent += 1
    return dropped


def cpu_ns():
    """CPU time of the whole sandbox so far (cgroup), nanoseconds."""
    v = read_int("/sys/fs/cgroup/cpuacct/cpuacct.usage")
    if v is None:
        v = read_int("/sys/fs/cgroup/cpu,cpuacct/cpuacct.usage")
    if v is None:
        usec = read_int("/sys/fs/cgroup/cpu.stat", "usage_usec ")
        v = usec * 1000 if usec is not None else None
    return v


def session(child, limit, wake_r, workdir, files_before):
    """Serve cells until stdin closes or the interpreter dies: each cell is `u32 length,
    JSON {code, output_limit}` on stdin, answered by its output frames, its figures and an
    `X` report (exit_code 0, or 1 when the cell raised; `ended` when the interpreter exited,
    after which no further cell is served)."""
    stdin = sys.stdin.buffer
    sel = selectors.DefaultSelector()
    sel.register(child.out_r, selectors.EVENT_READ, (b"O", 0))
    sel.register(child.err_r, selectors.EVENT_READ, (b"E", 1))
    sel.register(child.st_r, selectors.EVENT_READ, "status")
    sel.register(wake_r, selectors.EVENT_READ, None)
    while True:
        try:
            (n,) = struct.unpack(">I", read_exact(stdin, 4))
            cell = json.loads(read_exact(stdin, n).decode())
        except (EOFError, ValueError):
            child.discard()
            return
        limit = int(cell.get("output_limit", limit))
        code = cell.get("code", "").encode("utf-8")
        counts = [0, 0]
        cpu0, oom0 = cpu_ns(), oom_kills() or 0
        msg = struct.pack(">I", len(code)) + code
        try:
            while msg:
                msg = msg[os.write(child.go_w, msg):]
        except OSError:
            pass
        status, exited = None, None
        # While the cell runs, stdin is watched too: the server never sends a cell before
        # the last one's report, so stdin only becomes readable when it closes, i.e. when
        # the server's attach connection went away. Then nobody will ever collect this
        # cell or stop it: stop everything now.
        sel.register(stdin.fileno(), selectors.EVENT_READ, "stdin")
        watching = True
        while status is None and exited is None:
            for key, _ in sel.select():
                if key.data == "stdin":
                    if stdin.peek(1):
                        # An early cell after all: it is read once this one is done.
                        sel.unregister(stdin.fileno())
                        watching = False
                        continue
                    try:
                        os.kill(-1, signal.SIGKILL)
                    finally:
                        os._exit(0)
                if key.data is None:
                    try:
                        os.read(wake_r, 512)
                    except OSError:
                        pass
                elif key.data == "status":
                    line = os.read(child.st_r, 4096)
                    if line:
                        status = json.loads(line.decode())
                    else:
                        # The interpreter is gone (OOM killer, os._exit, a crash).
                        sel.unregister(child.st_r)
                        try:
                            exited = os.waitpid(child.pid, 0)[1]
                        except ChildProcessError:
                            exited = exited if exited is not None else (9 & 0x7F)
                else:
                    kind, idx = key.data
                    data = os.read(key.fd, CHUNK)
                    if data:
                        room = limit - counts[idx]
                        counts[idx] += len(data)
                        if room > 0:
                            frame(kind, data[:room])
            try:
                wpid, wstatus = os.waitpid(-1, os.WNOHANG)
                while wpid:
                    if wpid == child.pid:
                        exited = wstatus
                    wpid, wstatus = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                pass
        if watching:
            sel.unregister(stdin.fileno())
        # What the cell printed before its status is already in the pipes: take it.
        for fd, kind, idx in ((child.out_r, b"O", 0), (child.err_r, b"E", 1)):
            os.set_blocking(fd, False)
            while True:
                try:
                    data = os.read(fd, CHUNK)
                except (BlockingIOError, OSError):
                    break
                if not data:
                    break
                room = limit - counts[idx]
                counts[idx] += len(data)
                if room > 0:
                    frame(kind, data[:room])
            os.set_blocking(fd, True)
        dropped = send_artifacts()
        files_dropped = 0
        if files_before is not None:
            files_before, files_dropped = send_files(workdir, files_before)
        for name in os.listdir(FIGURES) if os.path.isdir(FIGURES) else []:
            try:
                os.unlink(os.path.join(FIGURES, name))
            except OSError:
                pass
        cpu1 = cpu_ns()
        report = {
            "exit_code": 0 if (status or {}).get("ok") else 1,
            "signal": None,
            "cpu_ms": (cpu1 - cpu0) // 1000000 if cpu0 is not None and cpu1 is not None else None,
            "peak_memory_bytes": peak_memory(),
            "oom_kills": max(0, (oom_kills() or 0) - oom0),
            "stdout_bytes": counts[0],
            "stderr_bytes": counts[1],
            "artifacts_dropped": dropped,
            "files_dropped": files_dropped,
        }
        if exited is not None:
            # The interpreter is gone (exit(), sys.exit(), a crash): so is the session.
            report["exit_code"] = os.WEXITSTATUS(exited) if os.WIFEXITED(exited) else None
            report["signal"] = os.WTERMSIG(exited) if os.WIFSIGNALED(exited) else None
            report["ended"] = True
            frame(b"X", json.dumps(report).encode())
            return
        frame(b"X", json.dumps(report).encode())


def seed_matplotlib_cache():
    """Copy the font cache built into the image to the writable config dir (the root is
    read-only), so that the first `import matplotlib` does not rebuild it."""
    seed = "/opt/mcp-code-executor/mplconfig"
    target = os.environ.get("MPLCONFIGDIR")
    if target and os.path.isdir(seed) and not os.path.exists(target):
        try:
            shutil.copytree(seed, target)
        except OSError:
            pass


# After the code exits, what it left running may hold its pipes open: this long at most.
EXIT_GRACE = 0.5


def wait_for_job(limit):
    """Block until stdin has data; exit quietly if none comes within `limit` seconds (a
    pool container whose server is gone)."""
    if limit is None:
        return
    import select

    ready, _, _ = select.select([sys.stdin.buffer.fileno()], [], [], limit)
    if not ready:
        os._exit(0)


def main():
    not_dumpable()
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    # As PID 1 the runner only receives the signals it handles: Python's own SIGINT
    # handler would let the code interrupt it, so it goes.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    default_python = sys.argv[1] if len(sys.argv) > 1 else "/usr/bin/python3"
    try:
        wait_limit = float(os.environ.pop("MCPX_WAIT_LIMIT"))
    except (KeyError, ValueError):
        wait_limit = None
    seed_matplotlib_cache()
    try:
        child = Child(default_python, "/workspace")
    except OSError as e:
        fail("could not start the interpreter: %s" % e)
    frame(b"R")
    wait_for_job(wait_limit)
    stdin = sys.stdin.buffer
    try:
        (hlen,) = struct.unpack(">I", read_exact(stdin, 4))
        header = json.loads(read_exact(stdin, hlen).decode())
        archive = read_exact(stdin, int(header["tar_len"]))
    except (EOFError, ValueError, KeyError) as e:
        fail("bad job input: %s" % e)

    workdir = header.get("workdir", "/workspace")
    try:
        safe_extract(archive, workdir)
    except OSError as e:
        fail("could not unpack the job into %s: %s (the workspace size limit?)" % (workdir, e))
    del archive
    return_files = bool(header.get("return_files"))
    files_before = snapshot(workdir) if return_files else None

    limit = int(header.get("output_limit", 1 << 20))
    python = header.get("python", default_python)
    deadline_s = header.get("deadline_s")
    oom_before = oom_kills() or 0

    # Wake the select loop on SIGCHLD so the exit is seen at once.
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)

    if header.get("mode") == "session":
        child.discard()
        try:
            repl = Child(python, workdir, REPL_STUB)
        except OSError as e:
            fail("could not start %s: %s" % (python, e))
        session(repl, limit, wake_r, workdir, files_before)
        return

    if python != child.python:
        child.discard()
        try:
            child = Child(python, workdir)
        except OSError as e:
            fail("could not start %s: %s" % (python, e))
    pid, out_r, err_r = child.pid, child.out_r, child.err_r
    deadline = time.monotonic() + float(deadline_s) if deadline_s else None
    timed_out = False
    exited_at = None
    try:
        child.go(header["entry"])
    except OSError:
        pass  # the interpreter died at start-up: its stderr and status say why

    sel = selectors.DefaultSelector()
    sel.register(out_r, selectors.EVENT_READ, (b"O", 0))
    sel.register(err_r, selectors.EVENT_READ, (b"E", 1))
    sel.register(wake_r, selectors.EVENT_READ, None)
    counts = [0, 0]
    status = None

    def pump(fd, kind, idx):
        try:
            data = os.read(fd, CHUNK)
        except OSError:
            data = b""
        if not data:
            sel.unregister(fd)
            os.close(fd)
            return
        room = limit - counts[idx]
        counts[idx] += len(data)
        if room > 0:
            frame(kind, data[:room])

    while True:
        open_pipes = [k for k in sel.get_map().values() if k.data is not None]
        if status is not None and not open_pipes:
            break
        now = time.monotonic()
        if status is not None and now - exited_at > EXIT_GRACE:
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
                    os.read(wake_r, 512)
                except OSError:
                    pass
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

    dropped = send_artifacts()
    files_dropped = 0
    if files_before is not None:
        files_dropped = send_files(workdir, files_before)[1]
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    exit_code = os.WEXITSTATUS(status) if os.WIFEXITED(status) else None
    sig = os.WTERMSIG(status) if os.WIFSIGNALED(status) else None
    report = {
        "exit_code": exit_code,
        "signal": sig,
        "timed_out": timed_out,
        "cpu_ms": int((usage.ru_utime + usage.ru_stime) * 1000),
        "peak_memory_bytes": peak_memory() or usage.ru_maxrss * 1024,
        "oom_kills": max(0, (oom_kills() or 0) - oom_before),
        "stdout_bytes": counts[0],
        "stderr_bytes": counts[1],
        "artifacts_dropped": dropped,
        "files_dropped": files_dropped,
    }
    frame(b"X", json.dumps(report).encode())


if __name__ == "__main__":
    main()
