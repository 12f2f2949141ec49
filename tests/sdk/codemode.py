"""Code mode through the official MCP Python SDK (PyPI `mcp`): a server started with
`--tools FILE` (server-everything as `everything`, server-filesystem as `filesystem`) is
driven with the SDK's `Client` in its default mode (over HTTP: protocol 2026-07-28, no
protocol session) and in its legacy mode (2025-11-25). In each: the issue's one-liner
prints 3, a structured tool gives a dict matching its outputSchema, an upstream error
raises ToolError, the execute_code and execute_python descriptions name the
servers, and in an
execute_python session (by its session_id) the stubs keep working across cells. Exits 0
when every check held, else prints what failed and exits 1.

    python codemode.py http://127.0.0.1:PORT/mcp MISSING_PATH
"""

import asyncio
import json
import sys

from mcp.client.client import Client


def text_of(result):
    return "\n".join(getattr(c, "text", "") for c in result.content)


def check(cond, what, detail=""):
    if not cond:
        raise AssertionError(f"{what}: {detail}")


async def exercise(client, label, missing):
    tools = {t.name: t for t in (await client.list_tools()).tools}
    for name in ("execute_code", "execute_python"):
        desc = tools[name].description or ""
        check("\n- everything: " in desc and "\n- filesystem: " in desc,
              f"{label}: {name}'s description names the tool servers, one line each", desc[-600:])

    r = await client.call_tool("execute_code", {
        "code": "from tools import everything; print(everything.get_sum(a=1, b=2))"})
    check(not r.is_error and r.structured_content["stdout"].strip() == "The sum of 1 and 2 is 3.",
          f"{label}: the one-liner", text_of(r))

    code = (
        "import json, tools\n"
        "from tools import everything, filesystem\n"
        "r = everything.get_structured_content(location='Chicago')\n"
        "try:\n"
        f"    filesystem.read_text_file(path={missing!r})\n"
        "    err = 'no error'\n"
        "except tools.ToolError as e:\n"
        "    err = type(e).__name__\n"
        "print(json.dumps({'type': type(r).__name__, 'r': r, 'err': err}))\n"
    )
    r = await client.call_tool("execute_code", {"code": code})
    check(not r.is_error, f"{label}: structured and error", text_of(r))
    v = json.loads(r.structured_content["stdout"].strip().splitlines()[-1])
    check(v["type"] == "dict" and isinstance(v["r"].get("temperature"), (int, float))
          and isinstance(v["r"].get("conditions"), str),
          f"{label}: a dict matching the outputSchema", v)
    check(v["err"] == "ToolError", f"{label}: an upstream error raises ToolError", v)

    r = await client.call_tool("execute_python", {
        "code": "from tools import everything\nfirst = everything.get_sum(a=2, b=3)"})
    check(not r.is_error, f"{label}: cell 1", text_of(r))
    sid = r.structured_content["session_id"]
    r = await client.call_tool("execute_python", {
        "code": "print(first); print(everything.echo(message='cell two'))", "session_id": sid})
    out = r.structured_content.get("stdout", "")
    check(not r.is_error and "The sum of 2 and 3 is 5." in out and "cell two" in out,
          f"{label}: the stubs keep working across cells", text_of(r))
    await client.call_tool("reset_session", {"session_id": sid})


async def main():
    url, missing = sys.argv[1:3]
    for mode in ("auto", "legacy"):
        async with Client(url, mode=mode) as client:
            version = client.protocol_version
            if mode == "auto":
                check(version == "2026-07-28", "the default mode negotiates 2026-07-28", version)
            else:
                check(version != "2026-07-28", "the legacy mode negotiates an older revision", version)
            await exercise(client, f"{mode} ({version})", missing)
            print(f"ok: {mode} {version}")


if __name__ == "__main__":
    try:
        asyncio.run(main())
    except AssertionError as e:
        print(f"FAILED: {e}")
        sys.exit(1)
