"""Egress (#41): the code's only way out. When the job says `egress`, the runner listens
on 127.0.0.1:PORT (the sandbox has no other interface), the code is given the proxy
variables, and each connection it makes there goes to the server, whose egress proxy
decides, by one of two channels:

- **The direct channel** (Docker under runc): the server gives the sandbox a directory of
  its own, mounted read-only at SOCKET_DIR, and during a run with egress listens on
  SOCKET in it (`src/backend/egress_socket.rs`). Each of the code's connections gets one
  connection to SOCKET and the runner moves bytes both ways as they come (`Pipe`, by
  splice where the kernel allows): no framing and no window, the kernel's socket buffers
  are the flow control, and no byte
  goes through the runner's stdin/stdout (the container runtime's attach stream, which
  cost most of the CPU of a download).
- **The relay** (the fallback, whenever SOCKET is absent or cannot be connected: on
  Kubernetes, under gVisor, with a remote daemon): each connection is a numbered stream
  over the runner's own channel (see `src/backend/relay.rs`):

  runner -> server   frame `N`: u32 stream id, 1 byte op, bytes
                       o open, d data, e eof (no more bytes this way), c close,
                       k credit (u32: the runner wrote that many more bytes to the code)
  server -> runner   stdin message `u32 length, JSON {"kind": "net", "s", "op", "len",
                     "k"}` then `len` bytes (op: data, eof, close, credit)

  Each direction of a stream has a window of WINDOW bytes: the runner reads from the code
  only while it has credit, and grants the server credit as it writes to the code, so a
  stream holds at most a window here whatever the server or the code does.

The channel is chosen per connection, when it is accepted: the server's proxy does not
care which one a connection came by.
"""

import _socket
import errno
import os
import struct

from mcp_runner import frames

PORT = 3128
WINDOW = 256 << 10
CHUNK = 65536
# Credit is granted back in batches of at least this (or when the buffer empties).
GRANT = 64 << 10

# The sandbox's own directory and the server's socket in it (the server's
# `protocol::SANDBOX_DIR` and `protocol::EGRESS_SOCKET`).
SOCKET_DIR = "/run/mcp-egress"
SOCKET = SOCKET_DIR + "/egress.sock"
# Bytes one read of a direct connection takes at most (one buffer, shared: the loop is
# single-threaded), and reads of one direction per event before the loop serves others.
SCRATCH = 256 << 10
BURST = 8
# What one way's kernel pipe holds, and one splice moves at most.
PIPE_BYTES = 256 << 10
splice = getattr(os, "splice", None)
SPLICE_FLAGS = getattr(os, "SPLICE_F_MOVE", 0) | getattr(os, "SPLICE_F_NONBLOCK", 0)

PROXY = "http://127.0.0.1:%d" % PORT
# The image's system CAs (Debian's bundle), and where the runner writes them together
# with the server's interception CA (public certificate only; its key never leaves the
# server): the bundle the code's TLS clients are pointed at.
SYSTEM_CAS = "/etc/ssl/certs/ca-certificates.crt"
BUNDLE = "/tmp/mcp-egress-ca-bundle.pem"


def proxy_env(bundle=None):
    """The variables the code's clients (requests, httpx, urllib, pip, curl) honour."""
    env = {}
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"):
        env[name] = PROXY
    if bundle is not None:
        for name in ("SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE"):
            env[name] = bundle
    return env


def write_bundle(ca_pem):
    """The image's system CAs followed by the interception CA, at BUNDLE; its path."""
    try:
        with open(SYSTEM_CAS, "rb") as f:
            system = f.read()
    except OSError:
        system = b""
    if system and not system.endswith(b"\n"):
        system += b"\n"
    with open(BUNDLE, "wb") as f:
        f.write(system + ca_pem.encode())
    return BUNDLE


def frame(sid, op, data=b""):
    frames.frame(b"N", struct.pack(">I", sid) + op + data)


class Stream:
    def __init__(self, sid, sock):
        self.sid = sid
        self.sock = sock
        self.fd = sock.fileno()
        self.out = bytearray()  # from the server, for the code
        self.credit = WINDOW  # bytes the server will still take
        self.owed = 0  # bytes written to the code, not yet granted back
        self.code_eof = False  # the code will send no more
        self.server_eof = False  # the server will send no more (shut down once `out` is out)


def connect_direct():
    """A connection to the server's egress socket, or None (absent, refused, or its
    backlog full: the connection is relayed instead)."""
    try:
        s = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    except OSError:
        return None
    s.setblocking(False)
    try:
        s.connect(SOCKET)
    except OSError:
        s.close()
        return None
    return s


