// The HTTP/1.1 request parser (http_request.h): well-formed requests into
// their parts, every malformed case into its status, and the bounds; a
// request that trickles in is unfinished until its last byte and then the
// same request.
#include "http_request.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace sluice::http {
namespace {

const Limits kLimits{.max_request_bytes = 1024, .max_headers = 8};

struct Outcome {
  Parse parse;
  Request request;
  Refusal refusal;
};

Outcome parse(std::string_view input, const Limits& limits = kLimits) {
  Outcome outcome{};
  outcome.parse = parseRequest(input, limits, &outcome.request, &outcome.refusal);
  return outcome;
}

TEST(HttpRequest, RequestLineAndHeadersAreSplitIntoTheirParts) {
  const std::string input =
      "GET /v1/check?rule=api&key=k HTTP/1.1\r\nHost: x\r\nSluice-Cost:  3 \r\n\r\n";
  Outcome o = parse(input);
  ASSERT_EQ(o.parse, Parse::kRequest) << o.refusal.detail;
  EXPECT_EQ(o.request.method, "GET");
  EXPECT_EQ(o.request.target, "/v1/check?rule=api&key=k");
  EXPECT_EQ(o.request.path, "/v1/check");
  EXPECT_EQ(o.request.query, "rule=api&key=k");
  EXPECT_EQ(o.request.minor_version, 1);
  EXPECT_TRUE(o.request.keep_alive);
  EXPECT_EQ(o.request.consumed, input.size());
  EXPECT_EQ(o.request.header("sluice-cost"), "3");
  EXPECT_EQ(o.request.header("Sluice-Key"), std::nullopt);
}

TEST(HttpRequest, PipelinedRequestsAreTakenOneAtATime) {
  const std::string one = "GET /a HTTP/1.1\r\nHost: x\r\n\r\n";
  const std::string two = "POST /b HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc";
  Outcome first = parse(one + two);
  ASSERT_EQ(first.parse, Parse::kRequest);
  EXPECT_EQ(first.request.consumed, one.size());
  Outcome second = parse(two);
  ASSERT_EQ(second.parse, Parse::kRequest);
  EXPECT_EQ(second.request.body_bytes, 3u);
  EXPECT_EQ(second.request.consumed, two.size());
}

TEST(HttpRequest, EveryPrefixOfARequestIsUnfinished) {
  const std::string input =
      "\r\nPOST /v1/check?rule=a HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\n\r\nbody";
  for (size_t cut = 0; cut < input.size(); ++cut) {
    EXPECT_EQ(parse(input.substr(0, cut)).parse, Parse::kIncomplete) << cut;
  }
  Outcome whole = parse(input);
  ASSERT_EQ(whole.parse, Parse::kRequest);
  EXPECT_EQ(whole.request.consumed, input.size());
  // Once the head is whole, the size the request needs is known.
  EXPECT_EQ(parse(input.substr(0, input.size() - 2)).request.consumed, input.size());
}

TEST(HttpRequest, BareLineFeedsAndLeadingEmptyLinesAreAccepted) {
  Outcome o = parse("\r\n\nGET /x HTTP/1.1\nHost: x\n\n");
  ASSERT_EQ(o.parse, Parse::kRequest) << o.refusal.detail;
  EXPECT_EQ(o.request.path, "/x");
}

TEST(HttpRequest, ConnectionHeaderAndVersionDecideKeepAlive) {
  EXPECT_FALSE(parse("GET / HTTP/1.1\r\nHost: x\r\nConnection: Close\r\n\r\n").request.keep_alive);
  EXPECT_FALSE(parse("GET / HTTP/1.0\r\n\r\n").request.keep_alive);
  EXPECT_TRUE(parse("GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n").request.keep_alive);
  EXPECT_FALSE(
      parse("GET / HTTP/1.0\r\nConnection: keep-alive, close\r\n\r\n").request.keep_alive);
  EXPECT_TRUE(parse("GET / HTTP/1.1\r\nHost: x\r\nConnection: upgrade\r\n\r\n").request.keep_alive);
}

TEST(HttpRequest, AbsoluteFormTargetsCountTheirPath) {
  Outcome o = parse("GET http://sluice:9470/v1/check?rule=a HTTP/1.1\r\nHost: x\r\n\r\n");
  ASSERT_EQ(o.parse, Parse::kRequest) << o.refusal.detail;
  EXPECT_EQ(o.request.path, "/v1/check");
  EXPECT_EQ(o.request.query, "rule=a");
  Outcome bare = parse("GET http://sluice?rule=a HTTP/1.1\r\nHost: x\r\n\r\n");
  ASSERT_EQ(bare.parse, Parse::kRequest);
  EXPECT_EQ(bare.request.path, "/");
}

struct Malformed {
  const char* why;
  std::string input;
  unsigned status;
};

TEST(HttpRequest, EveryMalformedRequestIsRefusedWithItsStatus) {
  const std::vector<Malformed> cases = {
      {"no version", "GET /\r\n\r\n", 400},
      {"two spaces", "GET  / HTTP/1.1\r\nHost: x\r\n\r\n", 400},
      {"a trailing space", "GET / HTTP/1.1 \r\nHost: x\r\n\r\n", 400},
      {"a method that is no token", "G(T / HTTP/1.1\r\nHost: x\r\n\r\n", 400},
      {"an empty method", " / HTTP/1.1\r\nHost: x\r\n\r\n", 400},
      {"a target that is no path", "GET v1/check HTTP/1.1\r\nHost: x\r\n\r\n", 400},
      {"an asterisk target", "OPTIONS * HTTP/1.1\r\nHost: x\r\n\r\n", 400},
      {"a control byte in the target", "GET /a\x01 HTTP/1.1\r\nHost: x\r\n\r\n", 400},
      {"a byte above ASCII in the target", "GET /\xc3\xa9 HTTP/1.1\r\nHost: x\r\n\r\n", 400},
      {"a lower-case version", "GET / http/1.1\r\nHost: x\r\n\r\n", 400},
      {"a version that is no number", "GET / HTTP/1.x\r\nHost: x\r\n\r\n", 400},
      {"HTTP/2.0", "GET / HTTP/2.0\r\nHost: x\r\n\r\n", 505},
      {"HTTP/1.2", "GET / HTTP/1.2\r\nHost: x\r\n\r\n", 505},
      {"HTTP/0.9", "GET / HTTP/0.9\r\n\r\n", 505},
      {"a bare CR in the request line", "GET /\r HTTP/1.1\r\nHost: x\r\n\r\n", 400},
      {"a bare CR before it", "\rGET / HTTP/1.1\r\nHost: x\r\n\r\n", 400},
      {"a bare CR in a header", "GET / HTTP/1.1\r\nHost: x\rY\r\n\r\n", 400},
      {"no Host in HTTP/1.1", "GET / HTTP/1.1\r\n\r\n", 400},
      {"two Hosts", "GET / HTTP/1.1\r\nHost: x\r\nHost: y\r\n\r\n", 400},
      {"a header without a colon", "GET / HTTP/1.1\r\nHost: x\r\nJunk\r\n\r\n", 400},
      {"a blank before the colon", "GET / HTTP/1.1\r\nHost : x\r\n\r\n", 400},
      {"an empty header name", "GET / HTTP/1.1\r\nHost: x\r\n: v\r\n\r\n", 400},
      {"a folded header", "GET / HTTP/1.1\r\nHost: x\r\nA: b\r\n c\r\n\r\n", 400},
      {"a NUL in a value", std::string("GET / HTTP/1.1\r\nHost: x\r\nA: b") + '\0' + "c\r\n\r\n", 400},
      {"DEL in a value", "GET / HTTP/1.1\r\nHost: x\r\nA: b\x7f\r\n\r\n", 400},
      {"a Content-Length that is no number", "GET / HTTP/1.1\r\nHost: x\r\nContent-Length: 1x\r\n\r\n", 400},
      {"a negative Content-Length", "GET / HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n", 400},
      {"an empty Content-Length", "GET / HTTP/1.1\r\nHost: x\r\nContent-Length:\r\n\r\n", 400},
      {"a list as Content-Length", "GET / HTTP/1.1\r\nHost: x\r\nContent-Length: 1, 1\r\n\r\n", 400},
      {"a huge Content-Length", "GET / HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999999999999999\r\n\r\n", 400},
      {"two Content-Lengths that disagree",
       "GET / HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab", 400},
      {"a chunked body", "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n", 411},
      {"chunked beside a length",
       "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n", 411},
      {"a body past the bound", "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n", 413},
      {"a request line past the bound", "GET /" + std::string(1100, 'a') + " HTTP/1.1\r\n\r\n", 414},
      {"an endless request line", "GET /" + std::string(1100, 'a'), 414},
      {"a head past the bound",
       "GET / HTTP/1.1\r\nHost: x\r\nA: " + std::string(1100, 'a') + "\r\n\r\n", 431},
      {"an endless header", "GET / HTTP/1.1\r\nHost: x\r\nA: " + std::string(1100, 'a'), 431},
      {"too many headers", "GET / HTTP/1.1\r\nHost: x\r\nA: 1\r\nA: 2\r\nA: 3\r\nA: 4\r\nA: 5\r\n"
                           "A: 6\r\nA: 7\r\nA: 8\r\n\r\n", 431},
      {"endless empty lines", std::string(1100, '\n'), 414},
  };
  for (const Malformed& c : cases) {
    Outcome o = parse(c.input);
    EXPECT_EQ(o.parse, Parse::kError) << c.why;
    EXPECT_EQ(o.refusal.status, c.status) << c.why << ": " << o.refusal.detail;
    EXPECT_FALSE(o.refusal.detail.empty()) << c.why;
  }
}

TEST(HttpRequest, ABodyExactlyAtTheBoundIsRead) {
  const std::string head = "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: ";
  // The body that, with its length's digits in the head, fills the bound.
  size_t body = 0;
  for (size_t digits = 1; digits < 5; ++digits) {
    body = kLimits.max_request_bytes - (head.size() + digits + 4);
    if (std::to_string(body).size() == digits) break;
  }
  const std::string input = head + std::to_string(body) + "\r\n\r\n" + std::string(body, 'b');
  ASSERT_EQ(input.size(), kLimits.max_request_bytes);
  Outcome o = parse(input);
  EXPECT_EQ(o.parse, Parse::kRequest) << o.refusal.detail;
  EXPECT_EQ(parse(head + std::to_string(body + 1) + "\r\n\r\n").refusal.status, 413u);
}

TEST(HttpRequest, HeadEndResumesWhereItStopped) {
  const std::string input = "\r\nGET / HTTP/1.1\r\nHost: x\r\n\r\nnext";
  size_t scanned = 0;
  for (size_t cut = 0; cut < input.size() - 4; ++cut) {
    EXPECT_EQ(headEnd(std::string_view(input).substr(0, cut), &scanned), 0u) << cut;
  }
  EXPECT_EQ(headEnd(input, &scanned), input.size() - 4);
  size_t fresh = 0;
  EXPECT_EQ(headEnd("GET / HTTP/1.0\n\n", &fresh), 16u);
}

TEST(HttpRequest, QueryValuesAreTheFirstOfTheirNameComparedDecoded) {
  EXPECT_EQ(queryValue("rule=a&key=b&rule=c", "rule"), "a");
  EXPECT_EQ(queryValue("RULE=a", "rule"), "a");
  EXPECT_EQ(queryValue("%72ule=a", "rule"), "a");
  EXPECT_EQ(queryValue("rules=a&rule=", "rule"), "");
  EXPECT_EQ(queryValue("rule&key=b", "rule"), std::nullopt);
  EXPECT_EQ(queryValue("", "rule"), std::nullopt);
  EXPECT_EQ(queryValue("x=1&&key=2", "key"), "2");
}

TEST(HttpRequest, PercentDecodingTakesWellFormedEscapesOnly) {
  auto decode = [](std::string_view raw, bool plus) {
    std::string out(raw.size(), '\0');
    out.resize(percentDecode(raw, plus, out.data()));
    return out;
  };
  EXPECT_EQ(decode("a%20b+c", true), "a b c");
  EXPECT_EQ(decode("a%20b+c", false), "a b+c");
  EXPECT_EQ(decode("%zz%4", true), "%zz%4");
  EXPECT_EQ(decode("%00%ff", true), std::string("\0\xff", 2));
}

}  // namespace
}  // namespace sluice::http
