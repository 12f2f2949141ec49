"""Consent for a destructive code-mode call through the official MCP Python SDK (PyPI
`mcp`), against a server started with `--tools FILE` (server-filesystem as `filesystem`,
its write_file not allowed by the operator). In the default mode (2026-07-28, no server
requests) the server answers `input_required` and the SDK's driver answers it with the
client's elicitation callback; in the legacy mode (2025-11-25) the server sends an
elicitation request. Checks, printing one `ok:` line each:

- default mode: accept writes the file; decline raises ToolDenied and writes nothing; two
  writes in one run ask twice; an execute_python cell asks too;
- the rounds driven by hand: a tampered state and another tool's use of the state are
  refused and change nothing (the genuine state still works after), a replay is refused;
- a client without the elicitation callback gets ToolDenied without being asked;
- legacy mode: the same question through elicitation, accepted;
- a task (raw 2026-07-28 requests, as the SDK has no task client): its status turns
  `input_required` with the question, `tasks/update` answers (accept, then decline); a
  task cancelled while it asks ends `cancelled` and writes nothing.

    python consent.py http://127.0.0.1:PORT/mcp ROOT
"""

import asyncio
import json
import os
import sys
import time

import httpx2 as httpx  # the HTTP client the SDK itself uses

from mcp import types
from mcp.client.client import Client
from mcp.shared.exceptions import MCPError


def check(cond, what, detail=""):
    if not cond:
        raise AssertionError(f"{what}: {detail}")


def writer(path, text="approved"):
    return (
        "import tools\nfrom tools import filesystem\n"
        "try:\n"
        f"    filesystem.write_file(path={path!r}, content={text!r})\n"
        "    print('written')\n"
        "except tools.ToolDenied as e:\n"
        "    print('ToolDenied', e)\n"
    )


class User:
    """An elicitation callback that answers `approve` and records the questions."""

    def __init__(self, approve=True):
        self.approve = approve
        self.asked = []

    async def __call__(self, context, params):
        self.asked.append(params.message)
        if self.approve:
            return types.ElicitResult(action="accept", content={"approve": True})
        return types.ElicitResult(action="decline")


def stdout(r):
    return (r.structured_content or {}).get("stdout", "").strip()


async def default_mode(url, root):
    user = User(True)
    async with Client(url, elicitation_callback=user) as c:
        check(c.protocol_version == "2026-07-28", "default mode negotiates 2026-07-28", c.protocol_version)
        path = os.path.join(root, "accepted.txt")
        r = await c.call_tool("execute_code", {"code": writer(path)})
        check(stdout(r) == "written", "accept writes", r)
        check(open(path).read() == "approved", "the file is there")
        check(len(user.asked) == 1 and "write_file" in user.asked[0] and "filesystem" in user.asked[0],
              "asked once, naming the tool and server", user.asked)
        print("ok: accept")

        user.asked.clear()
        two = (
            "from tools import filesystem\n"
            f"filesystem.write_file(path={os.path.join(root, 'one.txt')!r}, content='1')\n"
            f"filesystem.write_file(path={os.path.join(root, 'two.txt')!r}, content='2')\n"
            "print('both')\n"
        )
        r = await c.call_tool("execute_code", {"code": two})
        check(stdout(r) == "both" and len(user.asked) == 2, "two writes ask twice", (r, user.asked))
        print("ok: two writes, two questions")

        user.asked.clear()
        cell = writer(os.path.join(root, "cell.txt"))
        r = await c.call_tool("execute_python", {"code": cell})
        check(stdout(r) == "written" and len(user.asked) == 1, "a session's cell asks", r)
        await c.call_tool("reset_session", {"session_id": r.structured_content["session_id"]})
        print("ok: session cell")

    user = User(False)
    async with Client(url, elicitation_callback=user) as c:
        path = os.path.join(root, "declined.txt")
        r = await c.call_tool("execute_code", {"code": writer(path)})
        out = stdout(r)
        check(out.startswith("ToolDenied") and "declined" in out, "decline raises ToolDenied", out)
        check(not os.path.exists(path) and len(user.asked) == 1, "nothing written", user.asked)
        print("ok: decline")

    async with Client(url) as c:
        path = os.path.join(root, "unasked.txt")
        r = await c.call_tool("execute_code", {"code": writer(path)})
        out = stdout(r)
        check(out.startswith("ToolDenied") and "cannot be asked" in out, "no callback: ToolDenied", out)
        check(not os.path.exists(path), "nothing written")
        print("ok: a client that cannot answer")


