"""Code mode: the tools of other MCP servers, callable from your code as functions.

    from tools import everything
    print(everything.get_sum(a=1, b=2))

One module per server the operator configured, one function per tool it allows, with
keyword arguments (tool names become Python names: `get-sum` is `get_sum`). A function
returns the tool's structured result (a dict) when it has one, else its text, else a
`Result` with the content blocks. Errors raise `ToolError` (the tool failed) or one of
its subclasses: `ToolDenied` (not allowed, needs consent, bad arguments), `ToolTimeout`,
`BudgetExceeded` (too many calls in this run). Each function has an `aio` variant for
asyncio: `await everything.get_sum.aio(a=1, b=2)`, so several calls can be gathered.

`tools.search("sum")` finds tools by name and description; `tools.help()` lists every
server and tool, `tools.help("everything.get_sum")` (or `help(everything.get_sum)`) shows
one. The calls go through the sandbox's runner to the server that started this sandbox;
the sandbox has no network, and no address or credential of any tool server is in it.
"""

import inspect
import itertools
import json
import socket
import struct
import sys
import threading
import types

__all__ = [
    "ToolError",
    "ToolDenied",
    "ToolTimeout",
    "BudgetExceeded",
    "Result",
    "call",
    "acall",
    "search",
    "help",
    "servers",
]

_FD = 5


class ToolError(Exception):
    """A tool call failed: the tool reported an error, or the call could not be made.
    `content` holds the tool's content blocks when it sent any."""

    def __init__(self, message, content=None):
        Exception.__init__(self, message)
        self.content = content or []


class ToolDenied(ToolError):
    """The call was refused before it reached the tool: not allowed, a destructive tool
    without consent, or arguments that do not match the tool's input schema."""


class ToolTimeout(ToolError):
    """The tool did not answer within the per-call limit (the call was cancelled)."""


class BudgetExceeded(ToolError):
    """This run has made as many tool calls as it may (or as many at once as it may)."""


_ERRORS = {
    "ToolError": ToolError,
    "ToolDenied": ToolDenied,
    "ToolTimeout": ToolTimeout,
    "BudgetExceeded": BudgetExceeded,
}


class Result(object):
    """What a tool returned when it had neither structured content nor only text."""

    def __init__(self, content):
        self.content = content

    @property
    def text(self):
        return "".join(b.get("text", "") for b in self.content if b.get("type") == "text")

    @property
    def images(self):
        return [b for b in self.content if b.get("type") == "image"]

    def __repr__(self):
        return "Result(%r)" % (self.content,)


class _Channel(object):
    """Requests on fd 5 (`u32 length, JSON`), answers matched to them by id, read by one
    background thread; any number of threads (and the asyncio variants) may call."""

    def __init__(self):
        self._sock = None
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._waiting = {}
        self._broken = None

    def _open(self):
        if self._sock is None:
            try:
                self._sock = socket.socket(fileno=_FD)
            except OSError as e:
                raise ToolError("code mode's channel is not there (%s)" % e)
            t = threading.Thread(target=self._read, name="tools-channel", daemon=True)
            t.start()
        return self._sock

    def _read(self):
        buf = b""
        while True:
            try:
                data = self._sock.recv(1 << 20)
            except OSError:
                data = b""
            if not data:
                break
            buf += data
            while len(buf) >= 4:
                (n,) = struct.unpack(">I", buf[:4])
                if len(buf) < 4 + n:
                    break
                body, buf = buf[4 : 4 + n], buf[4 + n :]
                try:
                    answer = json.loads(body.decode("utf-8"))
                except ValueError:
                    continue
                with self._lock:
                    slot = self._waiting.pop(answer.get("id"), None)
                if slot is not None:
                    slot[1] = answer
                    slot[0].set()
        with self._lock:
            self._broken = "the sandbox's runner closed code mode's channel"
            waiting, self._waiting = self._waiting, {}
        for slot in waiting.values():
            slot[0].set()

    def request(self, body):
        """Send `body` and block until its answer (a dict)."""
        slot = [threading.Event(), None]
        with self._lock:
            sock = self._open()
            if self._broken:
                raise ToolError(self._broken)
            rid = next(self._ids)
            self._waiting[rid] = slot
            body = dict(body, id=rid)
            data = json.dumps(body).encode("utf-8")
            try:
                sock.sendall(struct.pack(">I", len(data)) + data)
            except OSError as e:
                self._waiting.pop(rid, None)
                raise ToolError("code mode's channel failed: %s" % e)
        slot[0].wait()
        if slot[1] is None:
            raise ToolError(self._broken or "no answer")
        return slot[1]


