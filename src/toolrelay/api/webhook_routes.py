"""/v1/webhooks for owners: the HTTP door to toolrelay.notify.Webhooks (the CLI's too)."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal, get_args
from uuid import UUID

from fastapi import APIRouter, Depends, Query, Response, status
from pydantic import BaseModel, ConfigDict, Field

from toolrelay.api.auth import owner_caller
from toolrelay.api.context import ApiContext, request_context
from toolrelay.api.errors import BODY, SPLIT, error_responses
from toolrelay.notify import EVENTS, Webhooks
from toolrelay.notify.subscriptions import MAX_LIMIT, MAX_URL_LENGTH
from toolrelay.tokens import Caller

router = APIRouter(prefix="/v1", tags=["webhooks"])

Ctx = Annotated[ApiContext, Depends(request_context)]
Owner = Annotated[Caller, Depends(owner_caller)]
Event = Literal[
    "invocation.pending",
    "invocation.approved",
    "invocation.rejected",
    "invocation.completed",
    "invocation.failed",
    "invocation.expired",
]
assert set(get_args(Event)) == set(EVENTS)


def _all_events() -> list[Event]:
    return list(get_args(Event))


def _webhooks(context: Ctx, caller: Owner) -> Webhooks:
    return Webhooks(context.db, caller, context.settings.keyring)  # a member acts as itself


Hooks = Annotated[Webhooks, Depends(_webhooks)]


class WebhookIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    url: str = Field(
        min_length=1,
        max_length=MAX_URL_LENGTH,
        description="Where to POST (http or https). Stored sealed, never returned: it can be"
        " a credential (a Slack incoming webhook's path is).",
    )
    events: list[Event] = Field(default_factory=_all_events, min_length=1)
    format: Literal["standard", "slack"] = "standard"


class WebhookPatch(BaseModel):
    model_config = ConfigDict(extra="forbid")
    enabled: bool


class WebhookOut(BaseModel):
    id: UUID
    url: str = Field(
        description="What is safe to show of the URL: scheme://host[:port]/, with … for its"
        " path and query (the URL itself is stored sealed and never returned)."
    )
    format: str
    events: list[str]
    enabled: bool
    created_at: datetime
    secret_rotated_at: datetime | None = None
    pending: int | None = None
    dead: int | None = None


class WebhookCreated(WebhookOut):
    secret: str = Field(description="The signing secret (whsec_...): shown this once.")


class WebhookList(BaseModel):
    items: list[WebhookOut]


class DeliveryOut(BaseModel):
    id: UUID
    subscription_id: UUID
    invocation_id: UUID
    event: str
    payload: dict[str, Any]
    created_at: datetime
    attempts: int
    max_attempts: int
    next_attempt_at: datetime
    last_attempt_at: datetime | None
    last_status: int | None
    last_error: str | None
    delivered_at: datetime | None
    dead: bool


class DeliveryList(BaseModel):
    items: list[DeliveryOut]


# Before /webhooks/{webhook_id}, which would take "deliveries" for an id.
@router.get("/webhooks/deliveries", operation_id="listWebhookDeliveries",
            responses=error_responses(*SPLIT, 422), summary="Deliveries, newest first")  # fmt: skip
def list_deliveries(
    hooks: Hooks,
    dead: bool = False,
    webhook_id: UUID | None = None,
    limit: Annotated[int, Query(ge=1, le=MAX_LIMIT)] = 50,
) -> DeliveryList:
    rows = hooks.deliveries(dead=dead, subscription_id=webhook_id, limit=limit)
    return DeliveryList(items=[DeliveryOut.model_validate(r) for r in rows])


@router.post("/webhooks/deliveries/{delivery_id}/redeliver", operation_id="redeliverWebhook",
             responses=error_responses(*SPLIT, 404, 422),
             summary="Send a delivery again now (same webhook-id)")  # fmt: skip
def redeliver(delivery_id: UUID, hooks: Hooks) -> DeliveryOut:
    return DeliveryOut.model_validate(hooks.redeliver(delivery_id))


@router.get("/webhooks", operation_id="listWebhooks", responses=error_responses(*SPLIT),
            summary="List webhooks (never their secrets)")  # fmt: skip
def list_webhooks(hooks: Hooks) -> WebhookList:
    return WebhookList(items=[WebhookOut.model_validate(r) for r in hooks.list()])


@router.post(
    "/webhooks",
    operation_id="createWebhook",
    responses=error_responses(*SPLIT, *BODY),
    status_code=status.HTTP_201_CREATED,
    summary="Subscribe a URL; the answer holds its signing secret, this once",
)
def create_webhook(body: WebhookIn, hooks: Hooks) -> WebhookCreated:
    row, secret = hooks.add(body.url, list(body.events), body.format)
    return WebhookCreated.model_validate(row | {"secret": secret})


@router.get("/webhooks/{webhook_id}", operation_id="getWebhook",
            responses=error_responses(*SPLIT, 404, 422), summary="Show a webhook")  # fmt: skip
def get_webhook(webhook_id: UUID, hooks: Hooks) -> WebhookOut:
    return WebhookOut.model_validate(hooks.get(webhook_id))


@router.patch("/webhooks/{webhook_id}", operation_id="updateWebhook",
              responses=error_responses(*SPLIT, *BODY, 404),
              summary="Enable or disable a webhook")  # fmt: skip
def update_webhook(webhook_id: UUID, body: WebhookPatch, hooks: Hooks) -> WebhookOut:
    return WebhookOut.model_validate(hooks.set_enabled(webhook_id, body.enabled))


@router.delete(
    "/webhooks/{webhook_id}",
    operation_id="deleteWebhook",
    responses=error_responses(*SPLIT, 404, 422),
    status_code=status.HTTP_204_NO_CONTENT,
    summary="Delete a webhook and its deliveries",
)
def delete_webhook(webhook_id: UUID, hooks: Hooks) -> Response:
    hooks.remove(webhook_id)
    return Response(status_code=status.HTTP_204_NO_CONTENT)


@router.post("/webhooks/{webhook_id}/rotate-secret", operation_id="rotateWebhookSecret",
             responses=error_responses(*SPLIT, 404, 422),
             summary="A new signing secret, shown this once")  # fmt: skip
def rotate_webhook_secret(webhook_id: UUID, hooks: Hooks) -> WebhookCreated:
    row, secret = hooks.rotate_secret(webhook_id)
    return WebhookCreated.model_validate(row | {"secret": secret})
