#!/usr/bin/env python3
"""Where the milliseconds of warm runs go (issue 29, item 5), read off a server's log.

Run the server with the request path's trace lines on, call it (any client, e.g. the bench
or the official SDK), stop it, then:

    RUST_LOG=mcp_code_executor=debug,mcp_code_executor::backend::engine::live=trace \
        mcp-code-executor serve ... 2> serve.log
    scripts/breakdown.py serve.log

Per warm run (a pool sandbox, at least one output frame before the report), medians of:
the HTTP layer admitting the request to the core asking for the run (MCP, the core's
checks and queue), taking a waiting sandbox, writing the job into it, the job written to
the runner's first output frame (Docker's stdin path, the runner unpacking the job and
starting the code, the code itself), the first output to the report (the runner after the
code: reaping, figures, files, usage, the imports scan), and the report to the run's end.
The client's own share is its wall time less these.
"""

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
            cur["outs"].append(ms(line))
        elif cur is not None and "run finished" in line:
            cur["finished"] = ms(line)
            if cur.get("pooled") and len(cur["outs"]) >= 2 and cur["admitted"] and "written" in cur:
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
        ("job written → first output (Docker stdin, runner set-up, the code)",
         lambda r: r["outs"][0] - r["written"]),
        ("first output → report (the runner after the code)", lambda r: r["outs"][-1] - r["outs"][0]),
        ("report → run finished", lambda r: r["finished"] - r["outs"][-1]),
        ("backend in all (taken → finished)", lambda r: r["finished"] - r["taken"]),
    ]:
        print("| %s | %.2f |" % (name, med(f)))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "/dev/stdin")
