"""The runner's only output channel: frames on stdout (kind, u32 length, payload), and
exact reads of what the server sends on stdin."""

import json
import os
import struct
import sys

OUT = sys.stdout.buffer


def frame(kind, payload=b""):
    OUT.write(kind + struct.pack(">I", len(payload)) + payload)
    OUT.flush()


def named(kind, name, data):
    """A frame whose payload is `u16 name length, name, bytes` (`A`, `W`)."""
    frame(kind, struct.pack(">H", len(name)) + name + data)


def report(fields):
    """The final report of a run or a session message (`X`)."""
    frame(b"X", json.dumps(fields).encode())


def fail(message):
    """The job cannot be run at all (`F`): the runner exits."""
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


def read_message(stream):
    """`u32 length, JSON`: the job header, a session's cell or files message."""
    (n,) = struct.unpack(">I", read_exact(stream, 4))
    return json.loads(read_exact(stream, n).decode())


class Inbox:
    """The runner's stdin, read straight from fd 0 with a buffer of its own, so that a
    select on the fd never misses bytes already read (a `BufferedReader` would hide them).
    `read(n)` behaves like a raw stream (`read_exact` and `read_message` take it); while
    code runs, `fill` takes what the server sent (code mode's answers, see `toolrelay`)
    and `take_tool_answers` the complete ones at the front (egress's `net` messages go
    to `on_net` on the way)."""

    def __init__(self, fd=0):
        self.fd = fd
        self.buf = bytearray()
        self.eof = False
        # Egress's streams (see `netrelay`): called with each `net` message and its bytes.
        self.on_net = None

    def fileno(self):
        return self.fd

    def read(self, n):
        if self.buf:
            out = bytes(self.buf[:n])
            del self.buf[:n]
            return out
        if self.eof:
            return b""
        data = os.read(self.fd, min(n, 1 << 20))
        if not data:
            self.eof = True
        return data

    def fill(self):
        """One read of what the fd holds (select said it is readable); False at EOF."""
        try:
            # 64 KiB: a read of 1 MiB maps and unmaps a buffer each time (two more system
            # calls, slow under gVisor), also for the EOF every run without tools ends in.
            data = os.read(self.fd, 1 << 16)
        except OSError:
            data = b""
        if not data:
            self.eof = True
            return False
        self.buf += data
        return True

    def take_tool_answers(self):
        """The code-mode answers complete at the front of the buffer (JSON objects of
        kind `tool`); stops at the first message of another kind, which stays buffered
        for whoever reads messages next (True in the second value when one waits)."""
        answers = []
        while len(self.buf) >= 4:
            (n,) = struct.unpack(">I", bytes(self.buf[:4]))
            if len(self.buf) < 4 + n:
                break
            try:
                msg = json.loads(bytes(self.buf[4 : 4 + n]).decode())
            except ValueError:
                msg = None
            if isinstance(msg, dict) and msg.get("kind") == "net":
                size = int(msg.get("len", 0))
                if len(self.buf) < 4 + n + size:
                    break
                data = bytes(self.buf[4 + n : 4 + n + size])
                del self.buf[: 4 + n + size]
                if self.on_net is not None:
                    self.on_net(msg, data)
                continue
            if not isinstance(msg, dict) or msg.get("kind") != "tool":
                return answers, True
            del self.buf[: 4 + n]
            answers.append(msg)
        return answers, False


INBOX = Inbox(0)
