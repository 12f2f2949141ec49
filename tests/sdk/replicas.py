"""More than one replica, no affinity: the official MCP Python SDK (PyPI `mcp`) through a
round-robin load balancer in front of two `serve` replicas (tests/suite/replicas.rs).

    python replicas.py flows    BALANCER_URL ROUNDS
        ROUNDS times, in the SDK's default mode (2026-07-28 over HTTP: no protocol session)
        and in its legacy mode (2025-11-25: a protocol session): `x = 41` then `x + 1` with
        the returned session_id gives 42; write_file, read_file and execute_code with the
        session_id see one file; the incremental file flow; a resource link of a file the
        run wrote resolves. Then ROUNDS times over raw HTTP at 2026-07-28 (the SDK has no
        client side for tasks): a task completes and its result is read; a long task is
        cancelled and reads back `cancelled`.
    python replicas.py session  BALANCER_URL OWNER_ID
        Open execute_python sessions until one is owned by replica OWNER_ID; print its
        session_id, then a stored file's path and a long task's id on separate lines.
    python replicas.py call     BALANCER_URL SESSION_ID FILE_PATH TASK_ID
        After that replica is gone: print the answers on its session, file and task as JSON.
    python replicas.py overhead OWNER_URL OTHER_URL N
        The same call (read_file on a session of OWNER_URL) N times on its owner and N times
        on the other replica (forwarded): print the p50 of each in ms as JSON.
Exits 0 when every check held, else prints what failed and exits 1.
"""

import asyncio
import json
import statistics
import sys
import time

import httpx2 as httpx  # the HTTP client the SDK itself uses
from mcp.client.client import Client

TASKS = "io.modelcontextprotocol/tasks"


def text_of(result):
    return "\n".join(getattr(c, "text", "") for c in result.content)


def check(cond, what, detail=""):
    if not cond:
        raise AssertionError(f"{what}: {detail}")


async def flows(client, label, i):
    r = await client.call_tool("execute_python", {"code": "x = 41"})
    check(not r.is_error, f"{label}: x = 41", text_of(r))
    sid = r.structured_content["session_id"]
    r = await client.call_tool("execute_python", {"code": "x + 1", "session_id": sid})
    check(not r.is_error and r.structured_content["stdout"] == "42\n",
          f"{label}: x + 1 with the session_id gives 42", text_of(r))

    r = await client.call_tool("write_file", {
        "path": "hello.txt", "content": "hello from write_file\n", "session_id": sid})
    check(not r.is_error, f"{label}: write_file", text_of(r))
    r = await client.call_tool("read_file", {"path": "hello.txt", "session_id": sid})
    check(not r.is_error and "hello from write_file" in text_of(r), f"{label}: read_file sees it", text_of(r))
    r = await client.call_tool("execute_code", {
        "code": "t = open('/workspace/hello.txt').read().upper()\nprint(t)\n"
                "open('/workspace/out.txt', 'w').write(t * 2)", "session_id": sid})
    check(not r.is_error and "HELLO FROM WRITE_FILE" in text_of(r),
          f"{label}: execute_code opens it", text_of(r))
    links = [c for c in r.content if getattr(c, "type", "") == "resource_link"
             and str(c.uri).endswith("/out.txt")]
    check(len(links) == 1, f"{label}: a resource link to the file the run wrote",
          [str(getattr(c, "uri", "")) for c in r.content])
    rr = await client.read_resource(str(links[0].uri))
    check(rr.contents[0].text.count("HELLO FROM WRITE_FILE") == 2, f"{label}: the link resolves",
          rr.contents[0])

    r = await client.call_tool("initialize_code_file", {"content": "y = 6\n", "filename": "flow"})
    check(not r.is_error, f"{label}: initialize_code_file", text_of(r))
    path = r.structured_content["file_path"]
    r = await client.call_tool("append_to_code_file", {"file_path": path, "content": "print(y * 7)\n"})
    check(not r.is_error, f"{label}: append_to_code_file", text_of(r))
    r = await client.call_tool("execute_code_file", {"file_path": path})
    check(not r.is_error and "42" in text_of(r), f"{label}: execute_code_file", text_of(r))
    if i % 2:
        # One request more every other round: with round robin, the next session then opens
        # on the other replica (a round is otherwise an even number of requests).
        r = await client.call_tool("read_code_file", {"file_path": path})
        check("print(y * 7)" in text_of(r), f"{label}: read_code_file", text_of(r))
    # Done with it: its sandbox goes now rather than after the idle timeout.
    r = await client.call_tool("reset_session", {"session_id": sid})
    check(not r.is_error, f"{label}: reset_session", text_of(r))
    return sid


def raw(http, url, method, params, caps=None):
    """One JSON-RPC request at 2026-07-28: its `result`, or {"error": ...}."""
    params = dict(params)
    params["_meta"] = {
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientInfo": {"name": "replicas", "version": "0"},
        "io.modelcontextprotocol/clientCapabilities": {"extensions": {TASKS: {}}} if caps is None else caps,
    }
    headers = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream",
               "MCP-Protocol-Version": "2026-07-28", "Mcp-Method": method}
    name = params.get("name") or params.get("taskId")
    if name:
        headers["Mcp-Name"] = name
    body = {"jsonrpc": "2.0", "id": 1, "method": method, "params": params}
    resp = http.post(url, json=body, headers=headers, timeout=120)
    text = resp.text
    try:
        msg = json.loads(text)
    except ValueError:
        msg = next((json.loads(l[5:]) for l in text.splitlines()
                    if l.startswith("data:") and '"id"' in l), None)
        check(msg is not None, f"a response to {method}", (resp.status_code, text[:400]))
    if "error" in msg:
        return {"error": msg["error"]}
    return msg["result"]


