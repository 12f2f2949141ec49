"""The caps the runner enforces itself (the kernel enforces memory, CPU, pids and the
workspace size). Output beyond its cap is counted, not sent; a figure or file beyond its
cap is counted as dropped in the report."""

# Reads from the code's stdout/stderr pipes, and so the largest `O`/`E` frame.
CHUNK = 65536

# Figures (`A` frames) per run or cell, and bytes per figure.
MAX_ARTIFACTS = 10
MAX_ARTIFACT_BYTES = 4 << 20

# Workspace files returned (`W` frames) per run or cell, bytes per file, bytes in all,
# and the longest path.
MAX_FILES = 100
MAX_FILE_BYTES = 8 << 20
MAX_FILES_TOTAL = 32 << 20
MAX_FILE_PATH = 4096

# Figures and files together, bytes per run or cell (the header's `return_limit` when the
# server sends one): what one run may return besides its output, whatever the caps above
# allow one by one. What does not fit is dropped, counted and named in the report's
# `notes`.
MAX_RETURN_BYTES = 16 << 20

# Walks of the workspace (which files changed): directories deeper than this are not
# entered, and after this many entries the walk stops; both are said in `notes`.
MAX_WALK_DEPTH = 64
MAX_WALK_ENTRIES = 20000

# A session's status channel: a line longer than this is garbage and is discarded.
MAX_STATUS_LINE = 4096

# After the code exits, what it left running may hold its pipes open: this long at most
# (seconds).
EXIT_GRACE = 0.5


class Budget:
    """What one run (or one cell) may still return as figures and files, in bytes, and
    the notes on what was left out."""

    def __init__(self, total=None):
        self.total = MAX_RETURN_BYTES if total is None else max(0, int(total))
        self.left = self.total
        self.notes = []
        self.over = 0

    def take(self, n):
        """True (and counted) when `n` more bytes fit."""
        if n > self.left:
            self.over += 1
            return False
        self.left -= n
        return True

    def note(self, text):
        if text not in self.notes and len(self.notes) < 16:
            self.notes.append(text)

    def all_notes(self):
        notes = list(self.notes)
        if self.over:
            notes.append(
                "%d figure(s) or file(s) left out: over the %d-byte limit on what one run "
                "may return" % (self.over, self.total)
            )
        return notes
