"""Injection through the official MCP Python SDK (PyPI `mcp`): a server started with
`--egress FILE` whose rule for `api.example.test` adds `Authorization` from the server's
environment (the proxy intercepts that host; the sandbox trusts the proxy's CA through the
bundle the runner writes, nothing in the code) is driven with the SDK's `Client` in its
default mode (protocol 2026-07-28) and in its legacy mode (2025-11-25). In each:
execute_code's `requests.get` and an execute_python session's cells get the upstream's
body. Every result the SDK returned is printed whole (`result: ...` lines, the SDK's own
model as JSON) for the caller to search for the secret, which this script never holds.
Exits 0 when every check held, else prints what failed and exits 1.

    python egress_inject.py http://127.0.0.1:PORT/mcp UPSTREAM_PORT
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


def shown(result):
    print("result: " + result.model_dump_json())
    return result


async def exercise(client, label, port):
    api = f"https://api.example.test:{port}"
    body = f"host=api.example.test:{port} sni=api.example.test"
    code = (
        "import json, os, requests\n"
        f"r = requests.get('{api}/headers?via=sdk-{label}', timeout=30)\n"
        "print(json.dumps([r.status_code, r.text, sorted(os.environ)]))\n"
    )
    r = shown(await client.call_tool("execute_code", {"code": code, "timeout": 90}))
    check(not r.is_error, f"{label}: execute_code", text_of(r))
    status, text, _env = json.loads(r.structured_content["stdout"].strip().splitlines()[-1])
    check([status, text] == [200, body], f"{label}: the intercepted host answers", (status, text))

    r = shown(await client.call_tool("execute_python", {"code": "import requests", "timeout": 60}))
    check(not r.is_error, f"{label}: cell 1", text_of(r))
    sid = r.structured_content["session_id"]
    for n in (2, 3):
        r = shown(await client.call_tool("execute_python", {
            "code": f"print(requests.get('{api}/headers?via=sdk-{label}-cell{n}', timeout=30).text)",
            "session_id": sid, "timeout": 60}))
        out = r.structured_content.get("stdout", "")
        check(not r.is_error and body in out, f"{label}: session cell {n}", text_of(r))
    shown(await client.call_tool("reset_session", {"session_id": sid}))


async def main():
    url, port = sys.argv[1:3]
    for mode in ("auto", "legacy"):
        async with Client(url, mode=mode) as client:
            version = client.protocol_version
            if mode == "auto":
                check(version == "2026-07-28", "the default mode negotiates 2026-07-28", version)
            else:
                check(version != "2026-07-28", "the legacy mode negotiates an older revision", version)
            await exercise(client, mode, port)
            print(f"ok: {mode} {version}")


if __name__ == "__main__":
    try:
        asyncio.run(main())
    except AssertionError as e:
        print(f"FAILED: {e}")
        sys.exit(1)
