"""Drive mcp-code-executor with the official MCP Python SDK (PyPI `mcp`), over one
transport, as a user's MCP client would: list the tools, run numpy, the incremental file
flow, a refused traversal, an unknown tool. Exits 0 when every check held, else prints
what failed and exits 1.

    python client.py http  http://127.0.0.1:PORT/mcp
    python client.py sse   http://127.0.0.1:PORT/sse
    python client.py stdio /path/to/mcp-code-executor [serve args...]
"""

import asyncio
import json
import sys

from mcp import ClientSession
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


async def main():
    kind, target, *rest = sys.argv[1:]
    if kind == "http":
        async with streamable_http_client(target) as (read, write):
            await exercise(read, write)
    elif kind == "sse":
        async with sse_client(target) as (read, write):
            await exercise(read, write)
    elif kind == "stdio":
        params = StdioServerParameters(command=target, args=rest, env=json.loads(
            sys.stdin.readline() or "{}"))
        async with stdio_client(params) as (read, write):
            await exercise(read, write)
    else:
        raise SystemExit(f"unknown transport {kind}")
    print(f"ok: {kind}")


if __name__ == "__main__":
    try:
        asyncio.run(main())
    except AssertionError as e:
        print(f"FAILED: {e}")
        sys.exit(1)