async def by_hand(url, root):
    """The rounds driven by hand: what a tampered, misused or replayed state gets."""
    async with Client(url, elicitation_callback=User(True)) as c:
        s = c.session
        path = os.path.join(root, "by-hand.txt")
        args = {"code": writer(path, "by hand")}
        first = await s.call_tool("execute_code", args, allow_input_required=True)
        check(isinstance(first, types.InputRequiredResult), "input_required", first)
        state = first.request_state
        check(state and "consent" in (first.input_requests or {}), "a state and the question", first)
        yes = {"consent": types.ElicitResult(action="accept", content={"approve": True})}

        for bad, tool, label in ((state[:-1] + ("0" if state[-1] != "0" else "1"), "execute_code", "tampered"),
                                 (state, "execute_python", "another tool")):
            try:
                r = await s.call_tool(tool, args, input_responses=yes, request_state=bad,
                                      allow_input_required=True)
                raise AssertionError(f"{label} state accepted: {r}")
            except MCPError as e:
                check("requestState" in str(e), f"{label}: a clear refusal", str(e))
        check(not os.path.exists(path), "nothing written by the refused states")
        print("ok: tampered and misused states refused")

        r = await s.call_tool("execute_code", args, input_responses=yes, request_state=state,
                              allow_input_required=True)
        check(isinstance(r, types.CallToolResult) and stdout(r) == "written", "the genuine state still works", r)
        check(open(path).read() == "by hand", "written once")
        try:
            await s.call_tool("execute_code", args, input_responses=yes, request_state=state,
                              allow_input_required=True)
            raise AssertionError("a replayed state was accepted")
        except MCPError as e:
            check("requestState" in str(e), "replay: a clear refusal", str(e))
        print("ok: replay refused")


async def legacy(url, root):
    user = User(True)
    async with Client(url, mode="legacy", elicitation_callback=user) as c:
        path = os.path.join(root, "legacy.txt")
        r = await c.call_tool("execute_code", {"code": writer(path)})
        check(stdout(r) == "written" and len(user.asked) == 1, "legacy: elicitation", (r, user.asked))
        print("ok: legacy elicitation")


TASKS = "io.modelcontextprotocol/tasks"


def raw(http, url, method, params, token=None, tasks=True):
    """One JSON-RPC request at 2026-07-28 declaring tasks and elicitation (and with
    `token`, a bearer token): its `result`, or {"error": ...}."""
    params = dict(params)
    params["_meta"] = {
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientInfo": {"name": "consent", "version": "0"},
        "io.modelcontextprotocol/clientCapabilities": {"extensions": {TASKS: {}} if tasks else {},
                                                       "elicitation": {"form": {}}},
    }
    headers = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream",
               "MCP-Protocol-Version": "2026-07-28", "Mcp-Method": method}
    name = params.get("name") or params.get("taskId")
    if name:
        headers["Mcp-Name"] = name
    if token:
        headers["Authorization"] = f"Bearer {token}"
    resp = http.post(url, json={"jsonrpc": "2.0", "id": 1, "method": method, "params": params},
                     headers=headers, timeout=120)
    try:
        msg = json.loads(resp.text)
    except ValueError:
        msg = next((json.loads(l[5:]) for l in resp.text.splitlines()
                    if l.startswith("data:") and '"id"' in l), None)
        check(msg is not None, f"a response to {method}", (resp.status_code, resp.text[:400]))
    return {"error": msg["error"]} if "error" in msg else msg["result"]


