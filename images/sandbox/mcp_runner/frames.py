"""The runner's only output channel: frames on stdout (kind, u32 length, payload), and
exact reads of what the server sends on stdin."""

import json
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
