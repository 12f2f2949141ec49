"""Matplotlib backend of the sandbox: Agg, with a `show()` that saves every open figure
as PNG for the runner to return, then closes them (as a notebook does). Figures left open
when the code ends are saved by the runner's stub through `save_all()`.

Selected with MPLBACKEND=module://mcp_backend; imported only when pyplot is.
"""

import os

from matplotlib.backend_bases import FigureManagerBase as FigureManager  # noqa: F401
from matplotlib.backends.backend_agg import FigureCanvasAgg as FigureCanvas  # noqa: F401

FIGURES = "/tmp/.mcp-figures"
MAX_PIXELS = 4000000
_count = [0]


def save_all():
    import matplotlib.pyplot as plt

    for num in plt.get_fignums():
        fig = plt.figure(num)
        dpi = fig.dpi
        w, h = fig.get_size_inches()
        pixels = w * h * dpi * dpi
        tag = ""
        if pixels > MAX_PIXELS:
            dpi = dpi * (MAX_PIXELS / pixels) ** 0.5
            tag = "-downscaled"
        os.makedirs(FIGURES, exist_ok=True)
        _count[0] += 1
        fig.savefig(os.path.join(FIGURES, "figure-%03d%s.png" % (_count[0], tag)), format="png", dpi=dpi)
    plt.close("all")


def show(*args, **kwargs):
    save_all()
