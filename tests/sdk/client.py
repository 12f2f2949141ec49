"""Drive mcp-code-executor with the official MCP Python SDK (PyPI `mcp`), over one
transport, as a user's MCP client would: list the tools, run numpy, the incremental file
flow, a refused traversal, an unknown tool (with the SDK's `ClientSession` and the
`initialize` handshake); then state and size with the SDK's `Client`, in its default mode
(which negotiates 2026-07-28 where the server offers it: over HTTP, no protocol session at
all) and in its legacy mode: `x = 41` then `x + 1` with the returned session_id, a workspace
file seen by write_file, read_file and execute_code, a 3 MB print that comes back as its
head and tail with the rest in the workspace and as resource links that resources/read serves,
and a 3000x3000 figure whose resource link reads back as a PNG; over HTTP, install_package
(a wheel the image lacks, imported next; a bad spec refused as install_dependencies does). Exits 0 when every check held, else prints
what failed and exits 1.

    python client.py http  http://127.0.0.1:PORT/mcp
    python client.py sse   http://127.0.0.1:PORT/sse
    python client.py stdio /path/to/mcp-code-executor [serve args...]
"""

import asyncio
import json
import sys

from mcp import ClientSession
from mcp.client.client import Client
from mcp.client.sse import sse_client
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client

TOOLS = {
    "execute_code", "install_dependencies", "check_installed_packages",
    "configure_environment", "get_environment_config", "initialize_code_file",
    "append_to_code_file", "execute_code_file", "read_code_file",
}


def text_of(result):
    return "\n".join(getattr(c, "text", "") for c in result.content)


def check(cond, what, detail=""):
    if not cond:
        raise AssertionError(f"{what}: {detail}")


async def exercise(read, write):
    async with ClientSession(read, write) as s:
        init = await s.initialize()
        check(init.server_info.name == "mcp-code-executor", "serverInfo.name", init.server_info)

        tools = {t.name: t for t in (await s.list_tools()).tools}
        check(TOOLS <= set(tools), "the nine tools", sorted(tools))
        check("code" in tools["execute_code"].input_schema["properties"], "execute_code schema")

        r = await s.call_tool("execute_code", {
            "code": "import numpy as np\nprint(np.random.rand(3,3))"})
        check(not r.is_error and "[[" in text_of(r), "numpy matrix", text_of(r))
        check(r.structured_content and r.structured_content.get("exit_code") == 0,
              "structuredContent", r.structured_content)

        r = await s.call_tool("initialize_code_file", {"content": "x = 41\n", "filename": "flow"})
        check(not r.is_error, "initialize_code_file", text_of(r))
        path = r.structured_content["file_path"]
        r = await s.call_tool("append_to_code_file", {"file_path": path, "content": "print(x + 1)\n"})
        check(not r.is_error, "append_to_code_file", text_of(r))
        r = await s.call_tool("read_code_file", {"file_path": path})
        check("x = 41" in text_of(r) and "print(x + 1)" in text_of(r), "read_code_file", text_of(r))
        r = await s.call_tool("execute_code_file", {"file_path": path})
        check(not r.is_error and "42" in text_of(r), "execute_code_file", text_of(r))

        r = await s.call_tool("read_code_file", {"file_path": "/etc/passwd"})
        check(r.is_error and "root:" not in text_of(r), "/etc/passwd refused", text_of(r))

        r = await s.call_tool("execute_code", {"code": "import sys; sys.exit(3)"})
        check(r.is_error and r.structured_content["exit_code"] == 3, "exit 3 is isError", text_of(r))

        r = await s.call_tool("get_environment_config", {})
        check(not r.is_error, "get_environment_config", text_of(r))

        try:
            r = await s.call_tool("no_such_tool", {})
            check(r.is_error, "unknown tool refused", text_of(r))
        except Exception:
            pass  # a JSON-RPC error is the other correct answer


