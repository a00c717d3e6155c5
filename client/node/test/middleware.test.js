// rateLimit in real node:http servers, Connect-style (req, res, next) and
// bare: allowed requests get 200 with RateLimit headers, denied ones 429
// with Retry-After and a JSON body; the unreachable policy decides when the
// daemon is gone; the daemon's errors go to next(error).

import assert from "node:assert/strict";
import http from "node:http";
import { once } from "node:events";
import path from "node:path";
import { after, before, describe, it } from "node:test";
import express from "express";

import { Client, rateLimit } from "../index.js";
import { Daemon } from "./daemon.js";

const RULES = `
[[rule]]
name = "pages"
algorithm = "fixed_window"
limit = 2
period = "1m"
`;

// A server whose every request goes through `handler`.
async function serve(handler) {
  const server = http.createServer(handler);
  server.listen(0, "127.0.0.1");
  await once(server, "listening");
  return server;
}

async function get(server, apiKey) {
  const headers = apiKey === undefined ? {} : { "x-api-key": apiKey };
  const response = await fetch(`http://127.0.0.1:${server.address().port}/`, { headers });
  return { status: response.status, headers: response.headers, body: await response.text() };
}

function close(server) {
  server.closeAllConnections();
  server.close();
}

// A Connect-style app of one middleware: next() answers 200, next(error) 500.
function connectApp(middleware) {
  return (req, res) => middleware(req, res, (error) => {
    res.statusCode = error ? 500 : 200;
    res.end(error ? `error ${error.code}` : "ok");
  });
}

// Express (a devDependency) with the middleware in app.use.
function expressApp(middleware) {
  const app = express();
  app.use(middleware);
  app.get("/", (req, res) => res.send("ok"));
  return app;
}

// The bare node:http way: the returned promise says whether to go on.
function bareApp(limit) {
  return async (req, res) => {
    if (await limit(req, res)) {
      res.end("ok");
    }
  };
}

const byApiKey = (req) => req.headers["x-api-key"] ?? null;

describe("rateLimit", () => {
  let daemon;
  let client;
  before(async () => {
    daemon = new Daemon(RULES);
    await daemon.start();
    client = new Client({ socketPath: daemon.socket });
  });
  after(async () => {
    client?.close();
    await daemon?.stop();
  });

  for (const [style, app] of [["Connect-style", connectApp], ["Express", expressApp], ["bare http", bareApp]]) {
    it(`${style}: answers 200 with the headers, then 429 with Retry-After and a JSON body`, async () => {
      const server = await serve(app(rateLimit({ client, rule: "pages", key: byApiKey, windowS: 60 })));
      try {
        const alice = `alice-${style}`;
        const first = await get(server, alice);
        assert.deepEqual([first.status, first.body], [200, "ok"]);
        assert.match(first.headers.get("ratelimit"), /^"pages";r=1;t=([1-9]|[1-5]\d|60)$/);
        assert.equal(first.headers.get("ratelimit-policy"), '"pages";q=2;w=60');
        assert.equal(first.headers.get("retry-after"), null);

        assert.equal((await get(server, alice)).status, 200);
        const denied = await get(server, alice);
        assert.equal(denied.status, 429);
        assert.match(denied.headers.get("ratelimit"), /^"pages";r=0;t=\d+$/);
        assert.equal(denied.headers.get("ratelimit-policy"), '"pages";q=2;w=60');
        const retryAfterS = Number(denied.headers.get("retry-after"));
        assert.ok(retryAfterS >= 1 && retryAfterS <= 60, String(retryAfterS));
        assert.equal(denied.headers.get("content-type"), "application/json");
        assert.deepEqual(JSON.parse(denied.body),
          { error: "too many requests", rule: "pages", retry_after_s: retryAfterS });

        const bob = await get(server, `bob-${style}`);
        assert.equal(bob.status, 200);
        assert.match(bob.headers.get("ratelimit"), /^"pages";r=1;t=\d+$/);
        // No key: not limited, no headers.
        const anonymous = await get(server);
        assert.deepEqual([anonymous.status, anonymous.headers.get("ratelimit")], [200, null]);
      } finally {
        close(server);
      }
    });
  }

  it("passes the daemon's errors to next(error)", async () => {
    const server = await serve(connectApp(rateLimit({ client, rule: "no-such-rule", key: byApiKey })));
    try {
      const response = await get(server, "carol");
      assert.deepEqual([response.status, response.body], [500, "error UNKNOWN_RULE"]);
    } finally {
      close(server);
    }
  });

  it("Express: the daemon's errors reach Express's error handling", async () => {
    const app = expressApp(rateLimit({ client, rule: "no-such-rule", key: byApiKey }));
    app.use((error, req, res, next) => res.status(503).send(`error ${error.code}`));
    const server = await serve(app);
    try {
      const response = await get(server, "carol");
      assert.deepEqual([response.status, response.body], [503, "error UNKNOWN_RULE"]);
    } finally {
      close(server);
    }
  });

  it("lets requests through without headers when the daemon is unreachable (fail_open)", async () => {
    const gone = new Client({ socketPath: path.join(daemon.dir, "missing.sock") });
    const server = await serve(connectApp(rateLimit({ client: gone, rule: "pages", key: byApiKey })));
    try {
      const response = await get(server, "dave");
      assert.deepEqual([response.status, response.headers.get("ratelimit")], [200, null]);
      assert.equal(gone.counters.failedOpen, 1);
    } finally {
      close(server);
      gone.close();
    }
  });

  it("answers 429 with Retry-After: 1 when the daemon is unreachable and the policy is fail_closed", async () => {
    const gone = new Client({ socketPath: path.join(daemon.dir, "missing.sock"), onUnreachable: "fail_closed" });
    const server = await serve(bareApp(rateLimit({ client: gone, rule: "pages", key: byApiKey })));
    try {
      const response = await get(server, "erin");
      assert.deepEqual([response.status, response.headers.get("retry-after"), response.headers.get("ratelimit")],
        [429, "1", null]);
      assert.deepEqual(JSON.parse(response.body), { error: "too many requests", rule: "pages", retry_after_s: 1 });
      assert.equal(gone.counters.failedClosed, 1);
    } finally {
      close(server);
      gone.close();
    }
  });

  it("refuses options it cannot work with when it is made", () => {
    assert.throws(() => rateLimit({ rule: "pages" }), { code: "EINVAL" });
    assert.throws(() => rateLimit({ client: null, rule: "pages" }), { code: "EINVAL" });
    assert.throws(() => rateLimit({ client, rule: "" }), { code: "EINVAL" });
    assert.throws(() => rateLimit({ client, rule: "pages\n" }), { code: "EINVAL" });
    assert.throws(() => rateLimit({ client, rule: "pages", key: "x-api-key" }), { code: "EINVAL" });
  });
});
