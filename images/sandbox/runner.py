"""The sandbox runner: PID 1 of every execution container.

Protocol (all integers big-endian):

  stdin   u32 header length, JSON header, then exactly `tar_len` bytes of a tar archive
          that holds regular files only (the server builds it).
  stdout  frames: 1 byte kind, u32 payload length, payload.
            b"R"  ready: the runner is up and waiting for its job (empty payload)
            b"O"  a chunk of the user's stdout
            b"E"  a chunk of the user's stderr
            b"X"  the final report, JSON: exit_code, signal, cpu_ms, peak_memory_bytes,
                  oom_kills, stdout_bytes, stderr_bytes
            b"F"  the runner could not run the job, JSON: {"error": "..."}

The user's code runs as a child process whose stdout/stderr are pipes read here, so
nothing it writes can forge a frame: the runner is not dumpable (its /proc entries are
root-owned, unreachable for the same uid) and, as PID 1 of its pid namespace, it
cannot be signalled by its children. Past `output_limit` bytes a stream is drained
and counted but not forwarded, so a flood costs the user's CPU quota and nothing else.

Written for any Python 3.6+ and the standard library only, started with -I -S.
"""

import ctypes
import json
import os
import resource
import selectors
import shutil
import signal
import struct
import sys
import tarfile

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


def main():
    not_dumpable()
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    frame(b"R")
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

    mpl_seed = "/opt/mcp-code-executor/mplconfig"
    mpl_dir = os.environ.get("MPLCONFIGDIR")
    if mpl_dir and os.path.isdir(mpl_seed) and not os.path.exists(mpl_dir):
        try:
            shutil.copytree(mpl_seed, mpl_dir)
        except OSError:
            pass

    limit = int(header.get("output_limit", 1 << 20))
    argv = header["argv"]
    oom_before = oom_kills() or 0

    # Wake the select loop on SIGCHLD so the exit is seen at once.
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)

    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    devnull = os.open(os.devnull, os.O_RDONLY)
    try:
        pid = os.fork()
    except OSError as e:
        fail("could not start the code: %s" % e)
    if pid == 0:
        try:
            os.dup2(devnull, 0)
            os.dup2(out_w, 1)
            os.dup2(err_w, 2)
            os.closerange(3, 1 << 16)
            signal.signal(signal.SIGPIPE, signal.SIG_DFL)
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            os.chdir(workdir)
            os.execv(argv[0], argv)
        except BaseException as e:
            os.write(2, ("could not start %s: %s\n" % (argv[0], e)).encode())
        os._exit(127)
    for fd in (out_w, err_w, devnull):
        os.close(fd)

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
        # Once the code has exited, whatever it left running may hold the pipes open:
        # give them a short grace to flush, then report.
        events = sel.select(timeout=None if status is None else 0.05)
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

    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    exit_code = os.WEXITSTATUS(status) if os.WIFEXITED(status) else None
    sig = os.WTERMSIG(status) if os.WIFSIGNALED(status) else None
    report = {
        "exit_code": exit_code,
        "signal": sig,
        "cpu_ms": int((usage.ru_utime + usage.ru_stime) * 1000),
        "peak_memory_bytes": peak_memory() or usage.ru_maxrss * 1024,
        "oom_kills": max(0, (oom_kills() or 0) - oom_before),
        "stdout_bytes": counts[0],
        "stderr_bytes": counts[1],
    }
    frame(b"X", json.dumps(report).encode())


if __name__ == "__main__":
    main()
