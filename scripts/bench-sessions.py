#!/usr/bin/env python3
"""The REPL path against the one-shot path (issue 43), through the official MCP Python SDK
(PyPI `mcp`) in its default mode, against a default `serve` this script starts and stops:
one call a second, the kinds interleaved so that they share the machine's moods, p50 and
p95 of each, and each p50 as a ratio to the one-shot `print(1)` of the same run.

    target/py-sdk/bin/python scripts/bench-sessions.py BINARY [--samples N] [--runtime runsc]
        [--gap SECONDS] [--flow] [-- extra serve args]

Rows: a one-shot `execute_code` `print(1)`; a new session's first cell `print(1)`; a new
session's first cell that imports pandas and makes a frame; a later cell `print(1)` in a
session; a histogram cell in a session
(its wall less its own drawing, timed inside the cell: `plt.hist` and a canvas draw) and
the same histogram one-shot. Each new session is closed (`reset_session`, not timed) before
the next call (the server gets `--max-sessions 500`, so that builds before issue 43's
stage 2, where a reset handle kept its place until it idled out, can be compared). With
`--flow`, the analyst flow once more, call by call (write a CSV,
`describe()` in a new session, `groupby`, a histogram, write and read a summary, list
files). `--gap` is the pause between calls (1 s by default; 0: back to back). The load
average (`uptime`) is printed before and after each table: on a shared machine, compare
ratios of one run, not figures across runs. The server's data and code directories are
temporary and removed at the end.
"""

import asyncio
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request

from mcp.client.client import Client

PLAIN = "print(1)"
PANDAS = "import pandas as pd\ndf = pd.DataFrame({'a': range(100), 'b': range(100)})\nprint(df.a.sum())"
HIST_SETUP = "import time, random\nimport matplotlib.pyplot as plt\ndata = [random.gauss(0, 1) for _ in range(1000)]"
HIST = (
    "import time, random\nimport matplotlib.pyplot as plt\n"
    "data = [random.gauss(0, 1) for _ in range(1000)]\n"
    "_t = time.perf_counter()\nfig = plt.figure()\nplt.hist(data, bins=30)\nfig.canvas.draw()\n"
    "print('drawn_ms=%.3f' % ((time.perf_counter() - _t) * 1000))"
)
CSV = "".join("%s,%d,%.2f\n" % ("abc"[i % 3], i, i * 0.5) for i in range(200))


def text_of(r):
    return "\n".join(getattr(c, "text", "") for c in r.content)


def drawn_ms(r):
    for line in (r.structured_content or {}).get("stdout", text_of(r)).splitlines():
        if line.startswith("drawn_ms="):
            return float(line.split("=", 1)[1])
    raise SystemExit("no drawn_ms in %r" % text_of(r)[:400])


async def call(client, tool, args):
    t = time.perf_counter()
    r = await client.call_tool(tool, args)
    ms = (time.perf_counter() - t) * 1000
    if r.is_error:
        raise SystemExit("%s failed: %s" % (tool, text_of(r)[:800]))
    return ms, r


async def close(client, r):
    sid = (r.structured_content or {}).get("session_id")
    if sid:
        await client.call_tool("reset_session", {"session_id": sid})


def load():
    with open("/proc/loadavg") as f:
        return "load average %s" % " ".join(f.read().split()[:3])


def stats(xs):
    xs = sorted(xs)
    at = lambda q: xs[round((len(xs) - 1) * q)]
    return at(0.5), at(0.95)


async def bench(url, samples, gap):
    rows = {k: [] for k in ("oneshot", "open_plain", "open_pandas", "later_plain", "hist_session",
                            "hist_oneshot")}
    before = load()
    async with Client(url) as client:
        # A session kept for the histogram cells, with matplotlib imported once.
        _, r = await call(client, "execute_python", {"code": HIST_SETUP})
        keep = r.structured_content["session_id"]
        for i in range(samples + 2):
            ms, _ = await call(client, "execute_code", {"code": PLAIN})
            first = i < 2  # warm-up rounds: not counted
            first or rows["oneshot"].append(ms)
            await asyncio.sleep(gap)
            ms, r = await call(client, "execute_python", {"code": PLAIN})
            first or rows["open_plain"].append(ms)
            await close(client, r)
            await asyncio.sleep(gap)
            ms, r = await call(client, "execute_python", {"code": PANDAS})
            first or rows["open_pandas"].append(ms)
            await close(client, r)
            await asyncio.sleep(gap)
            ms, r = await call(client, "execute_python", {"code": PLAIN, "session_id": keep})
            first or rows["later_plain"].append(ms)
            await asyncio.sleep(gap)
            ms, r = await call(client, "execute_python", {"code": HIST, "session_id": keep})
            first or rows["hist_session"].append(ms - drawn_ms(r))
            await asyncio.sleep(gap)
            ms, r = await call(client, "execute_code", {"code": HIST})
            first or rows["hist_oneshot"].append(ms - drawn_ms(r))
            await asyncio.sleep(gap)
        await client.call_tool("reset_session", {"session_id": keep})
    base = stats(rows["oneshot"])[0]
    names = {
        "oneshot": "one-shot execute_code print(1)",
        "open_plain": "new session, first cell print(1)",
        "open_pandas": "new session, first cell import pandas + a frame",
        "later_plain": "a later cell print(1) in a session",
        "hist_session": "histogram cell in a session, wall less its drawing",
        "hist_oneshot": "histogram one-shot, wall less its drawing",
    }
    print("| call | p50 ms | p95 ms | p50 / print(1) |")
    print("| --- | --- | --- | --- |")
    for k, name in names.items():
        p50, p95 = stats(rows[k])
        print("| %s | %.1f | %.1f | %.2f |" % (name, p50, p95, p50 / base))
    print("(n = %d each, %.1f s between calls; %s before, %s after)" % (samples, gap, before, load()))


