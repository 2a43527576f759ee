"""What stands in front of the routes: the request body's size limit and the API keys."""

import secrets
from pathlib import Path

from llogos_cli.errors import LlogosError
from llogos_cli.server.errors import ApiError

MAX_BODY = 8 * 2 ** 20   # bytes; a prompt of the longest contexts llogos runs is well under this


class BodyLimit:
    """ASGI middleware: reads the whole request body, refusing it with 413 once it passes the limit,
    then hands it to the app in one piece. Whatever a client declares in Content-Length, no more than
    the limit is ever held in memory."""

    def __init__(self, app, limit: int = MAX_BODY, render=lambda path, e: e.response()):
        """render(path, error): the refusal in the shape of the API at that path."""
        self.app, self.limit, self.render = app, limit, render

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = dict(scope["headers"]).get(b"content-length", b"0")
        if declared.isdigit() and int(declared) > self.limit:
            return await self._refuse(scope, send)
        body = bytearray()
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body += message.get("body", b"")
            if len(body) > self.limit:
                return await self._refuse(scope, send)
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

    async def _refuse(self, scope, send) -> None:
        response = self.render(scope["path"], ApiError(413, f"the request body is larger than {self.limit} bytes",
                                                       code="body_too_large"))
        response.headers["connection"] = "close"
        await response({"type": "http"}, _no_receive, send)


async def _no_receive():
    return {"type": "http.disconnect"}


def api_keys(listed: str | None, file: Path | None) -> tuple[str, ...]:
    """The keys of --api-key (comma-separated, as llama-server takes them) and --api-key-file (one a
    line, blank lines skipped); none: the server is open."""
    keys = []
    if listed is not None:
        keys += [k.strip() for k in listed.split(",")]
        if not all(keys):
            raise LlogosError("--api-key has an empty key")
    if file is not None:
        try:
            lines = file.read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError) as e:
            raise LlogosError(f"cannot read --api-key-file {file}: {getattr(e, 'strerror', None) or e}") from None
        found = [line.strip() for line in lines if line.strip()]
        if not found:
            raise LlogosError(f"--api-key-file {file} has no keys")
        keys += found
    return tuple(keys)


def check_key(expected: tuple[str, ...], authorization: str | None) -> None:
    """`Authorization: Bearer KEY` must carry one of the server's keys, when it has any."""
    if not expected:
        return
    scheme, _, given = (authorization or "").partition(" ")
    given = given.strip().encode()
    # every key compared, so that the time taken does not tell which one came close
    matches = [secrets.compare_digest(given, key.encode()) for key in expected]
    if scheme.lower() != "bearer" or not any(matches):
        raise ApiError(401, "invalid or missing API key (send Authorization: Bearer KEY)", code="invalid_api_key")
