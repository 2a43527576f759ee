"""Running the app under uvicorn on a socket we bound, with a shutdown that exits cleanly."""

import asyncio
import contextlib
import signal
import socket
from collections.abc import Callable

import uvicorn


class _Server(uvicorn.Server):
    """uvicorn's server with a shutdown of our own: after the grace, `close` ends the requests still in
    flight, so that their clients get a proper answer rather than a cut connection (uvicorn's own
    timeout, a little later, stays as a backstop); and signal handling that ends in a clean exit,
    where uvicorn's re-raises the signal once it has shut down, turning a graceful SIGTERM into a kill."""

    def __init__(self, config: uvicorn.Config, grace_s: float, close: Callable[[], None]):
        super().__init__(config)
        self.grace_s, self.close = grace_s, close

    async def shutdown(self, sockets=None) -> None:
        asyncio.get_running_loop().call_later(self.grace_s, self.close)
        await super().shutdown(sockets)

    @contextlib.contextmanager
    def capture_signals(self):
        previous = {sig: signal.signal(sig, self.handle_exit) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)


def run(app, sock: socket.socket, grace_s: float, close: Callable[[], None]) -> uvicorn.Server:
    """Serve until Ctrl-C or SIGTERM: then stop accepting, give in-flight requests grace_s seconds
    to finish, and close the rest."""
    server = _Server(uvicorn.Config(app, log_level="warning", access_log=False, lifespan="on",
                                    timeout_graceful_shutdown=grace_s + 2), grace_s, close)
    app.state.server = server   # so that a failed load can end it
    server.run(sockets=[sock])
    return server