async def flow(url, gap):
    """The analyst flow, call by call."""
    steps = [
        ("write_file (CSV)", "write_file", {"path": "sales.csv", "content": "region,n,x\n" + CSV}),
        ("describe() in a new session", "execute_python", {
            "code": "import pandas as pd\ndf = pd.read_csv('sales.csv')\nprint(df.describe())"}),
        ("groupby", "execute_python", {"code": "g = df.groupby('region').x.sum()\nprint(g)"}),
        ("histogram", "execute_python", {
            "code": "import matplotlib.pyplot as plt\nplt.hist(df.x, bins=20)\nplt.show()"}),
        ("write + read a summary", "execute_python", {
            "code": "g.to_csv('summary.csv')\nprint(open('summary.csv').read())"}),
        ("list files", "list_files", {}),
    ]
    print("| step | ms |  (%s)" % load())
    print("| --- | --- |")
    async with Client(url) as client:
        sid = None
        for name, tool, args in steps:
            args = dict(args)
            if sid is not None:
                args["session_id"] = sid
            ms, r = await call(client, tool, args)
            sid = sid or (r.structured_content or {}).get("session_id")
            print("| %s | %.1f |" % (name, ms))
            await asyncio.sleep(gap)
        if sid:
            await client.call_tool("reset_session", {"session_id": sid})


def main():
    args = sys.argv[1:]
    extra = []
    if "--" in args:
        extra = args[args.index("--") + 1:]
        args = args[: args.index("--")]
    binary = args[0]
    samples = int(args[args.index("--samples") + 1]) if "--samples" in args else 20
    gap = float(args[args.index("--gap") + 1]) if "--gap" in args else 1.0
    # Before issue 43's stage 2 a reset handle held its place among max_sessions until it
    # idled out: room for every one the bench opens, so that such a build compares.
    serve = [binary, "serve", "--port", "0", "--max-sessions", "500"]
    if "--runtime" in args:
        serve += ["--runtime", args[args.index("--runtime") + 1]]
    tmp = tempfile.mkdtemp(prefix="mcpx-bench-sessions-")
    env = dict(os.environ, MCP_EXECUTOR_DATA_DIR=tmp + "/data", CODE_STORAGE_DIR=tmp + "/code",
               RUST_LOG=os.environ.get("RUST_LOG", "mcp_code_executor=warn"))
    log = open(tmp + "/serve.log", "w+")
    server = subprocess.Popen(serve + extra, env=env, stderr=log, stdout=subprocess.DEVNULL)
    try:
        base = None
        for _ in range(600):
            time.sleep(0.2)
            if server.poll() is not None:
                log.seek(0)
                raise SystemExit("serve exited: %s" % log.read()[-2000:])
            log.seek(0)
            for line in log.read().splitlines():
                if "Streamable HTTP at " in line:
                    base = line.split("Streamable HTTP at ")[1].split()[0].rsplit("/mcp", 1)[0]
            if base:
                try:
                    if urllib.request.urlopen(base + "/readyz", timeout=2).status == 200:
                        break
                except Exception:
                    pass
        else:
            raise SystemExit("serve was not ready in 120 s")
        time.sleep(3)  # the pool fills
        asyncio.run(bench(base + "/mcp", samples, gap))
        if "--flow" in args:
            asyncio.run(flow(base + "/mcp", gap))
    finally:
        server.terminate()
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
        if os.environ.get("KEEP_LOG"):
            shutil.copy(tmp + "/serve.log", os.environ["KEEP_LOG"])
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