class Way:
    """One direction of a direct connection. Under runc the kernel moves the bytes: `src`
    is spliced into a pipe of the way's own and the pipe into `dst`, so no byte is copied
    through the runner (its copy was a quarter of a download's CPU in the sandbox's one
    core). Where splice is refused (EINVAL before any byte moved) the way copies instead:
    bytes read from `src` not yet written to `dst` wait in `pending` (at most one read's
    worth: `src` is not read meanwhile)."""

    __slots__ = ("src", "dst", "pending", "eof", "shut", "pipe", "held", "moved")

    def __init__(self, src, dst):
        self.src = src
        self.dst = dst
        self.pending = None
        self.eof = False  # `src` is at its end
        self.shut = False  # ... and `dst` was told (SHUT_WR)
        self.pipe = kernel_pipe()  # (read end, write end), or None: copy
        self.held = 0  # bytes in the pipe, not yet spliced into `dst`
        self.moved = False

    def waiting(self):
        """Bytes read from `src` wait for `dst` to take them."""
        return bool(self.held or self.pending)

    def close(self):
        if self.pipe is not None:
            for fd in self.pipe:
                os.close(fd)
            self.pipe = None

    def pump(self, scratch, view):
        """Move what can be moved now, BURST reads at most; False when a socket broke."""
        for _ in range(BURST):
            stopped = self.flush()
            if stopped is not None:
                return stopped
            if self.eof:
                if not self.shut:
                    self.shut = True
                    try:
                        self.dst.shutdown(_socket.SHUT_WR)
                    except OSError:
                        pass
                return True
            try:
                if self.pipe is not None:
                    n = splice(self.src.fileno(), self.pipe[1], PIPE_BYTES, flags=SPLICE_FLAGS)
                else:
                    n = self.src.recv_into(scratch)
            except (BlockingIOError, InterruptedError):
                return True
            except OSError as e:
                if self.pipe is not None and e.errno == errno.EINVAL and not self.moved:
                    self.close()  # splice refused: copy from now on
                    continue
                return False
            if n == 0:
                self.eof = True
                continue
            self.moved = True
            if self.pipe is not None:
                self.held = n
                continue
            try:
                m = self.dst.send(view[:n], _socket.MSG_NOSIGNAL)
            except (BlockingIOError, InterruptedError):
                m = 0
            except OSError:
                return False
            if m < n:
                self.pending = bytes(view[m:n])
                return True
        return True

    def flush(self):
        """Write what waits into `dst`: None once nothing waits, else True (`dst` is
        full for now) or False (`dst` broke)."""
        try:
            while self.held:
                self.held -= splice(self.pipe[0], self.dst.fileno(), self.held, flags=SPLICE_FLAGS)
            if self.pending:
                n = self.dst.send(self.pending, _socket.MSG_NOSIGNAL)
                self.pending = self.pending[n:] if n < len(self.pending) else None
        except (BlockingIOError, InterruptedError):
            return True
        except OSError:
            return False
        return True if self.pending else None


def kernel_pipe():
    """A non-blocking pipe of PIPE_BYTES (if the kernel grants it) for splicing, or None
    when this Python or kernel has no splice."""
    if splice is None:
        return None
    try:
        r, w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        import fcntl

        fcntl.fcntl(w, fcntl.F_SETPIPE_SZ, PIPE_BYTES)
    except (ImportError, AttributeError, OSError):
        pass  # the default size (64 KiB) still works
    return r, w


class Pipe:
    """A connection of the code joined to its own connection to the server's socket."""

    def __init__(self, code, server):
        self.code = code
        self.server = server
        self.up = Way(code, server)
        self.down = Way(server, code)

    def done(self):
        return self.up.shut and self.down.shut

    def wants(self, fd):
        """(read, write) for `fd`, one of the pipe's two."""
        out, into = (self.up, self.down) if fd == self.code.fileno() else (self.down, self.up)
        return (not out.waiting() and not out.eof, into.waiting())


