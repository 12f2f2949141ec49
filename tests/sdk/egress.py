"""Egress through the official MCP Python SDK (PyPI `mcp`): a server started with
`--egress FILE` allowing `data.example.test` on PORT (a loopback HTTPS server with a test
CA) is driven with the SDK's `Client` in its default mode (over HTTP: protocol
2026-07-28, no protocol session) and in its legacy mode (2025-11-25). In each:
execute_code's `requests.get` reaches the allowed host and the server sees the client's
own TLS (its SNI), a host not in the policy is refused with the clear error, and an
execute_python session (by its session_id) reaches the host cell after cell. Exits 0 when
every check held, else prints what failed and exits 1.

    python egress.py http://127.0.0.1:PORT/mcp UPSTREAM_PORT CA_FILE
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


async def exercise(client, label, port, ca):
    trust = (
        "import os\n"
        f"open('/tmp/ca.pem', 'w').write({ca!r})\n"
        "os.environ['SSL_CERT_FILE'] = os.environ['REQUESTS_CA_BUNDLE'] = '/tmp/ca.pem'\n"
        "import json, requests\n"
    )
    code = trust + (
        "res = {}\n"
        f"res['get'] = requests.get('https://data.example.test:{port}/sdk', timeout=20).text\n"
        "try:\n"
        f"    requests.get('https://other.example.test:{port}/', timeout=20)\n"
        "    res['other'] = 'reached'\n"
        "except Exception as e:\n"
        "    res['other'] = str(e)\n"
        "print(json.dumps(res))\n"
    )
    r = await client.call_tool("execute_code", {"code": code, "timeout": 60})
    check(not r.is_error, f"{label}: execute_code", text_of(r))
    v = json.loads(r.structured_content["stdout"].strip().splitlines()[-1])
    check(f"host=data.example.test:{port} sni=data.example.test" in v["get"],
          f"{label}: the allowed host answers, tunnelled (the client's own SNI)", v)
    check(f"other.example.test:{port} not in the policy" in v["other"],
          f"{label}: a host not in the policy is refused, named", v)

    r = await client.call_tool("execute_python", {"code": trust + "first = 1", "timeout": 60})
    check(not r.is_error, f"{label}: cell 1", text_of(r))
    sid = r.structured_content["session_id"]
    for n in (2, 3):
        r = await client.call_tool("execute_python", {
            "code": f"print(requests.get('https://data.example.test:{port}/cell{n}', timeout=20).text)",
            "session_id": sid, "timeout": 60})
        out = r.structured_content.get("stdout", "")
        check(not r.is_error and f"host=data.example.test:{port}" in out,
              f"{label}: session cell {n}", text_of(r))
    await client.call_tool("reset_session", {"session_id": sid})


async def main():
    url, port, ca_file = sys.argv[1:4]
    ca = open(ca_file).read()
    for mode in ("auto", "legacy"):
        async with Client(url, mode=mode) as client:
            version = client.protocol_version
            if mode == "auto":
                check(version == "2026-07-28", "the default mode negotiates 2026-07-28", version)
            else:
                check(version != "2026-07-28", "the legacy mode negotiates an older revision", version)
            await exercise(client, f"{mode} ({version})", port, ca)
            print(f"ok: {mode} {version}")


if __name__ == "__main__":
    try:
        asyncio.run(main())
    except AssertionError as e:
        print(f"FAILED: {e}")
        sys.exit(1)
