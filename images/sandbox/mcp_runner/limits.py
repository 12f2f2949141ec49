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

# After the code exits, what it left running may hold its pipes open: this long at most
# (seconds).
EXIT_GRACE = 0.5
