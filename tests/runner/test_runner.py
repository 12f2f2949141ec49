"""Unit tests of the sandbox runner (images/sandbox/mcp_runner) that need no container:
the frames on stdout and exact reads of stdin, the tar extractor's refusals and its
handling of what hostile code leaves in a workspace, the walk's bounds, the names fit to
show, and what a run may return (the budget). Run by scripts/test.sh with the host's
Python 3 (the runner's modules use the standard library only):

    python3 -m unittest discover -s tests/runner -v
"""

import io
import json
import os
import signal
import struct
import sys
import tarfile
import tempfile
import threading
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
RUNNER_DIR = os.path.join(HERE, "..", "..", "images", "sandbox")
sys.path.insert(0, RUNNER_DIR)

from mcp_runner import cgroup, figures, frames, limits, netrelay, output, preload, run, workspace  # noqa: E402
from mcp_runner.watch import Watch  # noqa: E402
from mcp_runner.child import Child  # noqa: E402
from mcp_runner.job import read_job  # noqa: E402
from mcp_runner.stubs import STUB  # noqa: E402


def tar_of(*entries):
    """A tar archive in memory: (name, bytes) for a file, (name, None) for a directory,
    (name, "->target") for a symlink."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data in entries:
            info = tarfile.TarInfo(name)
            if data is None:
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            elif isinstance(data, str) and data.startswith("->"):
                info.type = tarfile.SYMTYPE
                info.linkname = data[2:]
                tar.addfile(info)
            else:
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def parse_frames(raw):
    """[(kind, payload)] of a framed stream; fails on a torn frame."""
    out, at = [], 0
    while at < len(raw):
        kind = raw[at:at + 1]
        (n,) = struct.unpack(">I", raw[at + 1:at + 5])
        payload = raw[at + 5:at + 5 + n]
        assert len(payload) == n, "a torn frame"
        out.append((kind, payload))
        at += 5 + n
    return out


class CapturedFrames:
    """frames.OUT redirected to memory for the duration of a `with`."""

    def __enter__(self):
        self.saved, frames.OUT = frames.OUT, io.BytesIO()
        return self

    def __exit__(self, *exc):
        self.raw, frames.OUT = frames.OUT.getvalue(), self.saved


class FramesTest(unittest.TestCase):
    def test_frames_are_kind_length_payload(self):
        with CapturedFrames() as c:
            frames.frame(b"O", b"hello")
            frames.frame(b"R")
            frames.named(b"W", "dir/é.txt".encode(), b"\x00\x01")
            frames.report({"exit_code": 0})
        got = parse_frames(c.raw)
        self.assertEqual([k for k, _ in got], [b"O", b"R", b"W", b"X"])
        self.assertEqual(got[0][1], b"hello")
        self.assertEqual(got[1][1], b"")
        name_len = struct.unpack(">H", got[2][1][:2])[0]
        self.assertEqual(got[2][1][2:2 + name_len].decode(), "dir/é.txt")
        self.assertEqual(got[2][1][2 + name_len:], b"\x00\x01")
        self.assertEqual(json.loads(got[3][1]), {"exit_code": 0})

    def test_fail_sends_f_and_exits(self):
        with CapturedFrames() as c:
            with self.assertRaises(SystemExit):
                frames.fail("no such interpreter")
        self.assertEqual(parse_frames(c.raw), [(b"F", b'{"error": "no such interpreter"}')])

    def test_messages_are_read_exactly_across_short_reads(self):
        class Trickle(io.RawIOBase):
            """Gives at most 3 bytes per read, as a pipe may."""

            def __init__(self, data):
                self.data = data

            def read(self, n=-1):
                chunk, self.data = self.data[:min(n, 3)], self.data[min(n, 3):]
                return chunk

        body = json.dumps({"kind": "cell", "code": "x = 1\n" * 50}).encode()
        stream = Trickle(struct.pack(">I", len(body)) + body + b"rest")
        self.assertEqual(frames.read_message(stream)["kind"], "cell")
        self.assertEqual(frames.read_exact(stream, 4), b"rest")
        with self.assertRaises(EOFError):
            frames.read_exact(stream, 1)

    def test_a_job_is_read_whole_or_in_pieces_and_what_follows_stays_buffered(self):
        tar = tar_of(("main.py", b"print(1)"))
        header = json.dumps({"tar_len": len(tar), "python": "/p", "entry": "main.py",
                             "workdir": "/w", "output_limit": 10}).encode()
        job_bytes = struct.pack(">I", len(header)) + header + tar
        cell = json.dumps({"kind": "cell", "code": "1"}).encode()
        for pieces in ([job_bytes + struct.pack(">I", len(cell)) + cell],
                       [job_bytes[:3], job_bytes[3:700], job_bytes[700:]]):
            r, w = os.pipe()
            try:
                inbox = frames.Inbox(r)
                os.write(w, pieces[0])
                feeder = threading.Timer(0.05, lambda: [os.write(w, p) for p in pieces[1:]])
                feeder.start()
                job, archive = read_job(inbox, "/default")
                feeder.join()
                self.assertEqual((job.entry, job.python, job.tar_len), ("main.py", "/p", len(tar)))
                self.assertEqual(archive, tar)
                if len(pieces) == 1:
                    # A message that came with the job is the next one read.
                    self.assertEqual(frames.read_message(inbox)["code"], "1")
            finally:
                os.close(r)
                os.close(w)


class UnpackTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.dest = os.path.join(self.tmp.name, "ws")
        os.mkdir(self.dest)

    def tearDown(self):
        self.tmp.cleanup()

    def test_regular_files_and_directories_are_written(self):
        written = []
        workspace.unpack(tar_of(("a.txt", b"hi"), ("d", None), ("d/b.bin", b"\x00" * 10)),
                         self.dest, written)
        self.assertEqual(written, ["a.txt", "d/b.bin"])
        with open(os.path.join(self.dest, "d", "b.bin"), "rb") as f:
            self.assertEqual(f.read(), b"\x00" * 10)
        self.assertEqual(os.stat(os.path.join(self.dest, "a.txt")).st_mode & 0o777, 0o644)

    def test_escapes_links_and_odd_entries_are_refused(self):
        for bad in (("../up.txt", b"x"), ("/abs.txt", b"x"), ("a/../../up", b"x"),
                    ("link", "->/etc/passwd")):
            with self.subTest(entry=bad[0]):
                with self.assertRaises(workspace.Refused):
                    workspace.unpack(tar_of(bad), self.dest, [])
        self.assertEqual(os.listdir(self.dest), [])
        self.assertFalse(os.path.exists(os.path.join(self.tmp.name, "up.txt")))

    def test_a_planted_symlink_is_replaced_not_followed(self):
        outside = os.path.join(self.tmp.name, "outside.txt")
        with open(outside, "w") as f:
            f.write("keep")
        os.symlink(outside, os.path.join(self.dest, "a.txt"))
        workspace.unpack(tar_of(("a.txt", b"new")), self.dest, [])
        with open(outside) as f:
            self.assertEqual(f.read(), "keep", "the symlink's target was written through")
        self.assertFalse(os.path.islink(os.path.join(self.dest, "a.txt")))

    def test_a_symlinked_directory_is_not_entered(self):
        os.mkdir(os.path.join(self.tmp.name, "elsewhere"))
        os.symlink(os.path.join(self.tmp.name, "elsewhere"), os.path.join(self.dest, "d"))
        with self.assertRaises(OSError):
            workspace.unpack(tar_of(("d/x.txt", b"x")), self.dest, [])
        self.assertEqual(os.listdir(os.path.join(self.tmp.name, "elsewhere")), [])

    def test_long_names_in_every_format_the_writers_use(self):
        deep = "/".join(["d%02d" % i for i in range(30)]) + "/file.txt"  # 124 characters
        for fmt in (tarfile.GNU_FORMAT, tarfile.PAX_FORMAT, tarfile.USTAR_FORMAT):
            with self.subTest(format=fmt):
                b = io.BytesIO()
                with tarfile.open(fileobj=b, mode="w", format=fmt) as t:
                    info = tarfile.TarInfo(deep)
                    info.size = 3
                    t.addfile(info, io.BytesIO(b"abc"))
                    info = tarfile.TarInfo("caf\u00e9.txt")
                    info.size = 1
                    t.addfile(info, io.BytesIO(b"x"))
                written = []
                workspace.unpack(b.getvalue(), self.dest, written)
                self.assertEqual(written, [deep, "caf\u00e9.txt"])
                with open(os.path.join(self.dest, deep), "rb") as f:
                    self.assertEqual(f.read(), b"abc")

    def test_malformed_archives_are_refused_with_a_reason(self):
        good = tar_of(("a.txt", b"hello"), ("b.txt", b"x" * 700))
        bad_sum = bytearray(good)
        bad_sum[10] ^= 1
        cut = good[: 512 + 3]  # inside a's body
        cut_header = good[: 512 + 512 + 100]  # inside b's header
        hard = io.BytesIO()
        with tarfile.open(fileobj=hard, mode="w") as t:
            info = tarfile.TarInfo("h")
            info.type = tarfile.LNKTYPE
            info.linkname = "a.txt"
            t.addfile(info)
        for data, why in ((bytes(bad_sum), "checksum"), (cut, "past its end"),
                          (cut_header, "ends inside a header"), (hard.getvalue(), "not a regular file")):
            with self.subTest(why=why):
                with self.assertRaises(workspace.Refused) as e:
                    workspace.unpack(data, self.dest, [])
                self.assertIn(why, str(e.exception))
        # Without the end-of-archive blocks, as tar readers accept.
        written = []
        workspace.unpack(good[: 512 * 5], self.dest, written)  # a, its body, b, its two
        self.assertEqual(written, ["a.txt", "b.txt"])

    def test_a_fifo_where_a_file_goes_does_not_block(self):
        os.mkfifo(os.path.join(self.dest, "a.txt"))
        workspace.unpack(tar_of(("a.txt", b"data")), self.dest, [])
        with open(os.path.join(self.dest, "a.txt"), "rb") as f:
            self.assertEqual(f.read(), b"data")


class WalkAndReturnTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.root = self.tmp.name

    def tearDown(self):
        self.tmp.cleanup()

    def write(self, rel, data):
        path = os.path.join(self.root, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(data)

    def test_walk_sees_regular_files_only(self):
        self.write("a.txt", b"1")
        self.write("sub/b.txt", b"22")
        os.symlink("/etc", os.path.join(self.root, "etc"))
        os.symlink("/etc/passwd", os.path.join(self.root, "passwd"))
        os.mkfifo(os.path.join(self.root, "fifo"))
        seen = workspace.walk(self.root)
        self.assertEqual(sorted(seen), ["a.txt", "sub/b.txt"])
        self.assertEqual(seen["sub/b.txt"][0], 2)

    def test_walk_bounds_are_said_in_notes(self):
        deep = "/".join("d" for _ in range(limits.MAX_WALK_DEPTH + 2))
        self.write(deep + "/x.txt", b"x")
        notes = []
        seen = workspace.walk(self.root, notes)
        self.assertEqual(seen, {})
        self.assertTrue(any("directories deep" in n for n in notes), notes)

    def test_names_fit_to_show(self):
        for ok in ("a.txt", "dir/é.csv", "日本.txt"):
            self.assertTrue(workspace.shown_name(ok), ok)
        for bad in ("", "a\nb", "a\x1b[2Jb", "a\u2028b", "a\u202eb", "x" * (limits.MAX_FILE_PATH + 1)):
            self.assertFalse(workspace.shown_name(bad), repr(bad))

    def test_changed_files_come_back_within_the_caps_and_the_budget(self):
        self.write("old.txt", b"same")
        before = workspace.snapshot(self.root)
        self.write("new.txt", b"n" * 100)
        self.write("big.bin", b"b" * 300)
        self.write("bad\nname.txt", b"x")
        budget = limits.Budget(250)
        with CapturedFrames() as c:
            after, dropped = workspace.send_files(self.root, before, budget)
        sent = {}
        for kind, payload in parse_frames(c.raw):
            self.assertEqual(kind, b"W")
            n = struct.unpack(">H", payload[:2])[0]
            sent[payload[2:2 + n].decode()] = payload[2 + n:]
        self.assertEqual(sent, {"new.txt": b"n" * 100}, "old.txt unchanged; big.bin over budget")
        self.assertEqual(dropped, 2, "the badly named file and the one over the budget")
        self.assertIn("new.txt", after)
        notes = budget.all_notes()
        self.assertTrue(any("control characters" in n for n in notes), notes)
        self.assertTrue(any("250-byte limit" in n for n in notes), notes)

    def test_files_the_server_put_in_are_not_returned(self):
        before = workspace.snapshot(self.root)
        written = []
        workspace.unpack(tar_of(("in.csv", b"1,2")), self.root, written)
        workspace.note_written(self.root, before, written)
        with CapturedFrames() as c:
            workspace.send_files(self.root, before, limits.Budget())
        self.assertEqual(parse_frames(c.raw), [])

    def test_the_snapshot_unpack_records_is_the_one_a_walk_takes(self):
        self.write("there.txt", b"before the job")
        stats = workspace.snapshot(self.root)
        umask = os.umask(0o022)  # as the runner sets it
        try:
            workspace.unpack(tar_of(("main.py", b"print(1)"), ("d", None), ("d/in.csv", b"1,2"),
                                    ("there.txt", b"overwritten")), self.root, [], stats=stats)
        finally:
            os.umask(umask)
        self.assertEqual(stats, workspace.walk(self.root))
        self.assertEqual(os.stat(os.path.join(self.root, "main.py")).st_mode & 0o777, 0o644)
        with CapturedFrames() as c:
            workspace.send_files(self.root, stats, limits.Budget())
        self.assertEqual(parse_frames(c.raw), [], "the job's own files are not the code's")


class BudgetTest(unittest.TestCase):
    def test_budget_counts_what_does_not_fit(self):
        b = limits.Budget(10)
        self.assertTrue(b.take(6))
        self.assertFalse(b.take(5))
        self.assertTrue(b.take(4))
        self.assertEqual((b.left, b.over), (0, 1))
        self.assertEqual(limits.Budget(-5).total, 0)
        for _ in range(40):
            b.note("same")
        b.note("other")
        self.assertEqual(b.notes, ["same", "other"])


class OutputTest(unittest.TestCase):
    def test_output_is_sent_up_to_one_byte_past_the_cap_and_counted_whole(self):
        out = output.Output(5)
        with CapturedFrames() as c:
            out.forward(b"O", 0, b"abc")
            out.forward(b"O", 0, b"defgh")
            out.forward(b"O", 0, b"ijk")
            out.forward(b"E", 1, b"err")
        self.assertEqual(parse_frames(c.raw), [(b"O", b"abc"), (b"O", b"def"), (b"E", b"err")])
        self.assertEqual(out.fields(), {"stdout_bytes": 11, "stderr_bytes": 3})

    def test_pump_says_when_a_pipe_ends_and_drain_never_waits(self):
        r, w = os.pipe()
        out = output.Output(100)
        try:
            os.write(w, b"one")
            with CapturedFrames() as c:
                self.assertTrue(out.pump(r, b"O", 0))
                os.write(w, b"two")
                out.drain(r, b"O", 0)  # the writer is still open: returns all the same
                os.close(w)
                w = None
                self.assertFalse(out.pump(r, b"O", 0))
            self.assertEqual(parse_frames(c.raw), [(b"O", b"one"), (b"O", b"two")])
            self.assertTrue(os.get_blocking(r))
        finally:
            os.close(r)
            if w is not None:
                os.close(w)

    def test_reap_takes_every_exited_child_and_gives_the_codes_status(self):
        self.assertIsNone(output.reap(os.getpid()))  # no child at all
        code = os.fork()
        if code == 0:
            os._exit(3)
        other = os.fork()
        if other == 0:
            os._exit(0)
        status = None
        for _ in range(200):  # both have exited within moments
            got = output.reap(code)
            status = got if got is not None else status
            try:
                os.waitpid(other, os.WNOHANG)
            except ChildProcessError:
                if status is not None:
                    break
            time.sleep(0.01)
        self.assertEqual(output.exit_fields(status), {"exit_code": 3, "signal": None})
        with self.assertRaises(ChildProcessError):
            os.waitpid(-1, os.WNOHANG)  # nothing left unreaped

    def test_exit_fields_name_the_signal_of_a_killed_code(self):
        pid = os.fork()
        if pid == 0:
            os.kill(os.getpid(), signal.SIGKILL)
        _, status = os.waitpid(pid, 0)
        self.assertEqual(output.exit_fields(status), {"exit_code": None, "signal": 9})

    def test_returns_that_fail_are_a_note_and_the_report_has_every_field(self):
        class Job:
            files_before = None
            workdir = "/nonexistent"

        def broken(budget):
            raise OSError("figures dir gone")

        saved, figures.send_artifacts = figures.send_artifacts, broken
        try:
            budget = limits.Budget()
            returned = output.send_returns(Job(), budget)
        finally:
            figures.send_artifacts = saved
        self.assertEqual(returned, {"artifacts_dropped": 0, "files_dropped": 0})
        out = output.Output(10)
        report = output.report(out, budget, returned, exit_code=0, signal=None)
        self.assertEqual(report["notes"], ["figures or files could not be returned: OSError('figures dir gone')"])
        self.assertEqual(
            sorted(report),
            ["artifacts_dropped", "exit_code", "files_dropped", "notes", "signal", "stderr_bytes", "stdout_bytes"],
        )


def read_to_end(fd):
    """All a pipe gives until its writers are gone."""
    out = b""
    while True:
        chunk = os.read(fd, 4096)
        if not chunk:
            return out
        out += chunk


def close_child(child):
    """Close what the runner holds of a child it started (the child has been waited for)."""
    for fd in (child.out_r, child.err_r, child.st_r):
        os.close(fd)
    child.tools.close()


class DoneTest(unittest.TestCase):
    """The stub's done line, by which a run is reported before its interpreter has finished
    exiting (unmapping a process with pandas loaded took some 6 ms)."""

    def lines(self, *chunks, pid=42):
        r, w = os.pipe()
        done = run.Done("n0nce", pid)
        try:
            for c in chunks:
                os.write(w, c)
                self.assertTrue(done.read(r))
        finally:
            os.close(w)
        self.assertFalse(done.read(r), "EOF")
        os.close(r)
        return done.said

    def test_only_a_line_naming_the_nonce_and_the_child_is_believed(self):
        self.assertEqual(self.lines(b"D n0nce 42 3 17 9000\n"), (3, 17, 9000))
        # Split across reads; after garbage, a stale nonce and a forked process's line.
        self.assertEqual(
            self.lines(b"junk\nD other 42 0 0 0\nD n0nce 43 0 0 0\nD n0n", b"ce 42 1 2 3\n"),
            (1, 2, 3),
        )
        self.assertIsNone(self.lines(b"D n0nce 42 x 1 2\n", b"D n0nce 42 1 2\n"))
        # The first believed line stands.
        self.assertEqual(self.lines(b"D n0nce 42 0 1 1\nD n0nce 42 9 9 9\n"), (0, 1, 1))

    def test_the_stub_says_done_and_closes_its_output_before_it_exits(self):
        with tempfile.TemporaryDirectory() as d:
            with open(os.path.join(d, "main.py"), "w") as f:
                f.write("import atexit, sys\natexit.register(print, 'at exit')\nprint(1)\nsys.exit(3)\n")
            child = Child(sys.executable, d, STUB)
            try:
                child.go("main.py", "abc123")
                done = run.Done("abc123", child.pid)
                while done.said is None and done.read(child.st_r):
                    pass
                self.assertIsNotNone(done.said, "no done line")
                code, cpu_ms, rss_kb = done.said
                self.assertEqual(code, 3)
                self.assertGreaterEqual(cpu_ms, 0)
                self.assertGreater(rss_kb, 0)
                out = read_to_end(child.out_r)
                self.assertEqual(out, b"1\nat exit\n", "atexit ran before the done line")
                _, status = os.waitpid(child.pid, 0)
                self.assertEqual(os.WEXITSTATUS(status), 3)
            finally:
                close_child(child)

    def test_the_stub_runs_the_bytes_it_was_sent_else_the_file(self):
        big = b"print(3)\n" + b"#" * (60001)
        for sent, want in ((b"print(2)\n", b"2\n"), (None, b"1\n"), (big, b"1\n")):
            with self.subTest(sent=None if sent is None else len(sent)), \
                    tempfile.TemporaryDirectory() as d:
                path = os.path.join(d, "main.py")
                with open(path, "w") as f:
                    f.write("print(1)\n")
                child = Child(sys.executable, d, STUB)
                try:
                    child.go(path, "abc123", sent)
                    # A source too big for one pipe write is not sent: the file is read.
                    self.assertEqual(read_to_end(child.out_r), want)
                    os.waitpid(child.pid, 0)
                finally:
                    close_child(child)


class WatchTest(unittest.TestCase):
    def test_readable_and_ended_fds_come_back_with_their_tags(self):
        r1, w1 = os.pipe()
        r2, w2 = os.pipe()
        try:
            watch = Watch()
            watch.register(r1, (b"O", 0))
            watch.register(r2, "done")
            t0 = time.monotonic()
            self.assertEqual(watch.select(0.05), [])
            self.assertGreaterEqual(time.monotonic() - t0, 0.04, "waited for the timeout")
            self.assertEqual(watch.select(-1), [], "a deadline past is no wait, not forever")
            os.write(w1, b"x")
            self.assertEqual(watch.select(None), [(r1, (b"O", 0))])
            os.close(w2)
            w2 = None
            self.assertEqual(sorted(watch.select(1)), sorted([(r1, (b"O", 0)), (r2, "done")]))
            watch.unregister(r1)
            self.assertEqual(watch.select(1), [(r2, "done")])
            self.assertEqual(list(watch.tags.values()), ["done"])
        finally:
            for fd in (r1, w1, r2, w2):
                if fd is not None:
                    os.close(fd)


class NetRelayTest(unittest.TestCase):
    def test_a_hang_up_on_a_stream_without_credit_does_not_wake_the_loop(self):
        """The code resets a connection whose stream has used its window: the relay waits
        for the server's credit, not in a loop woken by the hang-up for ever."""
        import socket

        saved = netrelay.PORT
        netrelay.PORT = 0  # any free port on the host running the test
        client = None
        try:
            with CapturedFrames() as cap:
                net = netrelay.Net()
                watch = Watch()
                net.attach(watch)
                port = net.listener.getsockname()[1]
                client = socket.create_connection(("127.0.0.1", port))
                for fd, _ in watch.select(2):
                    net.event(fd)
                self.assertEqual(len(net.streams), 1)
                st = next(iter(net.streams.values()))
                st.credit = 0  # the window is used up: the server has not granted more
                net.interest(st)
                client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                client.close()  # a reset: a hang-up on the relay's side
                client = None
                wakes = 0
                for _ in range(20):
                    ready = watch.select(0.01)
                    wakes += len(ready)
                    for fd, _ in ready:
                        net.event(fd)
                self.assertEqual(wakes, 0, "the loop spun on a hang-up it could not act on")
                # Credit arrives: the relay reads the end of the stream and tells the server.
                net.from_server({"s": st.sid, "op": "credit", "k": 1024}, b"")
                for _ in range(5):
                    for fd, _ in watch.select(0.2):
                        net.event(fd)
                    if st.sid not in net.streams:
                        break
                self.assertNotIn(st.sid, net.streams)
                net.reset()
                net.listener.close()
            ops = [p[4:5] for k, p in parse_frames(cap.raw) if k == b"N"]
            self.assertEqual(ops[0], b"o")
            self.assertIn(b"c", ops[1:], ops)
        finally:
            netrelay.PORT = saved
            frames.INBOX.on_net = None
            if client is not None:
                client.close()


