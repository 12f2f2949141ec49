"""A small upstream MCP server (stdio, the official Python SDK's MCPServer) for code mode's
tests: its one tool `wait` sleeps and writes to LOG whether the call started, finished, or
was cancelled (the SDK cancels a tool's task on `notifications/cancelled`), so a test can
see that a cancellation really reached the upstream.

    python upstream_cancel.py LOG
"""

import asyncio
import sys

from mcp.server.mcpserver import MCPServer

LOG = sys.argv[1]
app = MCPServer("cancel-check")


def note(line):
    with open(LOG, "a") as f:
        f.write(line + "\n")


@app.tool()
async def wait(seconds: float) -> str:
    """Sleep `seconds`; records whether the call was cancelled."""
    note("started")
    try:
        await asyncio.sleep(seconds)
    except asyncio.CancelledError:
        note("cancelled")
        raise
    note("finished")
    return "slept"


if __name__ == "__main__":
    app.run()
