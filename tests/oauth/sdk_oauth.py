"""Sign in to mcp-code-executor with the official MCP Python SDK's OAuth client
(`OAuthClientProvider`), given only the server's URL: from the 401 it discovers the
Protected Resource Metadata and the authorization server, registers dynamically, authorizes
with PKCE (the authorization server's login and consent pages are posted headlessly, as a
user would fill them), gets a token for the server's resource and runs execute_python
`x = 41`, then `x + 1` with the returned session_id: 42. In the SDK's default mode
(2026-07-28) and its legacy mode. Prints every WWW-Authenticate challenge it received, then
`ok: MODE VERSION` per mode; exits 1 with what failed otherwise.

    python sdk_oauth.py http://127.0.0.1:PORT/mcp LOGIN
"""

import asyncio
import html
import re
import sys
from urllib.parse import parse_qs, urljoin, urlparse

import httpx2
from mcp.client.auth import OAuthClientProvider, TokenStorage
from mcp.client.client import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.auth import AuthorizationCodeResult, OAuthClientInformationFull, OAuthClientMetadata, OAuthToken

REDIRECT = "http://localhost:3999/callback"


class Memory(TokenStorage):
    def __init__(self):
        self.tokens = None
        self.client = None

    async def get_tokens(self):
        return self.tokens

    async def set_tokens(self, tokens: OAuthToken):
        self.tokens = tokens

    async def get_client_info(self):
        return self.client

    async def set_client_info(self, info: OAuthClientInformationFull):
        self.client = info


class Browser:
    """The user at the authorization server's pages: follows redirects, fills the login
    form with LOGIN (any password: development interactions), confirms the consent."""

    def __init__(self, login):
        self.login = login
        self.result = None

    async def redirect(self, url):
        async with httpx2.AsyncClient(follow_redirects=False, timeout=30) as http:
            method, data = "GET", None
            for _ in range(20):
                r = await (http.get(url) if method == "GET" else http.post(url, data=data))
                if r.status_code in (301, 302, 303, 307, 308):
                    url = urljoin(url, r.headers["location"])
                    method, data = "GET", None
                    if url.startswith(REDIRECT):
                        q = parse_qs(urlparse(url).query)
                        if "error" in q:
                            raise AssertionError(f"authorization refused: {q}")
                        self.result = AuthorizationCodeResult(
                            code=q["code"][0], state=q.get("state", [None])[0], iss=q.get("iss", [None])[0])
                        return
                    continue
                form = re.search(r'<form[^>]*action="([^"]+)"[^>]*>(.*?)</form>', r.text, re.S)
                if r.status_code != 200 or not form:
                    raise AssertionError(f"unexpected page {r.status_code} at {url}: {r.text[:300]}")
                data = {html.unescape(n): html.unescape(v) for n, v in re.findall(
                    r'<input[^>]*name="([^"]+)"[^>]*value="([^"]*)"', form.group(2))}
                names = re.findall(r'<input[^>]*name="([^"]+)"', form.group(2))
                if "login" in names:
                    data["login"] = self.login
                if "password" in names:
                    data["password"] = "any"
                url, method = urljoin(url, html.unescape(form.group(1))), "POST"
            raise AssertionError("too many steps at the authorization server")

    async def callback(self):
        assert self.result is not None, "no authorization code came back"
        return self.result


def check(cond, what, detail=""):
    if not cond:
        raise AssertionError(f"{what}: {detail}")


def text_of(result):
    return "\n".join(getattr(c, "text", "") for c in result.content)


async def main():
    url, login = sys.argv[1:3]
    storage = Memory()
    browser = Browser(login)
    challenges = []

    async def on_response(response):
        if response.status_code in (401, 403) and "www-authenticate" in response.headers:
            challenges.append(f"{response.status_code} {response.headers['www-authenticate']}")

    provider = OAuthClientProvider(
        server_url=url,
        client_metadata=OAuthClientMetadata(
            client_name="sdk-oauth-test",
            redirect_uris=[REDIRECT],
            grant_types=["authorization_code", "refresh_token"],
            response_types=["code"],
            token_endpoint_auth_method="client_secret_post",
        ),
        storage=storage,
        redirect_handler=browser.redirect,
        callback_handler=browser.callback,
    )
    for mode in ("auto", "legacy"):
        http = httpx2.AsyncClient(auth=provider, timeout=120, event_hooks={"response": [on_response]})
        async with http:
            async with Client(streamable_http_client(url, http_client=http), mode=mode) as client:
                version = client.protocol_version
                if mode == "auto":
                    check(version == "2026-07-28", "the default mode negotiates 2026-07-28", version)
                r = await client.call_tool("execute_python", {"code": "x = 41"})
                check(not r.is_error, f"{mode}: x = 41", text_of(r))
                sid = r.structured_content["session_id"]
                r = await client.call_tool("execute_python", {"code": "x + 1", "session_id": sid})
                check(not r.is_error and r.structured_content["stdout"] == "42\n",
                      f"{mode}: x + 1 with the session_id gives 42", text_of(r))
                print(f"ok: {mode} {version} session {sid}")
    check(storage.tokens is not None and storage.client is not None, "a registered client and a token")
    for c in challenges:
        print(f"challenge: {c}")
    check(any("resource_metadata=" in c for c in challenges), "a 401 named the resource metadata", challenges)
    print("ok: signed in")


if __name__ == "__main__":
    try:
        asyncio.run(main())
    except AssertionError as e:
        print(f"FAILED: {e}")
        sys.exit(1)