_channel = _Channel()


def _outcome(answer):
    err = answer.get("error")
    if err is not None:
        cls = _ERRORS.get(err.get("type"), ToolError)
        raise cls(err.get("message", "the tool call failed"), err.get("content"))
    if "structured" in answer:
        return answer["structured"]
    content = answer.get("content") or []
    if content and all(b.get("type") == "text" for b in content):
        return "".join(b.get("text", "") for b in content)
    return Result(content)


def call(server, tool, **arguments):
    """Call `tool` (its MCP name, e.g. `get-sum`) of `server` with `arguments`."""
    return _outcome(
        _channel.request({"op": "call", "server": server, "tool": tool, "arguments": arguments})
    )


async def acall(server, tool, **arguments):
    """`call` for asyncio: runs the blocking call in a worker thread."""
    import asyncio
    import functools

    loop = asyncio.get_event_loop()
    return await loop.run_in_executor(None, functools.partial(call, server, tool, **arguments))


_TYPES = {
    "string": str,
    "integer": int,
    "number": float,
    "boolean": bool,
    "array": list,
    "object": dict,
    "null": type(None),
}


def _hint(schema):
    t = schema.get("type") if isinstance(schema, dict) else None
    if isinstance(t, str):
        return _TYPES.get(t, inspect.Parameter.empty)
    return inspect.Parameter.empty


class _Missing(object):
    def __repr__(self):
        return "<not given>"


_MISSING = _Missing()


def _doc(server, tool):
    lines = []
    desc = (tool.get("description") or "").strip()
    if desc:
        lines += [desc, ""]
    props = (tool.get("inputSchema") or {}).get("properties") or {}
    required = set((tool.get("inputSchema") or {}).get("required") or [])
    if tool.get("params"):
        lines.append("Arguments:")
        for p in tool["params"]:
            s = props.get(p["property"], {})
            kind = s.get("type", "any")
            if isinstance(kind, list):
                kind = " | ".join(str(k) for k in kind)
            opt = "" if p["property"] in required else ", optional"
            d = (s.get("description") or "").strip()
            extra = ""
            if "enum" in s:
                extra = " One of %s." % ", ".join(repr(v) for v in s["enum"])
            if "default" in s:
                extra += " Default %r." % (s["default"],)
            lines.append("    %s (%s%s): %s%s" % (p["name"], kind, opt, d, extra))
        lines.append("")
    out = tool.get("outputSchema")
    if out:
        lines.append("Returns a dict matching: %s" % json.dumps(out, sort_keys=True)[:2000])
        lines.append("")
    ann = tool.get("annotations") or {}
    hints = [k for k in ("readOnlyHint", "destructiveHint", "idempotentHint", "openWorldHint") if ann.get(k)]
    if hints:
        lines.append("Annotations: %s" % ", ".join(hints))
    lines.append("MCP tool `%s` of server `%s`." % (tool["name"], server))
    return "\n".join(lines)


def _make(server, tool):
    params = tool.get("params") or []
    props = (tool.get("inputSchema") or {}).get("properties") or {}
    required = set((tool.get("inputSchema") or {}).get("required") or [])
    to_wire = {p["name"]: p["property"] for p in params}
    name = tool["function"]
    mcp_name = tool["name"]

    def wire(kwargs):
        try:
            signature.bind(**kwargs)
        except TypeError as e:
            raise TypeError("%s(): %s" % (name, e))
        return {to_wire[k]: v for k, v in kwargs.items() if v is not _MISSING}

    def f(**kwargs):
        return call(server, mcp_name, **wire(kwargs))

    async def aio(**kwargs):
        return await acall(server, mcp_name, **wire(kwargs))

    sig = []
    for p in params:
        s = props.get(p["property"], {})
        default = inspect.Parameter.empty if p["property"] in required else _MISSING
        sig.append(
            inspect.Parameter(
                p["name"], inspect.Parameter.KEYWORD_ONLY, default=default, annotation=_hint(s)
            )
        )
    signature = inspect.Signature(sig)
    for g in (f, aio):
        g.__name__ = name
        g.__qualname__ = name
        g.__module__ = "tools." + server
        g.__doc__ = _doc(server, tool)
        g.__signature__ = signature
    aio.__name__ = aio.__qualname__ = name + ".aio"
    f.aio = aio
    f.mcp_name = mcp_name
    return f


