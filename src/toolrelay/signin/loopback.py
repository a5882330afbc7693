"""A native app's sign-in (RFC 8252): a one-request HTTP server on a free loopback port
receives the provider's redirect, for ``toolrelay login``.

Anything else that reaches the port (another local process guessing it) is answered 400 and
ignored; only the answer carrying this sign-in's state ends the wait.
"""

from __future__ import annotations

import asyncio
import hmac
from collections.abc import Awaitable, Callable
from typing import Final

from aiohttp import web

from toolrelay.signin.oidc import Identity, OidcClient, SignInError, Started

Show = Callable[[str], None]  # shows the person where to sign in
CALLBACK_PATH: Final = "/callback"
DONE_PAGE: Final = (
    "<!doctype html><meta charset=utf-8><title>toolrelay</title>"
    "<p>{}</p><p>You can close this tab and return to the terminal.</p>"
)


async def receive(
    start: Callable[[str], Awaitable[tuple[str, str]]], show: Show, timeout: float
) -> tuple[dict[str, str], str]:
    """Listen on 127.0.0.1, ``start(redirect_uri)`` → (the URL to send the person to, its
    state), show the URL, and wait for the redirect carrying that state: its query
    parameters and the redirect URI. SignInError when none comes within ``timeout``."""
    answer: asyncio.Future[dict[str, str]] = asyncio.get_running_loop().create_future()
    expected: list[str] = []

    async def callback(request: web.Request) -> web.Response:
        params = dict(request.query)
        state = params.get("state", "")
        if not expected or not hmac.compare_digest(state.encode(), expected[0].encode()):
            return web.Response(status=400, text="not this sign-in")
        if not answer.done():
            answer.set_result(params)
        said = "Refused by the provider." if "error" in params else "Done."
        return web.Response(text=DONE_PAGE.format(said), content_type="text/html")

    app = web.Application()
    app.router.add_get(CALLBACK_PATH, callback)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        port = runner.addresses[0][1]
        redirect = f"http://127.0.0.1:{port}{CALLBACK_PATH}"
        url, state = await start(redirect)
        expected.append(state)
        show(url)
        try:
            return await asyncio.wait_for(answer, timeout), redirect
        except TimeoutError:
            raise SignInError(f"no answer from the provider within {timeout:g} s") from None
    finally:
        await runner.cleanup()


def provider_error(params: dict[str, str]) -> str | None:
    """The provider's error in a redirect (``error: description``), None without one."""
    if "error" not in params:
        return None
    said = params["error"]
    if params.get("error_description"):
        said += f": {params['error_description']}"
    return said[:300]


async def sign_in(client: OidcClient, show: Show, timeout: float) -> Identity:
    """Send the person to the provider (``show`` gets the URL), wait for its answer on
    127.0.0.1, exchange the code; SignInError saying why it did not complete."""
    started: list[Started] = []

    async def begin(redirect: str) -> tuple[str, str]:
        started.append(await client.start(redirect))
        return started[0].url, started[0].state

    params, redirect = await receive(begin, show, timeout)
    meta = await client.metadata()
    client.check_response_issuer(meta, params.get("iss"))
    said = provider_error(params)
    if said is not None:
        raise SignInError(f"the provider said {said}")
    if not params.get("code"):
        raise SignInError("the provider's answer carries no code")
    flow = started[0]
    return await client.finish(params["code"], redirect, flow.code_verifier, flow.nonce)