class DirectChannelTest(unittest.TestCase):
    """A connection of the code handed to the server's egress socket (`netrelay.hand_over`):
    the server gets the connection itself (one descriptor with one byte) and every byte
    goes both ways between it and the code, the runner keeping nothing; with no socket
    there, the connection is relayed."""

    def handed(self, socket_there):
        import socket

        up, down = os.urandom(3 << 20), os.urandom(2 << 20)
        got = {}

        def exchange(sock, data, key):
            def send():
                sock.sendall(data)
                sock.shutdown(socket.SHUT_WR)

            try:
                t = threading.Thread(target=send)
                t.start()
                chunks = []
                while True:
                    b = sock.recv(1 << 16)
                    if not b:
                        break
                    chunks.append(b)
                t.join()
                got[key] = b"".join(chunks)
            except OSError as e:
                got[key] = e
            sock.close()

        saved = (netrelay.PORT, netrelay.SOCKET)
        with tempfile.TemporaryDirectory() as d, CapturedFrames():
            path = os.path.join(d, "egress.sock")
            listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            if socket_there:
                listener.bind(path)
                listener.listen(1)
            netrelay.PORT, netrelay.SOCKET = 0, path
            try:
                net = netrelay.Net()
                watch = Watch()
                net.attach(watch)
                port = net.listener.getsockname()[1]
                client = socket.create_connection(("127.0.0.1", port))
                for fd, _ in watch.select(2):
                    net.event(fd)
                if not socket_there:
                    self.assertEqual(len(net.streams), 1, "the connection was not relayed")
                    client.close()
                    net.reset()
                    return [p[4:5] for k, p in parse_frames(frames.OUT.getvalue()) if k == b"N"]
                self.assertEqual(net.streams, {}, "a handed-over connection was relayed too")
                conn, _ = listener.accept()
                msg, fds, _, _ = socket.recv_fds(conn, 16, 4)
                conn.close()
                self.assertEqual((msg, len(fds)), (b"F", 1))
                theirs = socket.socket(fileno=fds[0])
                # The runner made the connection non-blocking (the file is shared): this
                # test's reads and writes block, as the server's event loop makes them wait.
                theirs.setblocking(True)
                threads = [
                    threading.Thread(target=exchange, args=(client, up, "code_got")),
                    threading.Thread(target=exchange, args=(theirs, down, "server_got")),
                ]
                for t in threads:
                    t.start()
                for t in threads:
                    t.join(20)
                self.assertEqual(got["server_got"], up)
                self.assertEqual(got["code_got"], down)
                self.assertEqual(frames.OUT.getvalue(), b"", "the runner framed bytes of a handed-over connection")
                net.listener.close()
            finally:
                netrelay.PORT, netrelay.SOCKET = saved
                frames.INBOX.on_net = None
                listener.close()

    def test_the_server_gets_the_connection_itself(self):
        self.handed(socket_there=True)

    def test_without_the_socket_the_connection_is_relayed(self):
        self.assertEqual(self.handed(socket_there=False)[0], b"o")


