"""The webhook sink: each chunk of events is one signed HTTP POST (``delivery.request``)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from pgferry.delivery import request
from pgferry.delivery.health import Endpoint
from pgferry.delivery.http import HttpResult, endpoint_of
from pgferry.delivery.model import OutEvent, Subscription
from pgferry.delivery.signing import Signer
from pgferry.delivery.sink import Prepared, Sink

if TYPE_CHECKING:
    from pgferry.delivery.context import DeliveryContext


class WebhookSink(Sink):
    def __init__(self, sub: Subscription, ctx: DeliveryContext) -> None:
        super().__init__(sub, ctx)
        self.signer = Signer(sub.secrets)

    @property
    def endpoint(self) -> Endpoint:
        return endpoint_of(self.sub.url)

    def prepare(self, chunk: Sequence[OutEvent]) -> Prepared | HttpResult:
        try:
            return request.build(self.sub, chunk, self.signer, max_body_bytes=self.ctx.max_body_bytes)
        except request.BadRequest as exc:
            return HttpResult(None, exc.error_class, str(exc), None, 0.0)

    async def send(
        self, chunk: Sequence[OutEvent], prepared: Prepared, on_wire: Callable[[], bool] | None, *, fresh: bool
    ) -> HttpResult:
        req: request.Request = prepared
        sub = self.sub
        return await self.ctx.http.send(
            sub.url,
            req.body,
            req.headers,
            timeout=sub.timeout_ms / 1000,
            connect_timeout=sub.connect_timeout_ms / 1000,
            on_wire=on_wire,
            fresh=fresh,
        )

    def gone(self, result: HttpResult) -> str | None:
        return "endpoint answered 410 Gone" if result.status == 410 else None

    def endpoint_down(self) -> None:
        self.ctx.http.drop_idle(self.endpoint)
