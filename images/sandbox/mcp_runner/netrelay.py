"""Egress (#41): the code's only way out. When the job says `egress`, the runner listens
on 127.0.0.1:PORT (the sandbox has no other interface), the code is given the proxy
variables, and each connection it makes there goes to the server, whose egress proxy
decides, by one of two channels:

- **The direct channel** (Docker under runc): the server gives the sandbox a directory of
  its own, mounted read-only at SOCKET_DIR, and during a run with egress listens on
  SOCKET in it (`src/backend/egress_socket.rs`). The runner hands each of the code's
  connections over: one connection to SOCKET carrying one byte and the accepted socket's
  descriptor (SCM_RIGHTS), then closes its own copies. The server reads and writes the
  code's socket itself: no byte goes through the runner (its copy, then its splice loop,
  spent the sandbox's one CPU beside the code's own client) nor through its stdin/stdout.
- **The relay** (the fallback, whenever SOCKET is absent or cannot be connected or the
  descriptor cannot be passed: on Kubernetes, under gVisor, with a remote daemon): each
  connection is a numbered stream over the runner's own channel (see
  `src/backend/relay.rs`):

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


def hand_over(sock):
    """Hand the code's connection `sock` to the server over SOCKET (the direct channel);
    False when the socket is absent, refused (its backlog full) or the descriptor cannot be
    passed: the connection is relayed instead. The caller closes `sock` either way once
    this says True."""
    try:
        s = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    except OSError:
        return False
    try:
        s.setblocking(False)
        s.connect(SOCKET)
        fd = struct.pack("i", sock.fileno())
        return s.sendmsg([b"F"], [(_socket.SOL_SOCKET, _socket.SCM_RIGHTS, fd)]) == 1
    except OSError:
        return False
    finally:
        s.close()


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

    def attach(self, sel):
        self.sel = sel
        sel.register(self.listener.fileno(), "net")
        frames.INBOX.on_net = self.from_server

    def reset(self):
        """The cell (or run) ended: the server ended its streams; drop ours."""
        for st in list(self.streams.values()):
            self.drop(st, tell=False)

    # The select loop calls this for every fd tagged "net".
    def event(self, fd):
        if fd == self.listener.fileno():
            self.accept()
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
            if hand_over(sock):
                sock.close()  # the server has it now
                continue
            st = Stream(self.next_id, sock)
            self.next_id += 1
            self.streams[st.sid] = st
            self.by_fd[st.fd] = st
            self.sel.register(st.fd, "net")
            frame(st.sid, b"o")

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