class StartUpTest(unittest.TestCase):
    def test_the_font_cache_is_copied_once_and_never_over_what_is_there(self):
        with tempfile.TemporaryDirectory() as d:
            seed = os.path.join(d, "seed")
            os.mkdir(seed)
            with open(os.path.join(seed, "fontlist.json"), "wb") as f:
                f.write(b"{}" * 50000)
            target = os.path.join(d, "config", "matplotlib")
            figures.seed_matplotlib_cache(seed, target)
            with open(os.path.join(target, "fontlist.json"), "rb") as f:
                self.assertEqual(f.read(), b"{}" * 50000)
            with open(os.path.join(target, "fontlist.json"), "wb") as f:
                f.write(b"mine")
            figures.seed_matplotlib_cache(seed, target)
            with open(os.path.join(target, "fontlist.json"), "rb") as f:
                self.assertEqual(f.read(), b"mine")

    def test_a_missing_cgroup_file_is_looked_for_once(self):
        with tempfile.TemporaryDirectory() as d:
            there = os.path.join(d, "memory.peak")
            with open(there, "w") as f:
                f.write("123\n")
            gone = os.path.join(d, "memory.max_usage_in_bytes")
            self.assertEqual(cgroup.read_int(there), 123)
            self.assertIsNone(cgroup.read_int(gone))
            self.assertIn(gone, cgroup.MISSING)
            self.assertNotIn(there, cgroup.MISSING)
            with open(gone, "w") as f:
                f.write("7\n")
            self.assertIsNone(cgroup.read_int(gone), "not looked for again")
            cgroup.MISSING.discard(gone)
            self.assertEqual(cgroup.read_int(gone), 7)

    def test_the_runner_makes_itself_not_dumpable(self):
        import subprocess

        code = (
            "import ctypes, sys; sys.path.insert(0, %r)\n"
            "from mcp_runner.main import not_dumpable\n"
            "prctl = ctypes.CDLL(None).prctl\n"
            "before = prctl(3, 0, 0, 0, 0)\n"
            "not_dumpable()\n"
            "print(before, prctl(3, 0, 0, 0, 0))\n" % RUNNER_DIR
        )
        out = subprocess.run([sys.executable, "-I", "-S", "-c", code], capture_output=True, check=True)
        self.assertEqual(out.stdout.split(), [b"1", b"0"], out.stderr)

    def test_the_imports_scan_reads_only_files_that_import(self):
        with tempfile.TemporaryDirectory() as d:
            site = os.path.join(d, "site")
            os.makedirs(os.path.join(site, "pkg"))
            open(os.path.join(site, "pkg", "__init__.py"), "w").close()
            open(os.path.join(site, "single.py"), "w").close()
            cases = [
                ("print(1)\n", []),
                ("import pkg, json\nfrom single import x\n", ["pkg", "single"]),
                ("x = __import__('pkg')\n", []),
                ("import pkg\n" + "#" * preload.MAX_SOURCE, []),
            ]
            for source, found in cases:
                archive = tar_of(("main.py", source.encode()))
                with tempfile.TemporaryDirectory() as dest:
                    src = workspace.unpack(archive, dest, [], keep="./main.py")
                self.assertEqual(src, source.encode())
                self.assertEqual(preload.imports_of(src, [site]), found, source[:40])
            with tempfile.TemporaryDirectory() as dest:
                other = workspace.unpack(tar_of(("other.py", b"x")), dest, [], keep="main.py")
            self.assertIsNone(other)


