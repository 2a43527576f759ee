"""The chat page at `/`: static files shipped in the package (server/webui/), read once at start.

The page talks to the server's public API only, so it has no routes of its own beyond its files.
Each file has an ETag and `no-cache` (the browser asks again each time and gets a 304 while the
file is the same, so an upgraded llogos is never shown with a stale script), and a
Content-Security-Policy that lets the page load and fetch from its own origin alone: a reply
rendered as Markdown can never pull in a script, a picture or a request from elsewhere.
"""

import hashlib
from dataclasses import dataclass
from pathlib import Path

from fastapi import FastAPI, Request, Response

FOLDER = Path(__file__).with_name("webui")
MEDIA_TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8",
               ".css": "text/css; charset=utf-8", ".svg": "image/svg+xml"}
CSP = ("default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
       "object-src 'none'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
# Browsers ask for /favicon.ico whatever the page links; it gets the page's own icon.
ALIASES = {"/": "index.html", "/favicon.ico": "favicon.svg"}


@dataclass(frozen=True, slots=True)
class StaticFile:
    body: bytes
    media_type: str
    etag: str

    def response(self, if_none_match: str | None) -> Response:
        headers = {"ETag": self.etag, "Cache-Control": "no-cache", "Content-Security-Policy": CSP,
                   "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer"}
        if if_none_match and _matches(if_none_match, self.etag):
            return Response(status_code=304, headers=headers)
        return Response(self.body, media_type=self.media_type, headers=headers)


def _matches(if_none_match: str, etag: str) -> bool:
    tags = [t.strip().removeprefix("W/") for t in if_none_match.split(",")]
    return "*" in tags or etag in tags


def _read(path: Path) -> StaticFile:
    body = path.read_bytes()
    return StaticFile(body, MEDIA_TYPES[path.suffix], '"' + hashlib.sha256(body).hexdigest()[:20] + '"')


def register(app: FastAPI) -> None:
    files = {f"/{p.name}": _read(p) for p in sorted(FOLDER.iterdir()) if p.suffix in MEDIA_TYPES}
    files |= {url: files[f"/{name}"] for url, name in ALIASES.items()}

    def route(static: StaticFile):
        async def serve(request: Request) -> Response:
            return static.response(request.headers.get("if-none-match"))
        return serve

    for url, static in files.items():
        app.add_api_route(url, route(static), methods=["GET", "HEAD"], include_in_schema=False)