_servers = None


def _load():
    global _servers
    if _servers is not None:
        return _servers
    answer = _channel.request({"op": "catalog"})
    if answer.get("error"):
        _outcome(answer)
    _servers = {}
    for s in answer.get("servers") or []:
        mod = types.ModuleType("tools." + s["module"], s.get("description") or None)
        mod.__tools__ = {}
        for t in s.get("tools") or []:
            fn = _make(s["name"], t)
            setattr(mod, t["function"], fn)
            mod.__tools__[t["function"]] = t
        mod.__all__ = sorted(mod.__tools__)
        mod.server = s["name"]
        sys.modules["tools." + s["module"]] = mod
        globals()[s["module"]] = mod
        _servers[s["module"]] = mod
    return _servers


def servers():
    """The servers this sandbox may call: {module name: module}."""
    return dict(_load())


def search(query, limit=20):
    """Tools whose name or description contains every word of `query` (case-insensitive),
    as `server.function: first line of the description` strings."""
    words = [w for w in query.lower().split() if w]
    found = []
    for mname, mod in sorted(_load().items()):
        for fname, t in sorted(mod.__tools__.items()):
            hay = " ".join([mname, fname, t["name"], t.get("description") or ""]).lower()
            if all(w in hay for w in words):
                first = (t.get("description") or "").strip().split("\n")[0]
                found.append("%s.%s: %s" % (mname, fname, first))
    return found[:limit]


def help(what=None):  # noqa: A001 - the discovery entry point is meant to be called help
    """Print every server and its tools, or the full documentation of one tool
    (`"server.function"`) or server (`"server"`)."""
    import builtins

    mods = _load()
    if what is None:
        if not mods:
            print("No tool servers are available in this sandbox.")
        for mname, mod in sorted(mods.items()):
            print("%s: %d tools" % (mname, len(mod.__tools__)))
            for fname, t in sorted(mod.__tools__.items()):
                first = (t.get("description") or "").strip().split("\n")[0]
                print("    %s: %s" % (fname, first[:100]))
        return
    if not isinstance(what, str):
        return builtins.help(what)
    mname, _, fname = what.partition(".")
    mod = mods.get(mname)
    if mod is None:
        raise LookupError("no tool server %r (have: %s)" % (mname, ", ".join(sorted(mods)) or "none"))
    if not fname:
        return builtins.help(mod)
    fn = getattr(mod, fname, None)
    if fn is None:
        raise LookupError("server %r has no tool %r" % (mname, fname))
    print("%s.%s%s\n\n%s" % (mname, fname, inspect.signature(fn), fn.__doc__))


def _importing():
    """Whether the caller of the module's __getattr__ runs `from tools import NAME`: Python
    turns an AttributeError there into a bare "cannot import name", losing the list of the
    servers there are, so that case raises the ImportError itself."""
    try:
        import dis

        f = sys._getframe(2)
        return f.f_code.co_code[f.f_lasti] == dis.opmap["IMPORT_FROM"]
    except Exception:
        return False


def __getattr__(name):
    # `from tools import everything` and `tools.everything` load the catalog once.
    if name.startswith("__"):
        raise AttributeError(name)
    mods = _load()
    if name in mods:
        return mods[name]
    msg = "no tool server %r in this sandbox (have: %s; tools.servers() lists them)" % (
        name,
        ", ".join(sorted(mods)) or "none",
    )
    if _importing():
        raise ImportError(msg, name=name)
    raise AttributeError(msg)