class Net:
    """The listener and the streams; `attach` puts them in a select loop's Watch."""

    def __init__(self):
        s = _socket.socket(_socket.AF_INET, _socket.SOCK_STREAM)
        s.setsockopt(_socket.SOL_SOCKET, _socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", PORT))
        s.listen(128)
        s.setblocking(False)
        self.listener = s
        self.streams = {}
        self.by_fd = {}
        self.next_id = 1
        self.sel = None
        # Direct connections by fd (each pipe under both of its fds).
        self.pipes = {}
        self.scratch = bytearray(SCRATCH)
        self.view = memoryview(self.scratch)

    def attach(self, sel):
        self.sel = sel
        sel.register(self.listener.fileno(), "net")
        frames.INBOX.on_net = self.from_server

    def reset(self):
        """The cell (or run) ended: the server ended its streams; drop ours."""
        for st in list(self.streams.values()):
            self.drop(st, tell=False)
        for pipe in set(self.pipes.values()):
            self.unpipe(pipe)

    # The select loop calls this for every fd tagged "net".
    def event(self, fd):
        if fd == self.listener.fileno():
            self.accept()
            return
        pipe = self.pipes.get(fd)
        if pipe is not None:
            self.pump(pipe)
            return
        st = self.by_fd.get(fd)
        if st is None:
            return
        self.flush(st)
        if st.sid in self.streams:
            self.read(st)

    def accept(self):
        while True:
            try:
                fd, _ = self.listener._accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                return
            # `_socket`'s accept gives the fd (its Python layer is not loaded, see `child`).
            sock = _socket.socket(_socket.AF_INET, _socket.SOCK_STREAM, 0, fd)
            sock.setblocking(False)
            server = connect_direct()
            if server is not None:
                pipe = Pipe(sock, server)
                for s in (sock, server):
                    self.pipes[s.fileno()] = pipe
                    self.sel.register(s.fileno(), "net")
                self.pump(pipe)
                continue
            st = Stream(self.next_id, sock)
            self.next_id += 1
            self.streams[st.sid] = st
            self.by_fd[st.fd] = st
            self.sel.register(st.fd, "net")
            frame(st.sid, b"o")

    def pump(self, pipe):
        """Move a direct connection's bytes both ways; close it once both ends are done
        or either broke."""
        if not (pipe.up.pump(self.scratch, self.view) and pipe.down.pump(self.scratch, self.view)):
            self.unpipe(pipe)
            return
        if pipe.done():
            self.unpipe(pipe)
            return
        for s in (pipe.code, pipe.server):
            fd = s.fileno()
            read, write = pipe.wants(fd)
            if not read and not write:
                # As for streams (`interest`): a hang-up would wake the loop in vain.
                if fd in self.sel.tags:
                    self.sel.unregister(fd)
                continue
            if fd not in self.sel.tags:
                self.sel.register(fd, "net")
            self.sel.want(fd, read, write)

    def unpipe(self, pipe):
        pipe.up.close()
        pipe.down.close()
        for s in (pipe.code, pipe.server):
            fd = s.fileno()
            self.pipes.pop(fd, None)
            if self.sel is not None and fd in self.sel.tags:
                self.sel.unregister(fd)
            try:
                s.close()
            except OSError:
                pass

    def interest(self, st):
        read = st.credit > 0 and not st.code_eof
        write = bool(st.out)
        if not read and not write:
            # Nothing to wait for from the code now (it is done, or its window is used up
            # until the server grants credit): a hang-up would wake the loop in vain, over
            # and over (poll reports one whatever is asked). Credit or data registers it
            # again.
            if st.fd in self.sel.tags:
                self.sel.unregister(st.fd)
            return
        if st.fd not in self.sel.tags:
            self.sel.register(st.fd, "net")
        self.sel.want(st.fd, read, write)

    def read(self, st):
        if st.code_eof or st.credit <= 0:
            self.interest(st)
            return
        try:
            data = st.sock.recv(min(CHUNK, st.credit))
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = None
        if data is None:
            frame(st.sid, b"c")
            self.drop(st, tell=False)
            return
        if not data:
            st.code_eof = True
            frame(st.sid, b"e")
        else:
            st.credit -= len(data)
            frame(st.sid, b"d", data)
        self.interest(st)

    def flush(self, st):
        if st.out:
            try:
                n = st.sock.send(st.out, _socket.MSG_NOSIGNAL)
            except (BlockingIOError, InterruptedError):
                n = 0
            except OSError:
                frame(st.sid, b"c")
                self.drop(st, tell=False)
                return
            del st.out[:n]
            st.owed += n
        if st.owed and (st.owed >= GRANT or not st.out):
            frame(st.sid, b"k", struct.pack(">I", st.owed))
            st.owed = 0
        if st.server_eof and not st.out:
            try:
                st.sock.shutdown(_socket.SHUT_WR)
            except OSError:
                pass
            st.server_eof = False
            if st.code_eof:
                self.drop(st, tell=True)
                return
        self.interest(st)

    def drop(self, st, tell):
        if tell:
            frame(st.sid, b"c")
        self.streams.pop(st.sid, None)
        self.by_fd.pop(st.fd, None)
        if self.sel is not None and st.fd in self.sel.tags:
            self.sel.unregister(st.fd)
        try:
            st.sock.close()
        except OSError:
            pass

    def from_server(self, msg, data):
        st = self.streams.get(msg.get("s"))
        if st is None:
            return
        op = msg.get("op")
        if op == "data":
            if len(st.out) + len(data) > WINDOW:
                # The server overran the window it was given: the stream goes.
                self.drop(st, tell=True)
                return
            st.out += data
            self.flush(st)
        elif op == "credit":
            st.credit = min(WINDOW, st.credit + int(msg.get("k", 0)))
            self.interest(st)
        elif op == "eof":
            st.server_eof = True
            self.flush(st)
        elif op == "close":
            self.drop(st, tell=False)


NET = None


def start(job):
    """Listen when the job asks for egress (before the code runs); the variables to give
    the code, or an empty dict."""
    global NET
    if not job.egress:
        return {}
    try:
        NET = Net()
    except OSError as e:
        frames.fail("could not listen for the code's connections on 127.0.0.1:%d: %s" % (PORT, e))
    bundle = None
    if job.egress_ca:
        try:
            bundle = write_bundle(job.egress_ca)
        except OSError as e:
            frames.fail("could not write the egress CA bundle %s: %s" % (BUNDLE, e))
    return proxy_env(bundle)
