"""The workspace: what the server puts there (a tar of regular files, unpacked here) and
what the code leaves there (new or changed files, returned as `W` frames).

Everything here treats the workspace as hostile: in a session the code has had the run of
it, so a name may be a symlink, a FIFO or a directory by the time the runner looks.
Nothing is ever followed through a symlink, no read or write blocks on a FIFO."""

import errno
import os
import stat

from mcp_runner import frames, limits


# Where the server puts the job's files (`protocol.rs`'s WORKDIR): the sandbox's own
# mount, empty when the sandbox starts.
WORKDIR = "/workspace"


class Refused(Exception):
    """An archive entry the runner does not unpack (the message names it)."""


def unpack(data, dest, written, keep=None, stats=None):
    """Unpack the tar `data` into `dest`: regular files and directories only, paths
    inside `dest`, no symlink followed on the way (a symlink or FIFO where a file goes is
    replaced). Appends the relative path of each file written to `written`, and with a
    dict `stats` records its `(size, mtime_ns)` there as `walk` would (a snapshot without
    walking the workspace again); returns the bytes of the file `keep` as the archive held
    them (None when it holds no such file: what the job sent, without reading it back from
    the workspace). Raises `Refused` for an entry that is not allowed or an archive that
    is malformed, `OSError` when writing fails (ENOSPC: the workspace is full); the
    entries before it stay written.

    `dest` itself is opened by its path: it is the sandbox's workspace mount, which the
    code cannot replace (the root filesystem is read-only); below it nothing is followed."""
    want = os.path.normpath(keep) if keep is not None else None
    kept = None
    for raw, kind, body in entries(data):
        name = os.path.normpath(raw)
        if name.startswith(("/", "..")) or "\0" in name:
            raise Refused("refused archive entry: %r" % raw)
        parts = [p for p in name.split("/") if p not in ("", ".")]
        if kind == b"0" and raw.endswith("/"):
            kind = b"5"  # an old-style directory: a file entry whose name ends in a slash
        if not (kind == b"5" or (kind == b"0" and parts)):
            raise Refused("refused archive entry that is not a regular file: %r" % raw)
        try:
            if kind == b"5":
                os.close(_open_dir(dest, parts))
                continue
            if len(parts) == 1:
                # A file at the top (most jobs' only one): by its path, no directory fd
                # opened and closed for it (two system calls, slow under gVisor).
                st = _write_file(None, os.path.join(dest, parts[0]), body, stats is not None)
            else:
                dfd = _open_dir(dest, parts[:-1])
                try:
                    st = _write_file(dfd, parts[-1], body, stats is not None)
                finally:
                    os.close(dfd)
        except OSError as e:
            e.entry = name
            raise
        written.append("/".join(parts))
        if stats is not None:
            stats["/".join(parts)] = (st.st_size, st.st_mtime_ns)
        if name == want:
            kept = bytes(body)
    return kept


# The archive, read here rather than by `tarfile`, which with `shutil`, `copy` and their
# imports cost every sandbox's start some 20 ms under gVisor. What the server sends (GNU
# headers, long names as `L` entries) and what Python's `tarfile` writes (POSIX headers,
# long names in PAX `x` entries) are read; every other kind of entry is passed on to be
# refused by `unpack`.
BLOCK = 512
REGULAR = (b"0", b"\0", b"7")