def task_until(http, url, tid, statuses, limit=90):
    t0 = time.time()
    while True:
        t = raw(http, url, "tasks/get", {"taskId": tid})
        if t.get("status") in statuses:
            return t
        check(t.get("status") == "working" and time.time() - t0 < limit,
              f"task {tid} reaches {statuses}", t)
        time.sleep(0.2)


def tasks(url, root):
    with httpx.Client() as http:
        one, two = os.path.join(root, "task-one.txt"), os.path.join(root, "task-two.txt")
        code = writer(one, "1") + writer(two, "2")
        t = raw(http, url, "tools/call", {"name": "execute_code", "arguments": {"code": code}})
        tid = t.get("taskId")
        check(tid, "a task", t)
        answers = []
        for answer in ("accept", "decline"):
            t = task_until(http, url, tid, ("input_required",))
            keys = list(t.get("inputRequests") or {})
            check(len(keys) == 1, "one question at a time", t)
            q = t["inputRequests"][keys[0]]
            check(q.get("method") == "elicitation/create" and "write_file" in q["params"]["message"],
                  "the question", q)
            answers.append(keys[0])
            content = {"approve": True} if answer == "accept" else None
            reply = {"action": answer} | ({"content": content} if content else {})
            u = raw(http, url, "tasks/update", {"taskId": tid, "inputResponses": {keys[0]: reply}})
            check("error" not in u, "tasks/update", u)
        check(answers[0] != answers[1], "each question its own key", answers)
        done = task_until(http, url, tid, ("completed", "failed", "cancelled"))
        out = (done.get("result") or {}).get("structuredContent", {}).get("stdout", "")
        check(done["status"] == "completed" and out.startswith("written") and "ToolDenied" in out,
              "accepted then declined", done)
        check(open(one).read() == "1" and not os.path.exists(two), "one written, one not")
        print("ok: task asks through input_required")

        three = os.path.join(root, "task-cancelled.txt")
        t = raw(http, url, "tools/call", {"name": "execute_code", "arguments": {"code": writer(three)}})
        tid = t["taskId"]
        task_until(http, url, tid, ("input_required",))
        check("error" not in raw(http, url, "tasks/cancel", {"taskId": tid}), "tasks/cancel")
        done = task_until(http, url, tid, ("completed", "failed", "cancelled"))
        check(done["status"] == "cancelled" and not os.path.exists(three), "cancelled while asking", done)
        print("ok: task cancelled while asking")


async def abandon(url, root):
    """A question left unanswered past the call's limit (the server's call_timeout_s is
    5 s here): the run is stopped; a late answer gets the run's end, never a write; once
    the state has expired (as long again as the question was open), an answer is refused
    like an unknown state."""
    async with Client(url, elicitation_callback=User(True)) as c:
        s = c.session
        yes = {"consent": types.ElicitResult(action="accept", content={"approve": True})}
        path = os.path.join(root, "abandoned.txt")
        args = {"code": writer(path)}

        async def answer(question):
            """The retry answering `question`: its result, or the error's text."""
            try:
                return await s.call_tool("execute_code", args, input_responses=yes,
                                         request_state=question.request_state,
                                         allow_input_required=True)
            except MCPError as e:
                return str(e)

        first = await s.call_tool("execute_code", args, allow_input_required=True)
        check(isinstance(first, types.InputRequiredResult), "input_required", first)
        await asyncio.sleep(7)
        r = await answer(first)
        late = r if isinstance(r, str) else json.dumps(r.model_dump(mode="json"))[:400]
        check(isinstance(r, str) or (isinstance(r, types.CallToolResult) and stdout(r) != "written"),
              "a late answer", late)
        check(not os.path.exists(path), "nothing written after the question was abandoned")
        print("ok: abandoned", late)

        second = await s.call_tool("execute_code", args, allow_input_required=True)
        check(isinstance(second, types.InputRequiredResult), "input_required again", second)
        await asyncio.sleep(13)
        r = await answer(second)
        check(isinstance(r, str) and "unknown, expired" in r, "the expired state's refusal", r)
        check(not os.path.exists(path), "nothing written by an expired state")
        print("ok: expired state refused")

        r = await c.call_tool("execute_code", {"code": "print(6 * 7)"})
        check(stdout(r) == "42", "the next call runs", r)
        print("ok: the next call runs")