def task_text(t):
    res = t.get("result") or {}
    return "\n".join(c.get("text", "") for c in res.get("content", []))


def wait_task(http, url, tid, limit=90):
    t0 = time.time()
    while True:
        t = raw(http, url, "tasks/get", {"taskId": tid})
        check("status" in t, "tasks/get answers", t)
        if t["status"] in ("completed", "failed", "cancelled"):
            return t
        check(time.time() - t0 < limit, f"task {tid} ends", t)
        time.sleep(0.3)


def tasks(url, rounds):
    with httpx.Client() as http:
        for i in range(rounds):
            t = raw(http, url, "tools/call", {"name": "execute_code", "arguments": {"code": "print(6 * 7)"}})
            tid = t.get("taskId")
            check(tid, f"round {i}: a task", t)
            done = wait_task(http, url, tid)
            check(done["status"] == "completed" and "42" in task_text(done),
                  f"round {i}: the task's result read back", done)
            t = raw(http, url, "tools/call", {"name": "execute_code",
                                              "arguments": {"code": "import time\ntime.sleep(120)"}})
            tid = t.get("taskId")
            check(tid, f"round {i}: a long task", t)
            # Two reads in a row: with round robin one lands on the replica that is not its owner.
            for _ in range(2):
                g = raw(http, url, "tasks/get", {"taskId": tid})
                check(g.get("status") == "working", f"round {i}: the long task is working", g)
            ack = raw(http, url, "tasks/cancel", {"taskId": tid})
            check("error" not in ack, f"round {i}: tasks/cancel", ack)
            done = wait_task(http, url, tid)
            check(done["status"] == "cancelled", f"round {i}: the cancelled task says so", done)


async def main_flows(url, rounds):
    for mode in ("auto", "legacy"):
        async with Client(url, mode=mode) as client:
            version = client.protocol_version
            if mode == "auto":
                check(version == "2026-07-28", "the default mode negotiates 2026-07-28", version)
            for i in range(rounds):
                await flows(client, f"{mode} ({version}) round {i}", i)
            print(f"ok: {mode} {version} x{rounds}", flush=True)
    tasks(url, rounds)
    print(f"ok: tasks x{rounds}", flush=True)


async def main_session(url, owner):
    async with Client(url) as client:
        for _ in range(20):
            r = await client.call_tool("execute_python", {"code": "x = 41"})
            check(not r.is_error, "x = 41", text_of(r))
            sid = r.structured_content["session_id"]
            if sid.split("_")[1] == owner:
                break
        else:
            raise AssertionError(f"no session landed on replica {owner}")
        r = await client.call_tool("initialize_code_file", {"content": "print('stored survives')\n"})
        check(not r.is_error, "initialize_code_file", text_of(r))
        path = r.structured_content["file_path"]
    with httpx.Client() as http:
        for _ in range(20):
            t = raw(http, url, "tools/call", {"name": "execute_code",
                                              "arguments": {"code": "import time\ntime.sleep(300)"}})
            tid = t["taskId"]
            if tid.split("_")[1] == owner:
                break
            raw(http, url, "tasks/cancel", {"taskId": tid})
        else:
            raise AssertionError(f"no task landed on replica {owner}")
    print(sid)
    print(path)
    print(tid)


async def main_call(url, sid, path, tid):
    out = {}
    async with Client(url) as client:
        r = await client.call_tool("execute_python", {"code": "x + 1", "session_id": sid})
        out["session"] = {"is_error": r.is_error, "text": text_of(r)}
        r = await client.call_tool("execute_code_file", {"file_path": path})
        out["stored"] = {"is_error": r.is_error, "text": text_of(r)}
        r = await client.call_tool("execute_python", {"code": "x = 1\nprint(x + 1)"})
        out["new"] = {"is_error": r.is_error, "text": text_of(r)}
    with httpx.Client() as http:
        out["task"] = raw(http, url, "tasks/get", {"taskId": tid})
    print(json.dumps(out))


def main_overhead(owner_url, other_url, n):
    with httpx.Client() as http:
        r = raw(http, owner_url, "tools/call", {"name": "execute_python", "arguments": {"code": "x = 1"}}, {})
        check(r.get("isError") is not True, "execute_python", r)
        sid = r["structuredContent"]["session_id"]
        r = raw(http, owner_url, "tools/call", {"name": "write_file", "arguments": {
            "path": "o.txt", "content": "overhead\n", "session_id": sid}}, {})
        check(r.get("isError") is not True, "write_file", r)
        times = {}
        for name, url in (("owner", owner_url), ("forwarded", other_url)) * 2:
            ms = times.setdefault(name, [])
            for _ in range(n // 2):
                t0 = time.perf_counter()
                r = raw(http, url, "tools/call", {"name": "read_file", "arguments": {
                    "path": "o.txt", "session_id": sid}}, {})
                ms.append((time.perf_counter() - t0) * 1000)
                check(r.get("isError") is not True and "overhead" in json.dumps(r), "read_file", r)
    print(json.dumps({k: statistics.median(v) for k, v in times.items()}))


if __name__ == "__main__":
    try:
        kind, *args = sys.argv[1:]
        if kind == "flows":
            asyncio.run(main_flows(args[0], int(args[1])))
        elif kind == "session":
            asyncio.run(main_session(args[0], args[1]))
        elif kind == "call":
            asyncio.run(main_call(*args))
        elif kind == "overhead":
            main_overhead(args[0], args[1], int(args[2]))
        else:
            raise SystemExit(f"unknown command {kind}")
    except AssertionError as e:
        print(f"FAILED: {e}")
        sys.exit(1)
