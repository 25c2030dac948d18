"""A diagnostic WebSocket: what a client sends goes through the channel layer (Redis in production) and back.

It lets an operator (and the integration tests) prove the Channels layer works end to end.
"""

from __future__ import annotations

from channels.generic.websocket import AsyncJsonWebsocketConsumer


class EchoConsumer(AsyncJsonWebsocketConsumer):
    group_name = "portal.echo"

    async def connect(self) -> None:
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await self.close(code=4401)
            return
        await self.channel_layer.group_add(self.group_name, self.channel_name)
        await self.accept()

    async def disconnect(self, code: int) -> None:
        await self.channel_layer.group_discard(self.group_name, self.channel_name)

    async def receive_json(self, content: dict, **kwargs) -> None:
        # Through the layer, not straight back: the reply proves the layer delivered it.
        await self.channel_layer.group_send(self.group_name, {"type": "echo.message", "content": content})

    async def echo_message(self, event: dict) -> None:
        await self.send_json({"echo": event["content"]})
