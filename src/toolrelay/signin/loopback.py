"""A native app's sign-in (RFC 8252): a one-request HTTP server on a free loopback port
receives the provider's redirect, for ``toolrelay login``.

Anything else that reaches the port (another local process guessing it) is answered 400 and
ignored; only the answer carrying this sign-in's state ends the wait.
"""

from __future__ import annotations

import asyncio
import hmac
from collections.abc import Callable
from typing import Final

from aiohttp import web

from toolrelay.signin.oidc import Identity, OidcClient, SignInError

Show = Callable[[str], None]  # shows the person where to sign in
CALLBACK_PATH: Final = "/callback"
DONE_PAGE: Final = (
    "<!doctype html><meta charset=utf-8><title>toolrelay</title>"
    "<p>{}</p><p>You can close this tab and return to the terminal.</p>"
)


async def sign_in(client: OidcClient, show: Show, timeout: float) -> Identity:
    """Send the person to the provider (``show`` gets the URL), wait for its answer on
    127.0.0.1, exchange the code; SignInError saying why it did not complete."""
    answer: asyncio.Future[dict[str, str]] = asyncio.get_running_loop().create_future()
    expected: list[str] = []

    async def callback(request: web.Request) -> web.Response:
        params = dict(request.query)
        state = params.get("state", "")
        if not expected or not hmac.compare_digest(state.encode(), expected[0].encode()):
            return web.Response(status=400, text="not this sign-in")
        if not answer.done():
            answer.set_result(params)
        said = "Sign-in refused by the provider." if "error" in params else "Signed in."
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
        started = await client.start(redirect)
        expected.append(started.state)
        show(started.url)
        try:
            params = await asyncio.wait_for(answer, timeout)
        except TimeoutError:
            raise SignInError(f"no answer from the provider within {timeout:g} s") from None
    finally:
        await runner.cleanup()
    meta = await client.metadata()
    client.check_response_issuer(meta, params.get("iss"))
    if "error" in params:
        said = params["error"]
        if params.get("error_description"):
            said += f": {params['error_description']}"
        raise SignInError(f"the provider said {said[:300]}")
    if not params.get("code"):
        raise SignInError("the provider's answer carries no code")
    return await client.finish(params["code"], redirect, started.code_verifier, started.nonce)
