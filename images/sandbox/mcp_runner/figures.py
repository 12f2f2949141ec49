"""Figures: the matplotlib backend of the image (`pylib/mcp_backend.py`, selected by the
stubs) saves them as PNG files under FIGURES; the runner returns them as `A` frames after
the code (or a session's cell) ends."""

import os
import shutil

from mcp_runner import frames, limits
from mcp_runner.workspace import open_regular

FIGURES = "/tmp/.mcp-figures"


def send_artifacts():
    """Send the figures the code produced (frames `A`: u16 name length, name, bytes);
    return how many were over the caps and dropped."""
    try:
        names = sorted(os.listdir(FIGURES))
    except OSError:
        return 0
    sent = dropped = 0
    for name in names:
        f = open_regular(os.path.join(FIGURES, name))
        if f is None:
            continue
        with f:
            data = f.read(limits.MAX_ARTIFACT_BYTES + 1)
        if sent >= limits.MAX_ARTIFACTS or len(data) > limits.MAX_ARTIFACT_BYTES:
            dropped += 1
            continue
        raw = name.encode("utf-8", "replace")[:255]
        frames.named(b"A", raw, data)
        sent += 1
    return dropped


def clear():
    """Forget the figures already sent (a session's next cell starts with none)."""
    for name in os.listdir(FIGURES) if os.path.isdir(FIGURES) else []:
        try:
            os.unlink(os.path.join(FIGURES, name))
        except OSError:
            pass


def seed_matplotlib_cache():
    """Copy the font cache built into the image to the writable config dir (the root is
    read-only), so that the first `import matplotlib` does not rebuild it."""
    seed = "/opt/mcp-code-executor/mplconfig"
    target = os.environ.get("MPLCONFIGDIR")
    if target and os.path.isdir(seed) and not os.path.exists(target):
        try:
            shutil.copytree(seed, target)
        except OSError:
            pass
