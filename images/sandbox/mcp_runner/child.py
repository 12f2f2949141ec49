"""The user's interpreter: a child process started before the job arrives, with a stub
(see `stubs`) that waits on fd 3 for what to run. Its stdout, stderr and (in a session)
status line come back through pipes only the runner reads."""

import os
import signal
import struct

# The C module: `socket`'s Python layer (with `selectors`, `enum` and `array` behind it) cost
# every sandbox 10-20 ms before it was ready under gVisor, for a socket pair.
import _socket

from mcp_runner.stubs import STUB


# The most of the entry file's bytes sent with it (see `Child.go`): what one write to an
# empty pipe takes whole on Linux and gVisor (64 KiB), less the name and nonce.
GO_SOURCE_MAX = 60000


def env_lines(env):
    """The variables a run or session sets first (egress's proxy: `NAME=VALUE` lines; with
    any, `NO_PROXY` is unset, so that no host bypasses the proxy)."""
    lines = "".join("%s=%s\n" % kv for kv in (env or {}).items())
    if env:
        lines += "-NO_PROXY\n-no_proxy\n"
    return lines.encode()


class Child:
    """The user's interpreter, started and waiting for the file to run.

    fds in the child: 0 /dev/null, 1 and 2 pipes to `out_r` / `err_r`, 3 the read end of
    `go_w` (the file to run, or a session's cells), 4 the write end of `st_r` (a session's
    status lines), 5 one end of a socket pair whose other end is `tools` (code mode's
    requests and answers, see `toolrelay`); nothing else stays open."""

    def __init__(self, python, workdir, stub=None):
        self.python = python
        go_r, self.go_w = os.pipe()
        self.out_r, out_w = os.pipe()
        self.err_r, err_w = os.pipe()
        self.st_r, st_w = os.pipe()
        self.tools, tools_child = _socket.socketpair(_socket.AF_UNIX, _socket.SOCK_STREAM)
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
                os.dup2(tools_child.fileno(), 5)
                os.set_inheritable(5, True)
                os.closerange(6, 1 << 16)
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
        tools_child.close()

    def go(self, path, nonce, source=None, env=None):
        """Run the file `path` (a one-shot run): the stub reads it, the run's `nonce`
        (which its done line names on the status channel, see `run`), the variables to
        set first (`env`: egress's proxy, see `env_lines`) and, when given and small
        enough for the pipe, the file's bytes (`source`, so that it need not open and read
        the file: five system calls) up to EOF."""
        msg = b"R" + (path + "\0" + nonce + "\0").encode() + env_lines(env)
        if source is not None and len(source) <= GO_SOURCE_MAX:
            msg += b"\0" + source
        os.write(self.go_w, msg)
        os.close(self.go_w)

    def serve(self, env=None):
        """Make the waiting interpreter a session's (its cells follow on `go_w`, see
        `session.run_cell`), with what it preloaded still loaded, and the variables `env`
        set (see `env_lines`)."""
        lines = env_lines(env)
        os.write(self.go_w, b"S" + struct.pack(">I", len(lines)) + lines)

    def discard(self):
        for fd in (self.go_w, self.out_r, self.err_r, self.st_r):
            try:
                os.close(fd)
            except OSError:
                pass
        self.tools.close()
        try:
            os.kill(self.pid, signal.SIGKILL)
            os.waitpid(self.pid, 0)
        except OSError:
            pass