def entries(data):
    """`(name, kind, body)` of each entry of the tar `data`: kind `b"0"` for a regular
    file (any of tar's spellings of it), `b"5"` for a directory, else tar's own type byte;
    `body` a memoryview of the entry's bytes. Raises `Refused` for a header whose checksum
    is wrong or an entry that runs past the end."""
    view = memoryview(data)
    pos, long_name, pax = 0, None, {}
    while pos + BLOCK <= len(view):
        header = bytes(view[pos : pos + BLOCK])
        if not any(header):
            return  # the end-of-archive blocks
        if _number(header[148:156]) not in _checksums(header):
            raise Refused("malformed archive: bad header checksum at byte %d" % pos)
        kind = header[156:157]
        try:
            size = int(pax["size"]) if "size" in pax else _number(header[124:136])
        except ValueError:
            raise Refused("malformed archive: a size reads %r" % pax["size"])
        start = pos + BLOCK
        if size < 0 or start + size > len(view):
            raise Refused("malformed archive: an entry runs past its end at byte %d" % pos)
        body = view[start : start + size]
        pos = start + -(-size // BLOCK) * BLOCK
        if kind == b"L":
            long_name = bytes(body).split(b"\0", 1)[0]
            continue
        if kind == b"x":
            pax = _pax_records(bytes(body))
            continue
        name = pax.get("path") or _decode(long_name or _header_name(header))
        long_name, pax = None, {}
        yield name, (b"0" if kind in REGULAR else kind), body
    if any(view[pos:]):
        raise Refused("malformed archive: it ends inside a header")


def _number(field):
    """A numeric header field: octal digits (NUL or space ended), or GNU's base-256."""
    if field[0] & 0x80:
        if field[0] != 0x80:
            return -1  # negative: never a size
        return int.from_bytes(field[1:], "big")
    digits = field.split(b"\0", 1)[0].strip()
    try:
        return int(digits, 8) if digits else 0
    except ValueError:
        raise Refused("malformed archive: a numeric field reads %r" % field)


def _checksums(header):
    """The header's checksum summed as unsigned and as signed bytes (tar writers used
    both), the checksum field itself counted as spaces."""
    rest = header[:148] + b" " * 8 + header[156:]
    unsigned = sum(rest)
    return unsigned, unsigned - 256 * sum(1 for b in rest if b > 127)


def _header_name(header):
    name = header[:100].split(b"\0", 1)[0]
    if header[257:263] == b"ustar\0":  # POSIX: a prefix; GNU ("ustar  ") has none
        prefix = header[345:500].split(b"\0", 1)[0]
        if prefix:
            name = prefix + b"/" + name
    return name


def _decode(name):
    return name.decode("utf-8", "surrogateescape")


def _pax_records(body):
    """PAX `x` records (`LEN key=value\\n`) as text, for the entry that follows."""
    records, pos = {}, 0
    while pos < len(body):
        space = body.find(b" ", pos)
        try:
            length = int(body[pos:space])
        except ValueError:
            raise Refused("malformed archive: a PAX record reads %r" % body[pos : pos + 40])
        record = body[space + 1 : pos + length]
        if length <= 0 or not record.endswith(b"\n") or b"=" not in record:
            raise Refused("malformed archive: a PAX record reads %r" % body[pos : pos + 40])
        key, value = record[:-1].split(b"=", 1)
        records[_decode(key)] = _decode(value)
        pos += length
    return records


def why(e, dest):
    """Words for an `OSError` of `unpack`."""
    if e.errno in (errno.ENOSPC, errno.EFBIG, errno.EDQUOT):
        return "could not unpack into %s: %s (the workspace size limit?)" % (dest, e)
    return "could not write %s into %s: %s" % (getattr(e, "entry", "?"), dest, e)


def _open_subdir(fd, part):
    """`part` of the directory `fd`, opened only if it is a directory itself: gVisor
    (2022-12-19) follows a symlink despite O_NOFOLLOW when O_DIRECTORY is given, so the
    entry is checked with lstat before and compared by inode after (a swap in between
    fails too)."""
    before = os.stat(part, dir_fd=fd, follow_symlinks=False)
    if not stat.S_ISDIR(before.st_mode):
        raise OSError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), part)
    child = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
    after = os.fstat(child)
    if (after.st_dev, after.st_ino) != (before.st_dev, before.st_ino):
        os.close(child)
        raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), part)
    return child


def _open_dir(root, parts):
    """An fd of the directory `root/parts...`, made where missing; a component that is a
    symlink or a file fails (ELOOP, ENOTDIR) rather than being followed."""
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    for part in parts:
        try:
            try:
                os.mkdir(part, 0o777, dir_fd=fd)
            except FileExistsError:
                pass
            child = _open_subdir(fd, part)
        finally:
            os.close(fd)
        fd = child
    return fd


_WRITE = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_NONBLOCK
_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW


