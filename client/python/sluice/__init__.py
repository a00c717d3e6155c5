"""sluice: the Python client of the sluiced rate-limiting daemon.

    import sluice
    client = sluice.Client("/run/sluice/sluice.sock")
    decision = client.acquire("api", "user:42")   # .allowed, .remaining, ...

Client is the thread-safe synchronous client, AsyncClient the asyncio one;
both pipeline every call on one connection. format_headers gives the
RateLimit, RateLimit-Policy and Retry-After values of a decision, and
sluice.wsgi / sluice.asgi hold the middleware. Depends on msgpack only.
"""

from .aio import AsyncClient
from .client import Client
from .errors import (CallTimeout, ConnectError, ConnectionClosed, ProtocolError, ServerError,
                     SluiceError, UnknownReservation)
from .headers import RateLimitHeaders, format_headers, header_pairs
from .results import MODE_UNREACHABLE, AllDecision, Decision, Health, Reservation, Settlement
from ._wire import DEFAULT_SOCKET, DEFAULT_TTL_MS

__version__ = "0.1.0"

__all__ = [
    "AllDecision", "AsyncClient", "CallTimeout", "Client", "ConnectError", "ConnectionClosed",
    "DEFAULT_SOCKET", "DEFAULT_TTL_MS", "Decision", "Health", "MODE_UNREACHABLE", "ProtocolError",
    "RateLimitHeaders", "Reservation", "ServerError", "Settlement", "SluiceError",
    "UnknownReservation", "format_headers", "header_pairs",
]
