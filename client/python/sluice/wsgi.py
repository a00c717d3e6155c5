"""wsgi.py: WSGI middleware that asks sluiced before each request.

    app = sluice.wsgi.RateLimit(app, sluice.Client(path), "api",
                                key=sluice.wsgi.client_ip)

Each request's key comes from `key(environ)` (str or bytes; None lets the
request through unlimited). Allowed: the app answers, with RateLimit and
RateLimit-Policy added to its headers. Denied: 429 with Retry-After, the
same two headers and a small JSON body, and the app is not called. What an
unreachable daemon means is the client's on_unreachable policy (fail_open by
default). The client is thread-safe, so one middleware serves every thread
of a threaded server.
"""

from ._http import STATUS_TOO_MANY, check_rule, decision_headers, denial_body


def client_ip(environ):
    """The peer's address (REMOTE_ADDR); behind a proxy, key on the header
    it sets instead (header_key("X-Forwarded-For") or your own parsing)."""
    return environ.get("REMOTE_ADDR")


def header_key(name):
    """A key function reading request header `name` (e.g. "X-Api-Key");
    requests without it are not limited."""
    env_name = "HTTP_" + name.upper().replace("-", "_")
    return lambda environ: environ.get(env_name)


class RateLimit:
    """The middleware: `rule` is the rule to spend, `cost` the units a
    request spends (an int, or a function of environ), `window_s` the
    rule's period for RateLimit-Policy's w (0 leaves it out)."""

    def __init__(self, app, client, rule, key=client_ip, cost=1, window_s=0):
        self.app = app
        self.client = client
        self.rule = check_rule(rule)
        self.key = key
        self.cost = cost
        self.window_s = window_s

    def __call__(self, environ, start_response):
        key = self.key(environ)
        if key is None:
            return self.app(environ, start_response)
        cost = self.cost(environ) if callable(self.cost) else self.cost
        decision = self.client.acquire(self.rule, key, cost)
        headers = decision_headers(decision, self.rule, self.window_s)
        if not decision.allowed:
            body = denial_body(decision, self.rule)
            start_response(STATUS_TOO_MANY, headers + [
                ("Content-Type", "application/json"), ("Content-Length", str(len(body)))])
            return [body]

        def start_with_headers(status, response_headers, exc_info=None):
            return start_response(status, list(response_headers) + headers, exc_info)

        return self.app(environ, start_with_headers)
