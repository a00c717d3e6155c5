// The HTTP check endpoint's codec (http_codec.h): requests into questions,
// answers into statuses, headers and problem bodies, without sockets.
#include "http_codec.h"

#include <gtest/gtest.h>

#include <string>

namespace sluice::http {
namespace {

constexpr size_t kMaxKeyBytes = 64;

Rule rateRule(std::string name, int64_t limit, int64_t period_s) {
  Rule rule;
  rule.name = std::move(name);
  rule.algorithm = Algorithm::kTokenBucket;
  rule.limits = {Limit{.limit = limit, .period_ns = period_s * 1'000'000'000, .burst = limit}};
  return rule;
}

Answer decided(bool allowed, int64_t remaining, int64_t limit, int64_t reset_ms,
               int64_t retry_ms, Mode mode = Mode::kNormal) {
  Answer answer;
  Decision decision;
  decision.allowed = allowed;
  decision.remaining = remaining;
  decision.limit = limit;
  decision.reset_after_ms = reset_ms;
  decision.retry_after_ms = retry_ms;
  answer.decide(decision, mode);
  return answer;
}

Parameters query(std::string_view rule, std::string_view key) {
  Parameters parameters;
  parameters.query_rule = rule;
  parameters.query_key = key;
  return parameters;
}

// --- requests ---------------------------------------------------------------------

TEST(HttpCodecTest, CheckIsAnAcquireOfOneUnitByDefault) {
  Parsed parsed = parseCheck("/v1/check", "GET", query("api", "k1"), kMaxKeyBytes);
  ASSERT_TRUE(parsed.ok);
  EXPECT_EQ(parsed.method, Method::kAcquire);
  EXPECT_EQ(parsed.item.rule, "api");
  EXPECT_EQ(parsed.item.key, "k1");
  EXPECT_EQ(parsed.item.cost, 1);
}

TEST(HttpCodecTest, PeekSpendsNothingUnlessACostIsGiven) {
  Parsed parsed = parseCheck("/v1/peek", "POST", query("api", "k1"), kMaxKeyBytes);
  ASSERT_TRUE(parsed.ok);
  EXPECT_EQ(parsed.method, Method::kPeek);
  EXPECT_EQ(parsed.item.cost, 0);
}

TEST(HttpCodecTest, HeadersCarryTheParametersWhenTheQueryDoesNot) {
  Parameters parameters;
  parameters.header_rule = "api";
  parameters.header_key = "10.0.0.1";
  parameters.header_cost = "5";
  Parsed parsed = parseCheck("/v1/check", "GET", parameters, kMaxKeyBytes);
  ASSERT_TRUE(parsed.ok);
  EXPECT_EQ(parsed.item.rule, "api");
  EXPECT_EQ(parsed.item.key, "10.0.0.1");
  EXPECT_EQ(parsed.item.cost, 5);
}

TEST(HttpCodecTest, TheQueryWinsOverTheHeaders) {
  Parameters parameters = query("from-query", "qk");
  parameters.query_cost = "2";
  parameters.header_rule = "from-header";
  parameters.header_key = "hk";
  parameters.header_cost = "9";
  Parsed parsed = parseCheck("/v1/check", "GET", parameters, kMaxKeyBytes);
  ASSERT_TRUE(parsed.ok);
  EXPECT_EQ(parsed.item.rule, "from-query");
  EXPECT_EQ(parsed.item.key, "qk");
  EXPECT_EQ(parsed.item.cost, 2);
}

TEST(HttpCodecTest, KeyHeaderTakesTheKeyFromTheHeaderItNamesOverAnyOther) {
  Parameters parameters;
  parameters.query_rule = "api";
  parameters.query_key_header = "X-Api-Key";
  parameters.named_header = "k-123";
  parameters.query_key = "the-clients-own";
  parameters.header_key = "ignored";
  Parsed parsed = parseCheck("/v1/check", "GET", parameters, kMaxKeyBytes);
  ASSERT_TRUE(parsed.ok);
  EXPECT_EQ(parsed.item.key, "k-123");
}

TEST(HttpCodecTest, FromXForwardedForTheKeyIsTheAddressTheProxySaw) {
  Parameters parameters;
  parameters.query_rule = "api";
  parameters.query_key_header = "x-forwarded-for";
  parameters.named_header = "6.6.6.6, 10.0.0.7 ";  // the first is the client's to write
  Parsed parsed = parseCheck("/v1/check", "GET", parameters, kMaxKeyBytes);
  ASSERT_TRUE(parsed.ok);
  EXPECT_EQ(parsed.item.key, "10.0.0.7");
}

TEST(HttpCodecTest, AKeyHeaderTheRequestLacksIsA400NamingIt) {
  Parameters parameters;
  parameters.query_rule = "api";
  parameters.query_key_header = "X-Api-Key";
  Parsed parsed = parseCheck("/v1/check", "GET", parameters, kMaxKeyBytes);
  ASSERT_FALSE(parsed.ok);
  EXPECT_EQ(parsed.refusal.status, 400u);
  EXPECT_NE(parsed.refusal.body.find("X-Api-Key"), std::string::npos);
}

TEST(HttpCodecTest, AMissingParameterIsA400NamingIt) {
  Parameters no_rule;
  no_rule.query_key = "k";
  Parsed parsed = parseCheck("/v1/check", "GET", no_rule, kMaxKeyBytes);
  ASSERT_FALSE(parsed.ok);
  EXPECT_EQ(parsed.refusal.status, 400u);
  EXPECT_EQ(parsed.refusal.content_type, "application/problem+json");
  EXPECT_NE(parsed.refusal.body.find("parameter rule is missing"), std::string::npos);

  Parameters empty_key = query("api", "");
  parsed = parseCheck("/v1/check", "GET", empty_key, kMaxKeyBytes);
  ASSERT_FALSE(parsed.ok);
  EXPECT_NE(parsed.refusal.body.find("parameter key is missing"), std::string::npos);
}

TEST(HttpCodecTest, ABadCostIsA400NamingTheCost) {
  for (std::string_view cost : {"-1", "1.5", "abc", "", "1000000001", "99999999999999999999"}) {
    Parameters parameters = query("api", "k");
    parameters.query_cost = cost;
    Parsed parsed = parseCheck("/v1/check", "GET", parameters, kMaxKeyBytes);
    ASSERT_FALSE(parsed.ok) << cost;
    EXPECT_EQ(parsed.refusal.status, 400u);
    EXPECT_NE(parsed.refusal.body.find("parameter cost"), std::string::npos) << cost;
  }
}

TEST(HttpCodecTest, AKeyOverTheLimitIsA400) {
  std::string key(kMaxKeyBytes + 1, 'k');
  Parsed parsed = parseCheck("/v1/check", "GET", query("api", key), kMaxKeyBytes);
  ASSERT_FALSE(parsed.ok);
  EXPECT_EQ(parsed.refusal.status, 400u);
  EXPECT_NE(parsed.refusal.body.find("max_key_bytes"), std::string::npos);
}

TEST(HttpCodecTest, AnotherPathIs404AndAnotherMethod405) {
  Parsed parsed = parseCheck("/v1/other", "GET", query("api", "k"), kMaxKeyBytes);
  ASSERT_FALSE(parsed.ok);
  EXPECT_EQ(parsed.refusal.status, 404u);
  parsed = parseCheck("/v1/check", "DELETE", query("api", "k"), kMaxKeyBytes);
  ASSERT_FALSE(parsed.ok);
  EXPECT_EQ(parsed.refusal.status, 405u);
  ASSERT_NE(parsed.refusal.header("Allow"), nullptr);
  EXPECT_EQ(*parsed.refusal.header("Allow"), "GET, POST");
}

// --- answers ----------------------------------------------------------------------

TEST(HttpCodecTest, AnAllowedCheckIs200WithTheRateLimitHeaders) {
  Rule rule = rateRule("api", 100, 60);
  Reply reply = encodeAnswer(decided(true, 42, 100, 1500, 0), &rule, "api", 429);
  EXPECT_EQ(reply.status, 200u);
  ASSERT_NE(reply.header("RateLimit"), nullptr);
  EXPECT_EQ(*reply.header("RateLimit"), "\"api\";r=42;t=2");
  EXPECT_EQ(*reply.header("RateLimit-Policy"), "\"api\";q=100;w=60");
  EXPECT_EQ(*reply.header("Sluice-Mode"), "normal");
  EXPECT_EQ(reply.header("Retry-After"), nullptr);
  EXPECT_NE(reply.body.find("\"allowed\":true"), std::string::npos);
}

TEST(HttpCodecTest, ADenialCarriesTheDenyStatusRetryAfterAndAProblemBody) {
  Rule rule = rateRule("api", 100, 60);
  Reply reply = encodeAnswer(decided(false, 0, 100, 60000, 1001), &rule, "api", 403);
  EXPECT_EQ(reply.status, 403u);
  EXPECT_EQ(reply.content_type, "application/problem+json");
  ASSERT_NE(reply.header("Retry-After"), nullptr);
  EXPECT_EQ(*reply.header("Retry-After"), "2");  // 1001 ms rounded up
  EXPECT_EQ(*reply.header("RateLimit"), "\"api\";r=0;t=60");
  EXPECT_NE(reply.body.find("\"type\":\"about:blank\""), std::string::npos);
  EXPECT_NE(reply.body.find("\"status\":403"), std::string::npos);
  EXPECT_NE(reply.body.find("\"retry_after_ms\":1001"), std::string::npos);
}

TEST(HttpCodecTest, ADenialNeverSaysRetryAfterZero) {
  Rule rule = rateRule("api", 10, 1);
  Reply reply = encodeAnswer(decided(false, 0, 10, 100, 0), &rule, "api", 429);
  EXPECT_EQ(reply.status, 429u);
  EXPECT_EQ(*reply.header("Retry-After"), "1");
}

TEST(HttpCodecTest, AConcurrencyRuleIsAPolicyOfConcurrentRequests) {
  Rule rule = rateRule("uploads", 8, 30);
  rule.algorithm = Algorithm::kConcurrency;
  Reply reply = encodeAnswer(decided(true, 7, 8, 0, 0), &rule, "uploads", 429);
  EXPECT_EQ(*reply.header("RateLimit-Policy"), "\"uploads\";q=8;qu=\"concurrent-requests\"");
}

TEST(HttpCodecTest, SeveralLimitsAreOnePolicyItemEachAndRateLimitNamesTheReportedOne) {
  Rule rule = rateRule("api", 100, 1);
  rule.limits.push_back(Limit{.limit = 5000, .period_ns = 3600'000'000'000, .burst = 5000});
  Reply reply = encodeAnswer(decided(false, 0, 5000, 3600000, 120000), &rule, "api", 429);
  EXPECT_EQ(*reply.header("RateLimit-Policy"), "\"api/0\";q=100;w=1, \"api/1\";q=5000;w=3600");
  EXPECT_EQ(*reply.header("RateLimit"), "\"api/1\";r=0;t=3600");
  EXPECT_EQ(*reply.header("Retry-After"), "120");
}

TEST(HttpCodecTest, HeadersMatchLibsluicesFormatHeaders) {
  // sluice_format_headers(remaining 7, limit 10, reset 2500 ms, window 10 s)
  // writes "rl";r=7;t=3 and "rl";q=10;w=10 (client/src/headers.c).
  Rule rule = rateRule("rl", 10, 10);
  auto [ratelimit, policy] = rateLimitHeaders(rule, decided(true, 7, 10, 2500, 0).decisions[0]);
  EXPECT_EQ(ratelimit, "\"rl\";r=7;t=3");
  EXPECT_EQ(policy, "\"rl\";q=10;w=10");
}

TEST(HttpCodecTest, ErrorsMapToClientStatusesAndOnlyTheDaemonsTroubleTo5xx) {
  struct Case {
    ErrorCode code;
    unsigned status;
  };
  for (Case c : {Case{ErrorCode::kBadRequest, 400}, Case{ErrorCode::kTooLarge, 400},
                 Case{ErrorCode::kUnknownRule, 404}, Case{ErrorCode::kForbidden, 403},
                 Case{ErrorCode::kOverloaded, 503}, Case{ErrorCode::kInternal, 500}}) {
    Answer answer;
    answer.fail(c.code, "the \"reason\"");
    Reply reply = encodeAnswer(answer, nullptr, "api", 429);
    EXPECT_EQ(reply.status, c.status);
    // The daemon's passing trouble says when to come back.
    const std::string* retry = reply.header("Retry-After");
    EXPECT_EQ(retry != nullptr && *retry == "1", c.status == 503);
    EXPECT_EQ(reply.content_type, "application/problem+json");
    EXPECT_NE(reply.body.find("\"detail\":\"the \\\"reason\\\"\""), std::string::npos)
        << reply.body;
  }
}

TEST(HttpCodecTest, JsonStringsEscapeQuotesControlsAndBytesBeyondAscii) {
  EXPECT_EQ(jsonString("a\"b\\c\n"), "\"a\\\"b\\\\c\\n\"");
  EXPECT_EQ(jsonString(std::string_view("\x01\xff", 2)), "\"\\u0001\\u00ff\"");
}

// --- reservations -------------------------------------------------------------------

TEST(HttpCodecTest, ReserveTakesAnEstimateAndATtl) {
  Parameters parameters = query("llm", "tenant");
  parameters.query_estimate = "4096";
  parameters.query_ttl_ms = "120000";
  Parsed parsed = parseCheck("/v1/reserve", "POST", parameters, kMaxKeyBytes);
  ASSERT_TRUE(parsed.ok);
  EXPECT_EQ(parsed.method, Method::kReserve);
  EXPECT_EQ(parsed.item.cost, 4096);
  EXPECT_EQ(parsed.item.ttl_ms, 120000);
  parameters.query_estimate = "0";
  Parsed refused = parseCheck("/v1/reserve", "POST", parameters, kMaxKeyBytes);
  EXPECT_FALSE(refused.ok);
  EXPECT_EQ(refused.refusal.status, 400u);
  EXPECT_NE(refused.refusal.body.find("estimate"), std::string::npos);
}

TEST(HttpCodecTest, SettleTakesAnIdAndTheActualAndZeroCancels) {
  Parameters parameters;
  parameters.query_id = "281474976710659";
  parameters.query_actual = "1200";
  Parsed parsed = parseCheck("/v1/settle", "POST", parameters, kMaxKeyBytes);
  ASSERT_TRUE(parsed.ok);
  EXPECT_EQ(parsed.method, Method::kSettle);
  EXPECT_EQ(parsed.item.reservation, 281474976710659u);
  EXPECT_EQ(parsed.item.cost, 1200);
  parameters.query_actual = "0";
  EXPECT_EQ(parseCheck("/v1/settle", "POST", parameters, kMaxKeyBytes).method, Method::kCancel);
  parameters.query_id = "-4";
  EXPECT_EQ(parseCheck("/v1/settle", "POST", parameters, kMaxKeyBytes).refusal.status, 400u);
}

TEST(HttpCodecTest, AReserveCarriesItsIdAndASettleWhatItSettledAndLeftUnpaid) {
  Rule rule = rateRule("llm", 100000, 3600);
  Answer reserved = decided(true, 95904, 100000, 1000, 0, Mode::kLocal);
  reserved.method = Method::kReserve;
  reserved.reservation = 17;
  Reply reply = encodeAnswer(reserved, &rule, "llm", 429);
  EXPECT_EQ(reply.status, 200u);
  ASSERT_NE(reply.header("Sluice-Reservation"), nullptr);
  EXPECT_EQ(*reply.header("Sluice-Reservation"), "17");
  EXPECT_NE(reply.body.find("\"id\":17"), std::string::npos);

  Answer settled = decided(false, -500, 100000, 1000, 0, Mode::kLocal);
  settled.method = Method::kSettle;
  settled.reservation = 17;
  settled.debt = 500;
  settled.unpaid = 250;
  Reply settled_reply = encodeAnswer(settled, nullptr, "", 429);
  EXPECT_EQ(settled_reply.status, 200u);
  EXPECT_EQ(settled_reply.body,
            "{\"id\":17,\"refunded\":0,\"debt\":500,\"unpaid\":250,\"allowed\":false,"
            "\"remaining\":-500,"
            "\"limit\":100000,\"reset_after_ms\":1000,\"mode\":\"local\"}");
}

TEST(HttpCodecTest, AResponseIsWrittenInLibmicrohttpdsOrder) {
  Reply reply = problem(404, "no");
  reply.headers.emplace_back("Allow", "GET, POST");
  std::string out;
  writeResponse(&out, reply, "close", "Sun, 06 Nov 1994 08:49:37 GMT", true);
  EXPECT_EQ(out,
            "HTTP/1.1 404 Not Found\r\nDate: Sun, 06 Nov 1994 08:49:37 GMT\r\n"
            "Connection: close\r\nContent-Type: application/problem+json\r\n"
            "Allow: GET, POST\r\nContent-Length: " +
                std::to_string(reply.body.size()) + "\r\n\r\n" + reply.body);
  std::string head;
  writeResponse(&head, reply, "", "", false);
  EXPECT_TRUE(head.ends_with("Content-Length: " + std::to_string(reply.body.size()) +
                             "\r\n\r\n"))
      << head;
  EXPECT_EQ(head.find("Connection"), std::string::npos);
}

TEST(HttpCodecTest, DatesAreImfFixdates) {
  EXPECT_EQ(imfDate(784111777), "Sun, 06 Nov 1994 08:49:37 GMT");
  EXPECT_EQ(imfDate(0), "Thu, 01 Jan 1970 00:00:00 GMT");
  EXPECT_EQ(imfDate(951782400), "Tue, 29 Feb 2000 00:00:00 GMT");
  EXPECT_EQ(imfDate(1795752339), "Fri, 27 Nov 2026 04:05:39 GMT");
}

}  // namespace
}  // namespace sluice::http
