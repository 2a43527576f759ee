"""What stands in front of the routes: the request body's size limit and the API key."""

import secrets

from llogos_cli.server.errors import ApiError

MAX_BODY = 8 * 2 ** 20   # bytes; a prompt of the longest contexts llogos runs is well under this


class BodyLimit:
    """ASGI middleware: reads the whole request body, refusing it with 413 once it passes the limit,
    then hands it to the app in one piece. Whatever a client declares in Content-Length, no more than
    the limit is ever held in memory."""

    def __init__(self, app, limit: int = MAX_BODY):
        self.app, self.limit = app, limit

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = dict(scope["headers"]).get(b"content-length", b"0")
        if declared.isdigit() and int(declared) > self.limit:
            return await self._refuse(send)
        body = bytearray()
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body += message.get("body", b"")
            if len(body) > self.limit:
                return await self._refuse(send)
            if not message.get("more_body", False):
                break
        replayed = False

        async def replay():
            nonlocal replayed
            if replayed:          # later calls wait for the client to go away, as the server's own do
                return await receive()
            replayed = True
            return {"type": "http.request", "body": bytes(body), "more_body": False}

        await self.app(scope, replay, send)

    async def _refuse(self, send) -> None:
        response = ApiError(413, f"the request body is larger than {self.limit} bytes", code="body_too_large").response()
        response.headers["connection"] = "close"
        await response({"type": "http"}, _no_receive, send)


async def _no_receive():
    return {"type": "http.disconnect"}


def check_key(expected: str | None, authorization: str | None) -> None:
    """`Authorization: Bearer KEY` must carry the server's key, when it has one."""
    if expected is None:
        return
    scheme, _, given = (authorization or "").partition(" ")
    if scheme.lower() != "bearer" or not secrets.compare_digest(given.strip().encode(), expected.encode()):
        raise ApiError(401, "invalid or missing API key (send Authorization: Bearer KEY)", code="invalid_api_key")
