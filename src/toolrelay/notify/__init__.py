"""Notifications (issue 16, item 4): webhook subscriptions per tenant, a durable outbox
written by the database, and a deliverer inside the worker. See docs/notifications.md."""

from toolrelay.notify.deliver import Deliverer, DeliveryMetrics, backoff, run_in_worker
from toolrelay.notify.payloads import PUBLIC_URL_ENV, public_url, render
from toolrelay.notify.subscriptions import EVENTS, FORMATS, Webhooks

__all__ = [
    "EVENTS",
    "FORMATS",
    "PUBLIC_URL_ENV",
    "Deliverer",
    "DeliveryMetrics",
    "Webhooks",
    "backoff",
    "public_url",
    "render",
    "run_in_worker",
]