# Run in a fresh interpreter (the warm-up changes the interpreter's collector, import hooks
# and switch interval while it works): prints one JSON line of what it saw.
WARM_PROBE = r"""
import gc, json, os, sys, time, threading
exec(WARM_CODE)
r, w = os.pipe()
os.dup2(w, 4)
seen = {}
base_hooks = list(sys.meta_path)
# Done: its line, collection on again, no hook left.
stop, ended, t = _mcp_warm({"modules": ["email.mime.text", "no_such_module_x"], "cpus": 1, "seq": 3}, None)
t.join(20)
seen["line"] = json.loads(os.read(r, 4096).decode().strip())
seen["gc_after_done"] = gc.isenabled()
seen["hooks_after_done"] = list(sys.meta_path) == base_hooks
# Paced hard (a twentieth of a CPU, asleep most of the time) until a cell comes: the
# cell's imports never wait for its sleeps, and collection is on at once.
stop, ended, t = _mcp_warm({"modules": ["asyncio", "http.server", "unittest", "xml.dom.minidom"], "cpus": 0.05, "seq": 4}, None)
time.sleep(0.05)
seen["gc_during"] = gc.isenabled()
stop()
seen["gc_in_cell"] = gc.isenabled()
worst = 0.0
for name in ["decimal", "fractions", "csv", "wave", "colorsys", "sched"]:
    a = time.monotonic()
    __import__(name)
    worst = max(worst, time.monotonic() - a)
seen["cell_import_worst_ms"] = worst * 1000
time.sleep(0.3)
seen["alive_in_cell"] = t.is_alive()
gc.disable()  # the cell's own choice
ended()
t.join(20)
seen["gone_after_cell"] = not t.is_alive()
seen["gc_as_the_cell_left_it"] = gc.isenabled()
seen["hooks_after_stop"] = list(sys.meta_path) == base_hooks
print(json.dumps(seen))
"""


