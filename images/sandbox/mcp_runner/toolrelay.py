"""Code mode (issue #26): the user's code calls the tools of other MCP servers through the
`tools` package (`tools/__init__.py`, on the interpreter's path), which writes requests to
fd 5 of the interpreter, one end of a socket pair (see `child`). The runner only relays:

  interpreter -> runner   u32 length, JSON request ({"id", "op": "catalog" | "call", ...})
  runner -> server        frame `T` whose payload is that JSON, as the code wrote it
  server -> runner        a stdin message `u32 length, JSON {"kind": "tool", "id", ...}`
  runner -> interpreter   u32 length, that JSON

The runner understands nothing of a request beyond its size: the server checks every one
(a request the code forges is just another request). When the server keeps no channel
open for answers (stdin closed: code mode is off for this run), the runner answers
itself: an empty catalog, and an error for each call.
"""

import json
import struct

from mcp_runner import frames

# Bytes of one request, at most: a larger one ends the relay for this interpreter (its
# calls then fail at once in the interpreter).
MAX_REQUEST = 4 << 20

OFF = "code mode is not available in this run (no tools are configured for this server)"


class Relay:
    def __init__(self, sock, inbox):
        self.sock = sock
        self.fd = sock.fileno()
        self.inbox = inbox
        self.pending = bytearray()
        self.closed = False

    def from_code(self):
        """The interpreter's socket is readable: relay each complete request. False when
        it is closed (the interpreter is gone or broke the framing)."""
        try:
            # 64 KiB at a time: a 1 MiB buffer was mapped and unmapped for every run,
            # also when the socket only says the interpreter is gone.
            data = self.sock.recv(1 << 16)
        except OSError:
            data = b""
        if not data:
            self.closed = True
            return False
        self.pending += data
        while len(self.pending) >= 4:
            (n,) = struct.unpack(">I", bytes(self.pending[:4]))
            if n > MAX_REQUEST:
                self.closed = True
                self.pending = bytearray()
                try:
                    self.sock.close()
                except OSError:
                    pass
                return False
            if len(self.pending) < 4 + n:
                break
            body = bytes(self.pending[4 : 4 + n])
            del self.pending[: 4 + n]
            if self.inbox.eof:
                self.answer_locally(body)
            else:
                frames.frame(b"T", body)
        return True

    def answer_locally(self, body):
        try:
            req = json.loads(body.decode())
            rid = req.get("id")
            op = req.get("op")
        except (ValueError, UnicodeDecodeError, AttributeError):
            return
        if op == "catalog":
            self.to_code({"kind": "tool", "id": rid, "servers": []})
        else:
            self.to_code(
                {"kind": "tool", "id": rid, "error": {"type": "ToolError", "message": OFF}}
            )

    def to_code(self, answer):
        if self.closed:
            return
        body = json.dumps(answer).encode()
        try:
            self.sock.sendall(struct.pack(">I", len(body)) + body)
        except OSError:
            self.closed = True

    def from_server(self):
        """stdin is readable: pass on the answers. Returns (open, other): `open` False at
        EOF, `other` True when a message that is not an answer waits in the inbox."""
        if not self.inbox.fill():
            return False, False
        answers, other = self.inbox.take_tool_answers()
        for a in answers:
            self.to_code(a)
        return True, other


def make(child):
    return Relay(child.tools, frames.INBOX)
