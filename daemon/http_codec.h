// http_codec: the HTTP check endpoint's words, pure functions with no
// sockets, so every status, header and body is unit-tested on its own;
// HttpCodec (http_front.h) speaks them on a connection, and
// http_request.h parses the requests.
//
// In: a request's path and method, and `rule`, `key`, `cost` from the query
// string or the headers Sluice-Rule, Sluice-Key, Sluice-Cost (the query
// wins), into a Question of one item: /v1/check is an acquire, /v1/peek a
// peek (spends nothing), /v1/reserve a reserve of `estimate` (and
// `ttl_ms`), /v1/settle a settle of reservation `id` at `actual` (a cancel
// when actual is 0). A reserve's reply carries the id (body and the
// Sluice-Reservation header); a settle's says what was refunded and
// charged as debt, and is 200 whatever the key's state.
//
// Out: an Answer, and the rule it named, into a Reply:
//   - allowed: 200, denied: the configured deny status (429 by default);
//     both carry RateLimit and RateLimit-Policy as in
//     draft-ietf-httpapi-ratelimit-headers-11 (the same values libsluice's
//     sluice_format_headers writes), a denial also Retry-After (whole
//     seconds, rounded up, at least 1) and an RFC 9457 problem body;
//   - a bad parameter 400, an unknown rule or path 404, a method other
//     than GET or POST 405, each with a problem body naming what is wrong;
//     only the daemon's own trouble (overloaded, stopping, a bug) is 5xx,
//     and its 503 (OVERLOADED: a full table, or a rule a reload removed
//     while the request waited) carries Retry-After: 1;
//   - a request the parser refuses (http_request.h) gets its status with a
//     problem body too, written by writeResponse like every answer.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "question.h"
#include "rules.h"

namespace sluice::http {

inline constexpr std::string_view kCheckPath = "/v1/check";
inline constexpr std::string_view kPeekPath = "/v1/peek";
// Reservations (docs/http.md): reserve takes rule, key, estimate and an
// optional ttl_ms; settle takes id and actual (actual 0 cancels).
inline constexpr std::string_view kReservePath = "/v1/reserve";
inline constexpr std::string_view kSettlePath = "/v1/settle";

// A request's parameters as it carried them: from the query string and
// from the Sluice-* headers; nullopt when absent.
//
// For proxies that cannot set a header from a variable (Traefik
// ForwardAuth, Envoy ext_authz), `key_header=NAME` in the query takes the
// key from the request's header NAME (the caller looks it up into
// named_header); from X-Forwarded-For, its last address, the one the
// proxy itself saw (the ones before it are the client's to write). The
// key's order: key_header, then `key` in the query, then Sluice-Key: a
// proxy that appends the client's path to its own query (Envoy's
// path_prefix) writes key_header first, and the client cannot override
// it. Of a parameter given twice in the query, the first counts.
struct Parameters {
  std::optional<std::string_view> query_rule, query_key, query_cost, query_key_header;
  std::optional<std::string_view> header_rule, header_key, header_cost;
  std::optional<std::string_view> named_header;  // the header key_header names
  // reserve and settle, from the query only.
  std::optional<std::string_view> query_estimate, query_ttl_ms, query_id, query_actual;
};

// The last address of an X-Forwarded-For value, blanks trimmed.
std::string_view lastForwarded(std::string_view value);

// One response: status, headers in order, body and its content type.
struct Reply {
  unsigned status = 200;
  std::vector<std::pair<std::string, std::string>> headers;
  std::string content_type;
  std::string body;

  // The value of header `name` (exact case), or nullptr (tests).
  const std::string* header(std::string_view name) const;
};

// A parsed check: its Question's one item and method, or the Reply that
// refuses it.
struct Parsed {
  bool ok = false;
  Method method = Method::kAcquire;
  Item item;
  Reply refusal;  // when !ok
};

// Parses a request of `http_method` on `path`. The views in the result
// point into `parameters`' views. A key longer than max_key_bytes is a 400.
Parsed parseCheck(std::string_view path, std::string_view http_method,
                  const Parameters& parameters, size_t max_key_bytes);

// The reply to `answer` on `rule` (the rule the request named; null when
// it is unknown: the answer is an error, or a decision made before a
// reload removed the rule, answered as made with a RateLimit-Policy of the
// decision's limit alone).
Reply encodeAnswer(const Answer& answer, const Rule* rule, std::string_view rule_name,
                   unsigned deny_status);

// An RFC 9457 problem reply: application/problem+json with type
// "about:blank", title (the status's phrase), status and detail.
Reply problem(unsigned status, std::string_view detail);

// The RateLimit and RateLimit-Policy values of a decision on `rule`:
// `"rule";r=REMAINING;t=RESET_S` and `"rule";q=LIMIT;w=WINDOW_S`
// (`qu="concurrent-requests"` and no window for a concurrency rule). A rule
// of several limits gets one policy item per limit, named "rule/0",
// "rule/1", ..., and RateLimit names the one the decision reports.
std::pair<std::string, std::string> rateLimitHeaders(const Rule& rule, const Decision& decision);

// Appends `reply` to `out` as an HTTP/1.1 response, its header lines in
// the order libmicrohttpd wrote them: the status line, `Date: DATE` unless
// `date` is empty, `Connection: CONNECTION` unless `connection` is empty
// ("close", or "Keep-Alive" to an HTTP/1.0 client that asked for it),
// Content-Type, the reply's headers, Content-Length; then the body, unless
// `with_body` is false (the answer to a HEAD).
void writeResponse(std::string* out, const Reply& reply, std::string_view connection,
                   std::string_view date, bool with_body);

// The IMF-fixdate (RFC 9110 section 5.6.7) of `unix_s` seconds since the
// epoch: "Sun, 06 Nov 1994 08:49:37 GMT".
std::string imfDate(int64_t unix_s);

// A JSON string literal of `text`, quoted and escaped.
std::string jsonString(std::string_view text);

}  // namespace sluice::http