def _write_file(dfd, name, body, want_stat=False):
    """Write the bytes `body` to `name` in the directory `dfd` (None: `name` is a path),
    mode 0644. A symlink, FIFO or socket of that name is removed first; a directory of
    that name fails (EISDIR). With `want_stat`, returns the file's stat once written.

    A name nothing holds yet (every file of a fresh sandbox's job) is created with O_EXCL:
    a new regular file, mode 0644 by the runner's umask, nothing to check; only a name
    that exists (a session's workspace) takes the careful path."""
    try:
        fd = os.open(name, _CREATE, 0o644, dir_fd=dfd)
    except FileExistsError:
        fd = _open_existing(dfd, name)
    try:
        write_all(fd, body)
        return os.fstat(fd) if want_stat else None
    finally:
        os.close(fd)


def _open_existing(dfd, name):
    """Open `name` in `dfd` for writing from its start, mode 0644, when it is a regular
    file; replace a symlink, FIFO or socket of that name."""
    fd = None
    for _ in range(3):
        try:
            fd = os.open(name, _WRITE, 0o644, dir_fd=dfd)
        except OSError as e:
            if e.errno not in (errno.ELOOP, errno.ENXIO):
                raise
            # A symlink (O_NOFOLLOW), or a FIFO or socket nobody reads (O_NONBLOCK).
            os.unlink(name, dir_fd=dfd)
            continue
        if stat.S_ISREG(os.fstat(fd).st_mode):
            break
        os.close(fd)  # a FIFO somebody reads: not where a file goes either
        fd = None
        os.unlink(name, dir_fd=dfd)
    if fd is None:
        raise Refused("%r keeps being replaced by something that is not a file" % name)
    # Plain writes: a file object would add a stat, an ioctl and seeks, and O_NONBLOCK
    # means nothing to a regular file.
    try:
        os.fchmod(fd, 0o644)
    except OSError:
        os.close(fd)
        raise
    return fd


def write_all(fd, data):
    """Write all of `data` to `fd` with plain writes."""
    data = memoryview(data)
    while data:
        data = data[os.write(fd, data) :]


def _same(before, fd):
    """Is the open `fd` the entry `before` (an lstat) describes? Under gVisor, O_NOFOLLOW
    is not always honoured (with O_DIRECTORY it follows a symlink): an entry is checked
    with lstat before it is opened and compared by inode after, so a link, or a swap in
    between, is refused."""
    after = os.fstat(fd)
    return (after.st_dev, after.st_ino) == (before.st_dev, before.st_ino)


def open_regular(path, dir_fd=None):
    """Open `path` for reading if it is a regular file: never follows a symlink, never
    blocks on a FIFO the code left there. None otherwise."""
    try:
        before = os.stat(path, dir_fd=dir_fd, follow_symlinks=False)
        if not stat.S_ISREG(before.st_mode):
            return None
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=dir_fd)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode) or not _same(before, fd):
            os.close(fd)
            return None
        os.set_blocking(fd, True)
    except OSError:
        os.close(fd)
        return None
    return os.fdopen(fd, "rb")


def open_dir_nofollow(path, dir_fd=None):
    """An fd of the directory `path` (a single name when `dir_fd` is given), or None when
    it is missing, not a directory, or a symlink (never followed, under gVisor too)."""
    try:
        before = os.stat(path, dir_fd=dir_fd, follow_symlinks=False)
        if not stat.S_ISDIR(before.st_mode):
            return None
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=dir_fd)
    except OSError:
        return None
    try:
        if _same(before, fd):
            return fd
    except OSError:
        pass
    os.close(fd)
    return None


def open_under(root, rel):
    """Open the regular file `root/rel`, each directory on the way opened by descriptor
    without following a symlink (the code may have swapped one in since the walk)."""
    parts = rel.split("/")
    fd = open_dir_nofollow(root)
    if fd is None:
        return None
    try:
        for part in parts[:-1]:
            child = open_dir_nofollow(part, fd)
            if child is None:
                return None
            os.close(fd)
            fd = child
        return open_regular(parts[-1], fd)
    finally:
        os.close(fd)