async def exercise_state(client, label):
    """Sessions by handle and results that fit, through the SDK's high-level Client."""
    r = await client.call_tool("execute_python", {"code": "x = 41"})
    check(not r.is_error, f"{label}: x = 41", text_of(r))
    sid = r.structured_content["session_id"]
    check(sid and sid in text_of(r), f"{label}: session_id in structuredContent and text", text_of(r))
    r = await client.call_tool("execute_python", {"code": "x + 1", "session_id": sid})
    check(not r.is_error and r.structured_content["stdout"] == "42\n",
          f"{label}: x + 1 with the session_id gives 42", text_of(r))

    r = await client.call_tool("write_file", {
        "path": "hello.txt", "content": "hello from write_file\n", "session_id": sid})
    check(not r.is_error and r.structured_content["session_id"] == sid,
          f"{label}: write_file in the session", text_of(r))
    r = await client.call_tool("read_file", {"path": "hello.txt", "session_id": sid})
    check(not r.is_error and "hello from write_file" in text_of(r), f"{label}: read_file sees it", text_of(r))
    r = await client.call_tool("execute_code", {
        "code": "print(open('/workspace/hello.txt').read().upper())", "session_id": sid})
    check(not r.is_error and "HELLO FROM WRITE_FILE" in text_of(r),
          f"{label}: execute_code opens it", text_of(r))
    r = await client.call_tool("list_files", {"session_id": sid})
    check("hello.txt" in text_of(r), f"{label}: list_files lists it", text_of(r))

    # 3 MB of stdout: the SDK refuses an event over 1 MiB, so this must come back smaller.
    # (The sandbox keeps 1 MiB of each stream, its output limit; the result carries less.)
    r = big = await client.call_tool("execute_code", {
        "code": "print('head-marker'); print('x' * 3_000_000)", "session_id": sid})
    t = text_of(r)
    check(len(t) < 512 * 1024 and "head-marker" in t and "bytes not shown" in t
          and t.rstrip().endswith("xxxx"), f"{label}: head and tail of a 3 MB print", t[:300])
    kept = r.structured_content.get("stdout_file")
    check(kept and kept in t and "read_file" in t, f"{label}: says where the rest is", t[:600])
    r = await client.call_tool("read_file", {"path": kept, "session_id": sid, "offset": 0})
    page = r.structured_content
    check(not r.is_error and page["content"].startswith("head-marker") and page.get("next_offset"),
          f"{label}: the kept stdout pages with read_file", text_of(r)[:500])

    # The whole stdout (up to the output limit) as resources: resource_link blocks whose
    # URIs resources/read serves, each answer under the SDK's 1 MiB event limit.
    links = [c for c in big.content if getattr(c, "type", "") == "resource_link"]
    prefix = f"workspace://sessions/{sid}/{kept}"
    check(links and all(str(l.uri).startswith(prefix) for l in links),
          f"{label}: resource links to the kept stdout", [str(l.uri) for l in links])
    check(str(links[0].uri) in t, f"{label}: the text names the resource URIs", t[-800:])
    whole = ""
    for link in links:
        rr = await client.read_resource(str(link.uri))
        whole += rr.contents[0].text
    check(whole.startswith("head-marker\n") and len(whole) >= 1_000_000
          and set(whole[len("head-marker\n"):].rstrip("\n")) == {"x"},
          f"{label}: resources/read gives the whole kept stdout", (len(whole), whole[:40]))

    # A 3000x3000 figure: an image that fits, and a resource link resources/read serves as a PNG blob.
    r = await client.call_tool("execute_code", {
        "code": "import matplotlib.pyplot as plt\nplt.figure(figsize=(30, 30), dpi=100)\n"
                "plt.plot([1, 2, 3])\nplt.show()", "session_id": sid})
    check(not r.is_error, f"{label}: a 3000x3000 figure", text_of(r))
    pngs = [c for c in r.content if getattr(c, "type", "") == "resource_link"
            and str(c.uri).endswith(".png")]
    check(len(pngs) == 1 and pngs[0].mime_type == "image/png",
          f"{label}: a resource link to the figure", [str(c.uri) for c in pngs])
    rr = await client.read_resource(str(pngs[0].uri))
    import base64
    blob = base64.b64decode(rr.contents[0].blob)
    check(blob.startswith(b"\x89PNG\r\n\x1a\n") and rr.contents[0].mime_type == "image/png",
          f"{label}: resources/read gives the PNG", blob[:16])

    r = await client.call_tool("read_file", {"path": "hello.txt", "session_id": "s_" + "0" * 32})
    check(r.is_error and "not found" in text_of(r), f"{label}: an unknown session_id", text_of(r))


async def exercise_install(client, label, first):
    """install_package, the REPL server's single-package install: a wheel the image lacks,
    imported by the next execute_python; a bad spec refused as install_dependencies refuses it."""
    r = await client.call_tool("install_package", {"package": "iniconfig"})
    check(not r.is_error, f"{label}: install_package iniconfig", text_of(r))
    got = r.structured_content["packages"][0]
    want = {"installed"} if first else {"installed", "already_satisfied"}
    check(got["name"] == "iniconfig" and got["status"] in want and got["version"],
          f"{label}: install_package's structured result", r.structured_content)
    r = await client.call_tool("execute_python", {"code": "import iniconfig\nprint(iniconfig.__name__)"})
    check(not r.is_error and r.structured_content["stdout"] == "iniconfig\n",
          f"{label}: the next execute_python imports it", text_of(r))
    errors = []
    for tool, args in (("install_package", {"package": "--index-url=http://x"}),
                       ("install_dependencies", {"packages": ["--index-url=http://x"]})):
        try:
            r = await client.call_tool(tool, args)
            errors.append(text_of(r) if r.is_error else None)
        except Exception as e:  # a JSON-RPC invalid_params error
            errors.append(str(e))
    check(errors[0] and errors[0] == errors[1] and "index-url" in errors[0],
          f"{label}: a bad spec gets install_dependencies' error", errors)


async def main():
    kind, target, *rest = sys.argv[1:]
    if kind == "http":
        async with streamable_http_client(target) as (read, write):
            await exercise(read, write)
        connect = lambda: target
    elif kind == "sse":
        async with sse_client(target) as (read, write):
            await exercise(read, write)
        connect = lambda: sse_client(target)
    elif kind == "stdio":
        params = StdioServerParameters(command=target, args=rest, env=json.loads(
            sys.stdin.readline() or "{}"))
        async with stdio_client(params) as (read, write):
            await exercise(read, write)
        connect = lambda: params
    else:
        raise SystemExit(f"unknown transport {kind}")
    for mode in ("auto", "legacy"):
        async with Client(connect(), mode=mode) as client:
            version = client.protocol_version
            if kind == "http" and mode == "auto":
                check(version == "2026-07-28", "the default mode negotiates 2026-07-28 over HTTP", version)
            await exercise_state(client, f"{kind} {mode} ({version})")
            if kind == "http":
                await exercise_install(client, f"{kind} {mode} ({version})", mode == "auto")
            print(f"ok: {kind} {mode} {version}")
    print(f"ok: {kind}")


if __name__ == "__main__":
    try:
        asyncio.run(main())
    except AssertionError as e:
        print(f"FAILED: {e}")
        sys.exit(1)
