"""Notifiers: where approval notifications go. A notifier is any class with ``send(delivery)`` that raises on
failure; ``GPUPOOL_NOTIFIERS`` lists the dotted paths in use (each delivery is retried with backoff by
``tenants.tasks.deliver_notification`` and its status is visible at ``/api/v1/notifications/``).

Shipped: e-mail (Django's mail backend), a generic HTTP webhook whose JSON body is signed with HMAC-SHA256
(header ``X-Gpupool-Signature: sha256=<hex>``), and the DingTalk, WeCom (企业微信) and Feishu (飞书) group
robots' message formats.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import urllib.request
from typing import Protocol

from django.conf import settings
from django.core.mail import send_mail

from tenants.models import NotificationDelivery

HTTP_TIMEOUT_SECONDS = 10


class Notifier(Protocol):
    def send(self, delivery: NotificationDelivery) -> None:
        """Deliver or raise."""


def sign(body: bytes, secret: str) -> str:
    """The webhook signature: ``sha256=`` + hex HMAC-SHA256 of the exact body bytes."""
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def _post_json(url: str, payload: dict, headers: dict[str, str] | None = None) -> bytes:
    if not url:
        raise RuntimeError("no URL configured for this notifier")
    body = json.dumps(payload, ensure_ascii=False, sort_keys=True).encode()
    request = urllib.request.Request(
        url, data=body, method="POST", headers={"Content-Type": "application/json", **(headers or {})}
    )
    with urllib.request.urlopen(request, timeout=HTTP_TIMEOUT_SECONDS) as response:
        if response.status >= 300:
            raise RuntimeError(f"HTTP {response.status}")
        return response.read()


def _text(delivery: NotificationDelivery) -> str:
    return f"{delivery.subject}\n{delivery.body}"


def _payload(delivery: NotificationDelivery) -> dict:
    return {
        "event": delivery.event,
        "approval": delivery.approval_id,
        "subject": delivery.subject,
        "body": delivery.body,
        "recipients": [r.get("username") for r in delivery.recipients],
    }


class EmailNotifier:
    def send(self, delivery: NotificationDelivery) -> None:
        addresses = [r["email"] for r in delivery.recipients if r.get("email")]
        if not addresses:
            return  # nobody to mail is not a failure worth retrying
        send_mail(delivery.subject, delivery.body, None, addresses, fail_silently=False)


class WebhookNotifier:
    """POSTs ``_payload`` as JSON to ``GPUPOOL_NOTIFY_WEBHOOK_URL``, signed with ``GPUPOOL_NOTIFY_WEBHOOK_SECRET``."""

    def send(self, delivery: NotificationDelivery) -> None:
        payload = _payload(delivery)
        body = json.dumps(payload, ensure_ascii=False, sort_keys=True).encode()
        secret = getattr(settings, "GPUPOOL_NOTIFY_WEBHOOK_SECRET", "")
        headers = {"X-Gpupool-Signature": sign(body, secret)} if secret else {}
        headers["X-Gpupool-Event"] = delivery.event
        _post_json(getattr(settings, "GPUPOOL_NOTIFY_WEBHOOK_URL", ""), payload, headers)


def dingtalk_message(delivery: NotificationDelivery) -> dict:
    return {"msgtype": "text", "text": {"content": _text(delivery)}}


def wecom_message(delivery: NotificationDelivery) -> dict:
    return {"msgtype": "text", "text": {"content": _text(delivery)}}


def feishu_message(delivery: NotificationDelivery) -> dict:
    return {"msg_type": "text", "content": {"text": _text(delivery)}}


class _RobotNotifier:
    url_setting = ""

    def message(self, delivery: NotificationDelivery) -> dict:
        raise NotImplementedError

    def send(self, delivery: NotificationDelivery) -> None:
        reply = _post_json(getattr(settings, self.url_setting, ""), self.message(delivery))
        # The robots answer 200 with an error code in the body when they refuse a message.
        try:
            answer = json.loads(reply or b"{}")
        except ValueError:
            return
        code = answer.get("errcode", answer.get("code", 0))
        if code not in (0, None):
            raise RuntimeError(f"robot refused the message: {answer}")


class DingTalkNotifier(_RobotNotifier):
    url_setting = "GPUPOOL_NOTIFY_DINGTALK_URL"

    def message(self, delivery: NotificationDelivery) -> dict:
        return dingtalk_message(delivery)


class WeComNotifier(_RobotNotifier):
    url_setting = "GPUPOOL_NOTIFY_WECOM_URL"

    def message(self, delivery: NotificationDelivery) -> dict:
        return wecom_message(delivery)


class FeishuNotifier(_RobotNotifier):
    url_setting = "GPUPOOL_NOTIFY_FEISHU_URL"

    def message(self, delivery: NotificationDelivery) -> dict:
        return feishu_message(delivery)
