// http_fuzz: one client's byte stream through the HTTP check front's
// words, as HttpCodec::read (daemon/http_front.cpp) runs them:
// http::parseRequest over the buffered bytes, the query's parameters
// percent-decoded, http::parseCheck on each request, until an unfinished
// request or a refusal (after which the front closes).
//
// Properties checked on every request:
//  - a request consumes at least one byte and no more than it was given;
//    a refusal is one of 400, 411, 413, 414, 431, 505 with a detail;
//  - every prefix of the bytes a request took is unfinished (a request
//    that trickles in is read as the whole one), and headEnd, walked over
//    the prefixes as frameReady walks them, finds the head's end;
//  - a decoded parameter is no longer than its raw form;
//  - a check that parses has a key within max_key_bytes and a cost within
//    0..10^9; a refused one is a 4xx problem;
//  - every response written (a refusal's, an answer's: allowed, denied,
//    failed) is one well-formed HTTP/1.1 response whose Content-Length is
//    its body's size.
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "fuzz_check.h"
#include "http_codec.h"
#include "http_request.h"

namespace {

using namespace sluice;

const http::Limits kLimits{.max_request_bytes = 4096, .max_headers = 32};
constexpr size_t kMaxKeyBytes = 256;

bool wellFormed(std::string_view response) {
  if (response.substr(0, 9) != "HTTP/1.1 ") return false;
  const size_t head_end = response.find("\r\n\r\n");
  if (head_end == std::string_view::npos) return false;
  const size_t length_at = response.find("\r\nContent-Length: ");
  if (length_at == std::string_view::npos || length_at > head_end) return false;
  const size_t length = std::stoul(std::string(response.substr(length_at + 18, 12)));
  return response.size() == head_end + 4 + length;
}

std::optional<std::string_view> decoded(std::string_view query, std::string_view name,
                                        std::string* storage) {
  std::optional<std::string_view> raw = http::queryValue(query, name);
  if (!raw) return std::nullopt;
  storage->assign(raw->size(), '\0');
  const size_t size = http::percentDecode(*raw, true, storage->data());
  FUZZ_CHECK(size <= raw->size(), "a decoded value is no longer than its raw form");
  storage->resize(size);
  return std::string_view(*storage);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view input(reinterpret_cast<const char*>(data), size);
  http::Request request;
  http::Request again;
  size_t offset = 0;
  Rule rule;
  rule.name = "r";
  rule.algorithm = Algorithm::kTokenBucket;
  rule.limits = {Limit{.limit = 10, .period_ns = 1'000'000'000, .burst = 10}};
  while (offset < input.size()) {
    std::string_view rest = input.substr(offset);
    http::Refusal refusal;
    http::Parse parse = http::parseRequest(rest, kLimits, &request, &refusal);
    if (parse == http::Parse::kIncomplete) break;
    if (parse == http::Parse::kError) {
      const unsigned s = refusal.status;
      FUZZ_CHECK(s == 400 || s == 411 || s == 413 || s == 414 || s == 431 || s == 505,
                 "a refusal has a parser's status");
      FUZZ_CHECK(!refusal.detail.empty(), "a refusal says why");
      std::string response;
      http::writeResponse(&response, http::problem(s, refusal.detail), "close", "date", true);
      FUZZ_CHECK(wellFormed(response), "a refusal is one well-formed response");
      break;
    }
    FUZZ_CHECK(request.consumed > 0 && request.consumed <= rest.size(),
               "a request takes what it was given");
    size_t scanned = 0;
    size_t head_end = 0;
    for (size_t cut = 0; cut < request.consumed; cut += 1 + cut / 8) {
      http::Refusal ignored;
      FUZZ_CHECK(http::parseRequest(rest.substr(0, cut), kLimits, &again, &ignored) ==
                     http::Parse::kIncomplete,
                 "a prefix is unfinished");
      if (head_end == 0) head_end = http::headEnd(rest.substr(0, cut), &scanned);
    }
    if (head_end == 0) head_end = http::headEnd(rest.substr(0, request.consumed), &scanned);
    FUZZ_CHECK(head_end > 0 && head_end <= request.consumed - request.body_bytes,
               "headEnd finds the head's end");
    offset += request.consumed;

    std::string storage[8];
    http::Parameters parameters;
    parameters.query_rule = decoded(request.query, "rule", &storage[0]);
    parameters.query_key = decoded(request.query, "key", &storage[1]);
    parameters.query_cost = decoded(request.query, "cost", &storage[2]);
    parameters.query_key_header = decoded(request.query, "key_header", &storage[3]);
    if (parameters.query_key_header) {
      parameters.named_header = request.header(*parameters.query_key_header);
    }
    parameters.header_rule = request.header("Sluice-Rule");
    parameters.header_key = request.header("Sluice-Key");
    parameters.header_cost = request.header("Sluice-Cost");
    parameters.query_estimate = decoded(request.query, "estimate", &storage[4]);
    parameters.query_ttl_ms = decoded(request.query, "ttl_ms", &storage[5]);
    parameters.query_id = decoded(request.query, "id", &storage[6]);
    parameters.query_actual = decoded(request.query, "actual", &storage[7]);
    std::string path(request.path.size(), '\0');
    path.resize(http::percentDecode(request.path, false, path.data()));
    http::Parsed parsed = http::parseCheck(path, request.method, parameters, kMaxKeyBytes);
    if (!parsed.ok) {
      FUZZ_CHECK(parsed.refusal.status >= 400 && parsed.refusal.status < 500,
                 "a refused check is a client error");
      std::string response;
      http::writeResponse(&response, parsed.refusal, "", "date", request.method != "HEAD");
      FUZZ_CHECK(request.method == "HEAD" || wellFormed(response),
                 "a refusal is one well-formed response");
      if (!request.keep_alive) break;
      continue;
    }
    FUZZ_CHECK(parsed.item.key.size() <= kMaxKeyBytes || parsed.item.key.empty(),
               "a key within max_key_bytes");
    FUZZ_CHECK(parsed.item.cost >= 0 && parsed.item.cost <= 1'000'000'000, "a cost in range");
    for (int outcome = 0; outcome < 3; ++outcome) {
      Answer answer;
      answer.method = parsed.method;
      if (outcome == 2) {
        answer.fail(ErrorCode::kUnknownRule, std::string(parsed.item.rule));
      } else {
        Decision decision;
        decision.allowed = outcome == 0;
        decision.remaining = parsed.item.cost;
        decision.limit = 10;
        decision.retry_after_ms = outcome == 0 ? 0 : 1500;
        answer.decide(decision, Mode::kLocal);
      }
      std::string response;
      http::writeResponse(&response,
                          http::encodeAnswer(answer, &rule, parsed.item.rule, 429),
                          request.keep_alive ? "" : "close", "date", true);
      FUZZ_CHECK(wellFormed(response), "an answer is one well-formed response");
    }
    if (!request.keep_alive) break;
  }
  return 0;
}
