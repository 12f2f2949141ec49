"""The workspace: what the server puts there (a tar of regular files, unpacked here) and
what the code leaves there (new or changed files, returned as `W` frames).

Everything here treats the workspace as hostile: in a session the code has had the run of
it, so a name may be a symlink, a FIFO or a directory by the time the runner looks.
Nothing is ever followed through a symlink, no read or write blocks on a FIFO."""

import errno
import io
import os
import shutil
import stat
import tarfile

from mcp_runner import frames, limits


class Refused(Exception):
    """An archive entry the runner does not unpack (the message names it)."""


def unpack(data, dest, written):
    """Unpack the tar `data` into `dest`: regular files and directories only, paths
    inside `dest`, no symlink followed on the way (a symlink or FIFO where a file goes is
    replaced). Appends the relative path of each file written to `written`. Raises
    `Refused` for an entry that is not allowed, `OSError` when writing fails (ENOSPC: the
    workspace is full); the entries before it stay written."""
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tar:
        for member in tar:
            name = os.path.normpath(member.name)
            if name.startswith(("/", "..")) or "\0" in name:
                raise Refused("refused archive entry: %r" % member.name)
            parts = [p for p in name.split("/") if p not in ("", ".")]
            if not (member.isdir() or (member.isfile() and parts)):
                raise Refused(
                    "refused archive entry that is not a regular file: %r" % member.name
                )
            try:
                if member.isdir():
                    os.close(_open_dir(dest, parts))
                    continue
                dfd = _open_dir(dest, parts[:-1])
                try:
                    _write_file(dfd, parts[-1], tar.extractfile(member))
                finally:
                    os.close(dfd)
            except OSError as e:
                e.entry = name
                raise
            written.append("/".join(parts))


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


def _write_file(dfd, name, src):
    """Write `src` to `name` in the directory `dfd`, mode 0644. A symlink, FIFO or socket
    of that name is removed first; a directory of that name fails (EISDIR)."""
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
    with os.fdopen(fd, "wb") as out:
        os.set_blocking(fd, True)
        os.fchmod(fd, 0o644)
        shutil.copyfileobj(src, out)


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
    """{relative path: (size, mtime_ns)} of the regular files under root: iterative, by
    descriptor, never through a symlink, at most MAX_WALK_DEPTH levels deep and
    MAX_WALK_ENTRIES entries; what the bounds left out is said in `notes` (a list)."""
    seen = {}
    top = open_dir_nofollow(root)
    if top is None:
        return seen
    stack = [(top, "", 0)]
    entries = 0
    deep = stopped = False
    try:
        while stack:
            fd, prefix, depth = stack.pop()
            try:
                with os.scandir(fd) as it:
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
                    try:
                        st = os.stat(name, dir_fd=fd, follow_symlinks=False)
                    except OSError:
                        continue
                    rel = prefix + name
                    if stat.S_ISREG(st.st_mode):
                        seen[rel] = (st.st_size, st.st_mtime_ns)
                    elif stat.S_ISDIR(st.st_mode) and not stopped:
                        if depth + 1 >= limits.MAX_WALK_DEPTH:
                            deep = True
                            continue
                        sub = open_dir_nofollow(name, fd)
                        if sub is not None:
                            stack.append((sub, rel + "/", depth + 1))
            finally:
                os.close(fd)
            if stopped:
                break
    finally:
        for fd, _, _ in stack:
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