class WarmUpTest(unittest.TestCase):
    """A session's idle warm-up (`stubs.WARM_CODE`) in a fresh host interpreter: its line
    when done, the collector and import hooks as they were, a cell's imports never held by
    its pacing, and a stopped warm-up that lasts as long as the cell and leaves the
    collector as the cell set it."""

    def test_warm_up_done_paced_and_stopped(self):
        import subprocess

        from mcp_runner.stubs import WARM_CODE

        code = "WARM_CODE = %r\n%s" % (WARM_CODE, WARM_PROBE)
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=60)
        self.assertEqual(out.returncode, 0, out.stderr.decode())
        seen = json.loads(out.stdout.decode().strip().splitlines()[-1])
        self.assertEqual(seen["line"], {"warm": ["email.mime.text"], "skipped": ["no_such_module_x"], "seq": 3})
        self.assertTrue(seen["gc_after_done"])
        self.assertTrue(seen["hooks_after_done"])
        self.assertFalse(seen["gc_during"], "automatic collection stayed on during the warm-up")
        self.assertLess(seen["cell_import_worst_ms"], 50.0, "a cell's import waited for the warm-up's sleep")
        self.assertTrue(seen["gc_in_cell"])
        self.assertTrue(seen["alive_in_cell"])
        self.assertTrue(seen["gone_after_cell"])
        self.assertFalse(seen["gc_as_the_cell_left_it"], "the warm-up turned collection back on")
        self.assertTrue(seen["hooks_after_stop"])


if __name__ == "__main__":
    unittest.main()
