"""Error responses shaped the way Postiz's NestJS backend shapes them."""

from __future__ import annotations

from typing import Any

from aiohttp import web


class ApiError(Exception):
    """Raised by handlers; turned into a JSON response by the error middleware."""

    def __init__(self, status: int, body: Any) -> None:
        super().__init__(status, body)
        self.status = status
        self.body = body

    def response(self) -> web.Response:
        return web.json_response(self.body, status=self.status)


def unauthorized(msg: str) -> ApiError:
    return ApiError(401, {"msg": msg})


def bad_request(message: list[str] | str) -> ApiError:
    return ApiError(400, {"message": message, "error": "Bad Request", "statusCode": 400})


def internal_error() -> ApiError:
    return ApiError(500, {"statusCode": 500, "message": "Internal server error"})


def too_many_requests() -> ApiError:
    return ApiError(429, {"statusCode": 429, "message": "ThrottlerException: Too Many Requests"})


def not_found(method: str, path: str) -> ApiError:
    return ApiError(
        404, {"message": f"Cannot {method} {path}", "error": "Not Found", "statusCode": 404}
    )


def post_too_long(provider: str, channel_name: str) -> ApiError:
    return ApiError(
        400,
        {
            "statusCode": 400,
            "provider": provider,
            "name": channel_name,
            "message": "post is too long, please fix it",
        },
    )