def walk(root, notes=None):
    """{relative path: (size, mtime_ns)} of the regular files under root: iterative, never
    through a symlink, at most MAX_WALK_DEPTH levels deep and MAX_WALK_ENTRIES entries;
    what the bounds left out is said in `notes` (a list).

    `root` is listed by its path (the workspace mount, which the code cannot replace: the
    root filesystem is read-only), each directory below it by a descriptor opened without
    following a symlink: under gVisor every system call costs some 60 us, and listing by
    descriptor takes eight of them to the path's four."""
    seen = {}
    try:
        if not stat.S_ISDIR(os.stat(root, follow_symlinks=False).st_mode):
            return seen
    except OSError:
        return seen
    stack = [(None, "", 0)]
    entries = 0
    deep = stopped = False
    try:
        while stack:
            fd, prefix, depth = stack.pop()
            try:
                with os.scandir(root if fd is None else fd) as it:
                    names = []
                    for e in it:
                        entries += 1
                        if entries > limits.MAX_WALK_ENTRIES:
                            stopped = True
                            break
                        names.append(e.name)
            except OSError:
                names = []
            try:
                for name in sorted(names):
                    # At the top by path, below by descriptor (see above).
                    where, at = (os.path.join(root, name), None) if fd is None else (name, fd)
                    try:
                        st = os.stat(where, dir_fd=at, follow_symlinks=False)
                    except OSError:
                        continue
                    rel = prefix + name
                    if stat.S_ISREG(st.st_mode):
                        seen[rel] = (st.st_size, st.st_mtime_ns)
                    elif stat.S_ISDIR(st.st_mode) and not stopped:
                        if depth + 1 >= limits.MAX_WALK_DEPTH:
                            deep = True
                            continue
                        sub = open_dir_nofollow(where, at)
                        if sub is not None:
                            stack.append((sub, rel + "/", depth + 1))
            finally:
                if fd is not None:
                    os.close(fd)
            if stopped:
                break
    finally:
        for fd, _, _ in stack:
            if fd is not None:
                os.close(fd)
    if notes is not None:
        if deep:
            notes.append(
                "the workspace is more than %d directories deep: files below that were "
                "not looked at" % limits.MAX_WALK_DEPTH
            )
        if stopped:
            notes.append(
                "the workspace has more than %d entries: the rest were not looked at"
                % limits.MAX_WALK_ENTRIES
            )
    return seen


def snapshot(root):
    """{relative path: (size, mtime_ns)} of the regular files under root (no symlinks)."""
    return walk(root)


def note_written(root, before, written):
    """Record files the server put in (`unpack`) in the snapshot `before`, so that they are
    not returned as the code's own changes."""
    for rel in written:
        f = open_under(root, rel)
        if f is None:
            continue
        with f:
            st = os.fstat(f.fileno())
        before[rel] = (st.st_size, st.st_mtime_ns)


def shown_name(name):
    """Is `name` fit to be shown as a file name (in a result, in `list_files`)? Printable
    UTF-8 only: no newline, no control character, nothing a reader could take for a line
    of its own."""
    if not name or len(name.encode("utf-8", "surrogateescape")) > limits.MAX_FILE_PATH:
        return False
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return all(c.isprintable() for c in name)


def send_files(root, before, budget=None):
    """Send the files under root that are new or changed since `before` (frames `W`:
    u16 path length, path, bytes); return (the new snapshot, how many were dropped).
    Files over the caps, over what the run may still return (`budget`) or with a name
    unfit to be shown are dropped; `budget` gets the notes."""
    if budget is None:
        budget = limits.Budget()
    now = walk(root, budget.notes)
    sent = total = dropped = 0
    badly_named = 0
    for rel in sorted(now):
        if before.get(rel) == now[rel]:
            continue
        size = now[rel][0]
        if not shown_name(rel):
            badly_named += 1
            dropped += 1
            continue
        if (
            sent >= limits.MAX_FILES
            or size > limits.MAX_FILE_BYTES
            or total + size > limits.MAX_FILES_TOTAL
        ):
            dropped += 1
            continue
        f = open_under(root, rel)
        if f is None:
            continue
        with f:
            data = f.read(limits.MAX_FILE_BYTES + 1)
        if len(data) > limits.MAX_FILE_BYTES:
            dropped += 1
            continue
        if not budget.take(len(data)):
            dropped += 1
            continue
        frames.named(b"W", rel.encode("utf-8"), data)
        sent += 1
        total += len(data)
    if badly_named:
        budget.note(
            "%d file(s) not returned: names with control characters or invalid UTF-8"
            % badly_named
        )
    return now, dropped
