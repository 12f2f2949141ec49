#!/usr/bin/env python3
"""Where the milliseconds of warm runs go (issue 29, item 5), read off a server's log.

Run the server with the request path's trace lines on, call it (any client, e.g. the bench
or the official SDK), stop it, then:

    RUST_LOG=mcp_code_executor=debug,mcp_code_executor::backend::engine::live=trace \
        mcp-code-executor serve ... 2> serve.log
    scripts/breakdown.py serve.log

Per warm run (a pool sandbox, its runner's `S` and at least one output frame before the
report, each in a chunk of its own), medians of: the HTTP layer admitting the request to
the core asking for the run (MCP, the core's checks and queue), taking a waiting sandbox,
writing the job into it, the job written to the runner's `S` (Docker's stdin path, the
runner reading the job), `S` to the first output (unpacking the job, starting the code,
the code itself), the first output to the report (the runner after the code: reaping,
figures, files, usage, the imports scan), and the report to the run's end. The client's
own share is its wall time less these.
"""

import re

import datetime
import statistics
import sys


def ms(line):
    return datetime.datetime.strptime(line[:26], "%Y-%m-%dT%H:%M:%S.%f").timestamp() * 1000


def main(path):
    rows, cur, admitted = [], None, None
    for line in open(path, errors="replace"):
        if not line.startswith("20"):
            continue
        if "request admitted" in line:
            admitted = ms(line)
        elif "run requested" in line:
            cur = {"admitted": admitted, "requested": ms(line), "outs": []}
        elif cur is not None and "sandbox started" in line:
            cur["taken"], cur["pooled"] = ms(line), "pooled=true" in line
        elif cur is not None and "input written" in line and "written" not in cur:
            cur["written"] = ms(line)
        elif cur is not None and "runner output" in line:
            size = re.search(r"bytes=(\d+)", line)
            cur["outs"].append((ms(line), int(size.group(1)) if size else -1))
        elif cur is not None and "run finished" in line:
            cur["finished"] = ms(line)
            outs = cur["outs"]
            # `S` is a frame of 5 bytes (kind, empty length) in a chunk of its own.
            alone = len(outs) >= 3 and outs[0][1] == 5
            if cur.get("pooled") and alone and cur["admitted"] and "written" in cur:
                cur["outs"] = [t for t, _ in outs]
                rows.append(cur)
            cur = None
    if not rows:
        sys.exit("breakdown: no warm run with its trace lines in %s" % path)

    def med(f):
        return statistics.median(f(r) for r in rows)

    print("%d warm runs, medians (ms):\n" % len(rows))
    print("| part | ms |\n| --- | --- |")
    for name, f in [
        ("HTTP admitted → run requested (MCP, core)", lambda r: r["requested"] - r["admitted"]),
        ("run requested → waiting sandbox taken", lambda r: r["taken"] - r["requested"]),
        ("taken → job written", lambda r: r["written"] - r["taken"]),
        ("job written → the runner has it (`S`: Docker stdin, the runner reading it)",
         lambda r: r["outs"][0] - r["written"]),
        ("`S` → first output (unpacking, starting the code, the code)",
         lambda r: r["outs"][1] - r["outs"][0]),
        ("first output → report (the runner after the code)", lambda r: r["outs"][-1] - r["outs"][1]),
        ("report → run finished", lambda r: r["finished"] - r["outs"][-1]),
        ("backend in all (taken → finished)", lambda r: r["finished"] - r["taken"]),
    ]:
        print("| %s | %.2f |" % (name, med(f)))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "/dev/stdin")
