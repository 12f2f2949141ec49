"""Figures: the matplotlib backend of the image (`pylib/mcp_backend.py`, selected by the
stubs) saves them as PNG files under FIGURES; the runner returns them as `A` frames after
the code (or a session's cell) ends."""

import os
import re
import stat
import struct
import zlib

from mcp_runner import frames, limits
from mcp_runner.workspace import open_dir_nofollow, open_regular, write_all

FIGURES = "/tmp/.mcp-figures"


PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"

# The largest width or height a PNG may declare (the PNG format's own limit).
PNG_MAX_SIDE = (1 << 31) - 1


def png_size(data):
    """(width, height) when `data` is a PNG: the signature, then an `IHDR` chunk of 13
    bytes whose CRC matches, with a non-zero size and a valid bit depth and colour type;
    None for anything else."""
    if len(data) < 33 or not data.startswith(PNG_SIGNATURE):
        return None
    length, kind = struct.unpack(">I4s", data[8:16])
    if length != 13 or kind != b"IHDR":
        return None
    body = data[16:29]
    (crc,) = struct.unpack(">I", data[29:33])
    if zlib.crc32(kind + body) & 0xFFFFFFFF != crc:
        return None
    width, height, depth, colour, compression, filt, interlace = struct.unpack(">IIBBBBB", body)
    if not (0 < width <= PNG_MAX_SIDE and 0 < height <= PNG_MAX_SIDE):
        return None
    allowed = {0: (1, 2, 4, 8, 16), 2: (8, 16), 3: (1, 2, 4, 8), 4: (8, 16), 6: (8, 16)}
    if depth not in allowed.get(colour, ()) or compression or filt or interlace > 1:
        return None
    return width, height


def figure_name(name, index):
    """The name a figure is returned under: the backend's `figure-NNN[-downscaled].png`
    as it is, anything else replaced by `figure-<index>.png` (a name the code chose may
    hold a newline or claim a downscale that never happened)."""
    if FIGURE_NAME.match(name):
        return name
    return "figure-%03d.png" % index


FIGURE_NAME = re.compile(r"\Afigure-[0-9]{3,6}(-downscaled)?\.png\Z")


def send_artifacts(budget=None):
    """Send the figures the code produced (frames `A`: u16 name length, name, bytes);
    return how many were over the caps and dropped. Only real PNG files count as figures:
    the directory and each file are opened without following a symlink the code may have
    put there, and what is not a PNG is left out (said in `budget`'s notes)."""
    if budget is None:
        budget = limits.Budget()
    try:
        # Most runs make no figure: one system call says so.
        if stat.S_ISLNK(os.stat(FIGURES, follow_symlinks=False).st_mode):
            budget.note("%s is a symlink: no figures were read through it" % FIGURES)
            return 0
    except OSError:
        return 0
    dfd = open_dir_nofollow(FIGURES)
    if dfd is None:
        return 0
    try:
        try:
            names = sorted(os.listdir(dfd))[: limits.MAX_WALK_ENTRIES]
        except OSError:
            return 0
        sent = dropped = not_png = 0
        for name in names:
            f = open_regular(name, dfd)
            if f is None:
                continue
            with f:
                data = f.read(limits.MAX_ARTIFACT_BYTES + 1)
            if sent >= limits.MAX_ARTIFACTS or len(data) > limits.MAX_ARTIFACT_BYTES:
                dropped += 1
                continue
            if png_size(data) is None:
                not_png += 1
                continue
            if not budget.take(len(data)):
                dropped += 1
                continue
            frames.named(b"A", figure_name(name, sent + 1).encode(), data)
            sent += 1
        if not_png:
            budget.note("%d file(s) in the figures directory were not PNG images: left out" % not_png)
        return dropped
    finally:
        os.close(dfd)


def clear():
    """Forget the figures already sent (a session's next cell starts with none)."""
    dfd = open_dir_nofollow(FIGURES)
    if dfd is None:
        if os.path.islink(FIGURES):
            try:
                os.unlink(FIGURES)
            except OSError:
                pass
        return
    try:
        for name in os.listdir(dfd)[: limits.MAX_WALK_ENTRIES]:
            try:
                os.unlink(name, dir_fd=dfd)
            except OSError:
                pass
    finally:
        os.close(dfd)


MPL_SEED = "/opt/mcp-code-executor/mplconfig"


def seed_matplotlib_cache(seed=MPL_SEED, target=None):
    """Copy the font cache built into the image (`seed`) to the writable config dir
    (`MPLCONFIGDIR`; the root is read-only), so that the first `import matplotlib` does
    not rebuild it."""
    target = target or os.environ.get("MPLCONFIGDIR")
    if not target or os.path.exists(target):
        return
    try:
        names = os.listdir(seed)
        os.makedirs(target)
        # File by file with plain reads and writes: `shutil.copytree` also copied times,
        # modes and extended attributes, some 25 system calls for one file.
        for name in names:
            src = os.open(os.path.join(seed, name), os.O_RDONLY)
            try:
                data = b"".join(iter(lambda: os.read(src, 1 << 16), b""))
            finally:
                os.close(src)
            dst = os.open(os.path.join(target, name), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            try:
                write_all(dst, data)
            finally:
                os.close(dst)
    except OSError:
        pass