def tenants(url, root, token_a, token_b):
    """A's question answered with B's token (another tenant's, or another signed-in user's
    of the same tenant): refused, nothing written, and A's own answer still works. Raw
    requests without the tasks extension."""
    with httpx.Client() as http:
        path = os.path.join(root, "tenant-a.txt")
        call = {"name": "execute_code", "arguments": {"code": writer(path)}}
        first = raw(http, url, "tools/call", call, token_a, tasks=False)
        check(first.get("resultType") == "input_required" and first.get("requestState"),
              "input_required for A", first)
        answer = call | {"requestState": first["requestState"],
                         "inputResponses": {"consent": {"action": "accept", "content": {"approve": True}}}}
        b = raw(http, url, "tools/call", answer, token_b, tasks=False)
        check("error" in b and "requestState" in b["error"]["message"], "B is refused", b)
        check(not os.path.exists(path), "nothing written by B's answer")
        a = raw(http, url, "tools/call", answer, token_a, tasks=False)
        out = (a.get("structuredContent") or {}).get("stdout", "")
        check(out.strip() == "written" and open(path).read() == "approved", "A's answer works", a)
        print("ok: another caller's answer refused")


def two_pending(url, root):
    """Two writes asked together (two threads), the first question left unanswered until the
    run's own timeout (3 s) has passed: the late answer gets the run's end, not the second
    question of a run that is over (before, the run's end waited behind that question
    forever, and its state with it)."""
    with httpx.Client() as http:
        paths = [os.path.join(root, f"pending-{i}.txt") for i in range(2)]
        code = ("import threading\n" + "".join(
            f"def w{i}():\n" + "".join("    " + line + "\n" for line in writer(p).splitlines())
            for i, p in enumerate(paths))
            + "ts = [threading.Thread(target=w0), threading.Thread(target=w1)]\n"
            + "[t.start() for t in ts]\n[t.join() for t in ts]\n")
        call = {"name": "execute_code", "arguments": {"code": code, "timeout": 10}}
        first = raw(http, url, "tools/call", call, tasks=False)
        check(first.get("resultType") == "input_required", "the first question", first)
        time.sleep(12)
        answer = call | {"requestState": first["requestState"],
                         "inputResponses": {"consent": {"action": "accept", "content": {"approve": True}}}}
        late = raw(http, url, "tools/call", answer, tasks=False)
        check(late.get("resultType") != "input_required" and "error" not in late,
              "the run's end, not a question of a run that is over", late)
        check(not any(os.path.exists(p) for p in paths), "nothing written")
        print("ok: two pending questions and the run's timeout")


async def replicas(url, root):
    """Through a balancer without affinity in front of two replicas: each retry with the
    answer must reach the replica whose run asked (round robin sends it to the other)."""
    user = User(True)
    async with Client(url, elicitation_callback=user) as c:
        for i in range(4):
            path = os.path.join(root, f"replica-{i}.txt")
            r = await c.call_tool("execute_code", {"code": writer(path)})
            check(stdout(r) == "written" and open(path).read() == "approved",
                  f"round {i}: the answer reached the run that asked", r)
        check(len(user.asked) == 4, "asked four times", user.asked)
    print("ok: replicas")


async def main():
    url, root = sys.argv[1:3]
    if sys.argv[3:] == ["abandon"]:
        await abandon(url, root)
        return
    if sys.argv[3:4] == ["tenants"]:
        tenants(url, root, *sys.argv[4:6])
        return
    if sys.argv[3:] == ["two-pending"]:
        two_pending(url, root)
        return
    if sys.argv[3:] == ["replicas"]:
        await replicas(url, root)
        return
    await default_mode(url, root)
    await by_hand(url, root)
    await legacy(url, root)
    tasks(url, root)
    print(json.dumps({"done": True}))


if __name__ == "__main__":
    asyncio.run(main())
