"""A real OAuth token endpoint on 127.0.0.1 for the tests (aiohttp.web), and a raw server
whose answers arrive in two pieces."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any
from urllib.parse import parse_qsl

import jwt
from aiohttp import web
from aiohttp.test_utils import TestServer

from toolrelay.credentials.service_account import JWT_BEARER


class TokenServer:
    """Refresh-token and JWT-bearer grants; counts requests; can fail on demand."""

    def __init__(self) -> None:
        self.client_id = "client-1"
        self.client_secret = f"client-secret-{uuid.uuid4().hex}"
        self.refresh_tokens: set[str] = set()  # currently valid
        self.rotate_refresh_tokens = False
        self.expires_in: int | None = 3600
        self.delay = 0.0
        self.queued: list[tuple[int, dict[str, Any]]] = []  # answered first, in order
        self.sa_public_key: Any = None
        self.sa_audience: str | None = None
        self.requests: list[dict[str, str]] = []
        self.assertions: list[dict[str, Any]] = []
        self.issued: list[str] = []
        self._server: TestServer | None = None

    async def start(self) -> None:
        app = web.Application()
        app.router.add_post("/token", self._handle)
        self._server = TestServer(app, host="127.0.0.1")
        await self._server.start_server()

    async def close(self) -> None:
        if self._server is not None:
            await self._server.close()

    @property
    def url(self) -> str:
        assert self._server is not None
        return str(self._server.make_url("/token"))

    def new_refresh_token(self) -> str:
        token = f"refresh-{uuid.uuid4().hex}"
        self.refresh_tokens.add(token)
        return token

    def grants(self, grant_type: str) -> list[dict[str, str]]:
        return [r for r in self.requests if r.get("grant_type") == grant_type]

    async def _handle(self, request: web.Request) -> web.Response:
        form = {k: str(v) for k, v in (await request.post()).items()}
        self.requests.append(form)
        if self.delay:
            await asyncio.sleep(self.delay)
        if self.queued:
            status, body = self.queued.pop(0)
            return web.json_response(body, status=status)
        if form.get("grant_type") == "refresh_token":
            return self._refresh(form)
        if form.get("grant_type") == JWT_BEARER:
            return self._jwt_bearer(form)
        return web.json_response({"error": "unsupported_grant_type"}, status=400)

    def _refresh(self, form: dict[str, str]) -> web.Response:
        if (form.get("client_id"), form.get("client_secret")) != (
            self.client_id,
            self.client_secret,
        ):
            return web.json_response({"error": "invalid_client"}, status=401)
        if form.get("refresh_token") not in self.refresh_tokens:
            return web.json_response({"error": "invalid_grant"}, status=400)
        body = self._issue()
        if self.rotate_refresh_tokens:
            self.refresh_tokens.discard(form["refresh_token"])
            body["refresh_token"] = self.new_refresh_token()
        return web.json_response(body)

    def _jwt_bearer(self, form: dict[str, str]) -> web.Response:
        try:
            claims = jwt.decode(
                form.get("assertion", ""),
                self.sa_public_key,
                algorithms=["RS256"],
                audience=self.sa_audience,
                options={"require": ["exp", "iat", "iss", "sub", "aud"]},
            )
        except jwt.PyJWTError as exc:
            return web.json_response(
                {"error": "invalid_grant", "error_description": str(exc)}, status=400
            )
        self.assertions.append(claims)
        return web.json_response(self._issue())

    def _issue(self) -> dict[str, Any]:
        token = f"access-{uuid.uuid4().hex}"
        self.issued.append(token)
        body: dict[str, Any] = {"access_token": token, "token_type": "Bearer"}
        if self.expires_in is not None:
            body["expires_in"] = self.expires_in
        return body


class SplitAnswer:
    """A raw HTTP server on 127.0.0.1 that answers every request with ``body`` in two pieces:
    the head and the first ``first`` bytes, then the rest only once the client shows it is
    still waiting (it has not closed within ``HOLD_S``). A client that takes the first piece
    for the whole body closes at once and never gets the rest (``cut`` says so). The hold
    only decides when the rest is sent, never whether a client that reads to the end gets it.
    """

    HOLD_S = 1.0

    def __init__(self, body: bytes, first: int = 16, content_type: str = "application/json"):
        self.body, self.first, self.content_type = body, first, content_type
        self.cut = False  # the client closed after the first piece
        self.forms: list[dict[str, str]] = []  # each request's form body
        self._server: asyncio.Server | None = None

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    def url(self, path: str) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}{path}"

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            length = 0
            while (line := await reader.readline()) not in (b"\r\n", b""):
                name, _, value = line.decode("latin-1").partition(":")
                if name.strip().lower() == "content-length":
                    length = int(value)
            self.forms.append(dict(parse_qsl((await reader.readexactly(length)).decode())))
            head = (
                f"HTTP/1.1 200 OK\r\nContent-Type: {self.content_type}\r\n"
                f"Content-Length: {len(self.body)}\r\nConnection: close\r\n\r\n"
            ).encode()
            writer.write(head + self.body[: self.first])
            await writer.drain()
            try:
                closed = await asyncio.wait_for(reader.read(1), self.HOLD_S) == b""
            except TimeoutError:
                closed = False
            if closed:
                self.cut = True
                return
            writer.write(self.body[self.first :])
            await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            self.cut = True
        finally:
            writer.close()
