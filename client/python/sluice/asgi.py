"""asgi.py: ASGI middleware that asks sluiced before each HTTP request.

    app = sluice.asgi.RateLimit(app, sluice.AsyncClient(path), "api",
                                key=sluice.asgi.client_ip)

Each HTTP request's key comes from `key(scope)` (str or bytes; None lets the
request through unlimited); other scopes (websocket, lifespan) pass through.
Allowed: the app answers, with RateLimit and RateLimit-Policy added to its
response headers. Denied: 429 with Retry-After, the same two headers and a
small JSON body, and the app is not called. What an unreachable daemon
means is the client's on_unreachable policy (fail_open by default). The
AsyncClient binds to the server's event loop at its first call.
"""

from ._http import check_rule, decision_headers, denial_body


def client_ip(scope):
    """The peer's address (scope["client"]); None when the server gives none."""
    client = scope.get("client")
    return client[0] if client else None


def header_key(name):
    """A key function reading request header `name` (e.g. "X-Api-Key"), as
    bytes; requests without it are not limited."""
    wanted = name.lower().encode("latin-1")

    def key(scope):
        for header, value in scope.get("headers", ()):
            if header == wanted:
                return value
        return None
    return key


def _encoded(pairs):
    return [(name.lower().encode("latin-1"), value.encode("latin-1")) for name, value in pairs]


class RateLimit:
    """The middleware; the arguments are sluice.wsgi.RateLimit's, with
    functions of the ASGI scope."""

    def __init__(self, app, client, rule, key=client_ip, cost=1, window_s=0):
        self.app = app
        self.client = client
        self.rule = check_rule(rule)
        self.key = key
        self.cost = cost
        self.window_s = window_s

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        key = self.key(scope)
        if key is None:
            return await self.app(scope, receive, send)
        cost = self.cost(scope) if callable(self.cost) else self.cost
        decision = await self.client.acquire(self.rule, key, cost)
        headers = _encoded(decision_headers(decision, self.rule, self.window_s))
        if not decision.allowed:
            body = denial_body(decision, self.rule)
            await send({"type": "http.response.start", "status": 429, "headers": headers + [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode())]})
            await send({"type": "http.response.body", "body": body})
            return None

        async def send_with_headers(message):
            if message["type"] == "http.response.start":
                message = dict(message)
                message["headers"] = list(message.get("headers", ())) + headers
            await send(message)

        return await self.app(scope, receive, send_with_headers)
