#!/usr/bin/python3
"""The WSGI and ASGI middleware in real servers (wsgiref.simple_server,
uvicorn) in front of a real sluiced: allowed requests reach the app and get
RateLimit headers, denied ones get 429 with Retry-After, the headers and a
JSON body, without reaching the app; the key function picks the key; an
unreachable daemon answers by the client's policy."""

import http.client
import json
import os
import socket
import socketserver
import threading
import unittest
import wsgiref.simple_server

import support
from support import SMALL, harness

import sluice
import sluice.asgi
import sluice.wsgi

WINDOW_S = 60  # `small` is 3 a minute


def ceil_seconds(ms):
    return -(-ms // 1000)


class MiddlewareTests:
    """The cases both middlewares pass; a subclass serves `self.port`."""

    def request(self, api_key=None):
        """GET / with X-Api-Key; (status, {lowercased header: value}, body)."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        try:
            conn.request("GET", "/", headers={"X-Api-Key": api_key} if api_key else {})
            response = conn.getresponse()
            body = response.read()
            return response.status, {k.lower(): v for k, v in response.getheaders()}, body
        finally:
            conn.close()

    # Verifies three requests a minute pass with the headers, and the fourth
    # is answered 429 with Retry-After and a JSON body, without the app.
    def test_allowed_requests_get_headers_and_the_fourth_gets_429(self):
        for i in range(SMALL):
            status, headers, body = self.request("alice")
            self.assertEqual((status, body), (200, b"hello"))
            self.assertEqual(headers["x-app"], "yes")
            self.assertRegex(headers["ratelimit"], r'^"small";r=%d;t=\d+$' % (SMALL - 1 - i))
            self.assertEqual(headers["ratelimit-policy"], '"small";q=%d;w=%d' % (SMALL, WINDOW_S))
            self.assertNotIn("retry-after", headers)
        status, headers, body = self.request("alice")
        self.assertEqual(status, 429)
        self.assertEqual(self.app_calls, SMALL)
        self.assertEqual(headers["content-type"], "application/json")
        denial = json.loads(body)
        self.assertEqual((denial["error"], denial["rule"]), ("rate_limited", "small"))
        self.assertGreater(denial["retry_after_ms"], 0)
        self.assertEqual(int(headers["retry-after"]), ceil_seconds(denial["retry_after_ms"]))
        self.assertRegex(headers["ratelimit"], r'^"small";r=0;t=\d+$')
        self.assertEqual(headers["ratelimit-policy"], '"small";q=%d;w=%d' % (SMALL, WINDOW_S))
        # Another key has its own limit; a request without one is not limited.
        self.assertEqual(self.request("bob")[0], 200)
        status, headers, _ = self.request()
        self.assertEqual(status, 200)
        self.assertNotIn("ratelimit", headers)


class WsgiTest(MiddlewareTests, unittest.TestCase):
    def serve(self, client, key=sluice.wsgi.header_key("X-Api-Key")):
        self.app_calls = 0

        def app(environ, start_response):
            self.app_calls += 1
            start_response("200 OK", [("Content-Type", "text/plain"), ("X-App", "yes")])
            return [b"hello"]

        class Server(socketserver.ThreadingMixIn, wsgiref.simple_server.WSGIServer):
            daemon_threads = True

        class QuietHandler(wsgiref.simple_server.WSGIRequestHandler):
            def log_message(self, *args):
                pass

        limited = sluice.wsgi.RateLimit(app, client, "small", key=key, window_s=WINDOW_S)
        server = wsgiref.simple_server.make_server("127.0.0.1", 0, limited, server_class=Server,
                                                   handler_class=QuietHandler)
        thread = threading.Thread(target=server.serve_forever)
        thread.start()
        self.addCleanup(server.server_close)
        self.addCleanup(thread.join)
        self.addCleanup(server.shutdown)
        self.port = server.server_address[1]

    def setUp(self):
        self.daemon = support.start_daemon(self)
        self.client = sluice.Client(self.daemon.socket)
        self.addCleanup(self.client.close)
        self.serve(self.client)

    # Verifies client_ip, the default key, limits each peer address.
    def test_the_default_key_is_the_client_ip(self):
        client = sluice.Client(self.daemon.socket)
        self.addCleanup(client.close)
        self.serve(client, key=sluice.wsgi.client_ip)
        self.assertEqual([self.request("k%d" % i)[0] for i in range(SMALL + 1)],
                         [200] * SMALL + [429])

    # Verifies fail_open lets requests through without headers when the
    # daemon is unreachable, and fail_closed answers 429 retrying in 1 s.
    def test_unreachable_daemon_answers_by_the_clients_policy(self):
        absent = os.path.join(self.daemon.dir, "absent.sock")
        for policy, status in (("fail_open", 200), ("fail_closed", 429)):
            client = sluice.Client(absent, on_unreachable=policy)
            self.addCleanup(client.close)
            self.serve(client)
            got, headers, _ = self.request("alice")
            self.assertEqual(got, status, policy)
            self.assertNotIn("ratelimit", headers)
            self.assertEqual(headers.get("retry-after"), "1" if status == 429 else None)
            self.assertEqual(client.unreachable_decisions, 1)


class AsgiTest(MiddlewareTests, unittest.TestCase):
    def setUp(self):
        import uvicorn  # python3-uvicorn (the Makefile's CLIENT_PACKAGES)
        self.daemon = support.start_daemon(self)
        self.app_calls = 0
        client = sluice.AsyncClient(self.daemon.socket)

        async def app(scope, receive, send):
            if scope["type"] == "lifespan":
                while True:
                    message = await receive()
                    if message["type"] == "lifespan.startup":
                        await send({"type": "lifespan.startup.complete"})
                    elif message["type"] == "lifespan.shutdown":
                        await client.close()
                        await send({"type": "lifespan.shutdown.complete"})
                        return
            self.app_calls += 1
            await send({"type": "http.response.start", "status": 200, "headers": [
                (b"content-type", b"text/plain"), (b"x-app", b"yes")]})
            await send({"type": "http.response.body", "body": b"hello"})

        limited = sluice.asgi.RateLimit(app, client, "small",
                                        key=sluice.asgi.header_key("X-Api-Key"),
                                        window_s=WINDOW_S)
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind(("127.0.0.1", 0))
        self.port = sock.getsockname()[1]
        server = uvicorn.Server(uvicorn.Config(limited, log_level="warning", lifespan="on"))
        thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]})
        thread.start()
        self.addCleanup(sock.close)
        self.addCleanup(thread.join)
        self.addCleanup(setattr, server, "should_exit", True)
        self.assertTrue(harness.wait_for(lambda: server.started or not thread.is_alive(), 10))
        self.assertTrue(server.started, "uvicorn did not start")


def tearDownModule():
    support.tear_down_module()


if __name__ == "__main__":
    unittest.main()
