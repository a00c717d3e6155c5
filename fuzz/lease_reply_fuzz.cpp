// lease_reply_fuzz: bytes as Redis's answer (RESP), through hiredis 0.14's
// reply reader, the daemon's RedisReply view (daemon/redis_link.h) and the
// daemon's conversions of a script's reply to integers, into
// scripts::parseLeaseReply and scripts::parseHeartbeatReply.
//
// As in RedisLink::onReply, an error reply never reaches the parsers (the
// caller gets kRedisError). The conversions are copied from the daemon:
// LeaseManager's integers() (lease_manager.cpp) takes an array of integers
// only, and Control::onHeartbeat takes each element's integer(), 0 for an
// element that is not an integer. Keep them in step with those.
//
// hiredis 0.14 allocates an array's element vector when it reads the
// header, before the elements arrive, so "*500000000\r\n" alone costs 4 GB,
// which libFuzzer reports as out-of-memory (a limitation of hiredis with a
// peer that is trusted anyway, not of sluice). An array that declares more
// elements than the input has bytes can never be completed, so the harness
// refuses it as hiredis refuses an allocation that fails; the reply objects
// are otherwise hiredis's own, as in the daemon.
//
// Properties checked: the view answers every question about every reply
// (walked to its leaves) within the reply's bounds; a lease reply parses iff
// it has 5 or 6 elements, a heartbeat reply iff it has 2; a negative
// retry_after_ms means `never` and is reported as 0.
#include <hiredis/hiredis.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

#include "fuzz_check.h"
#include "redis_link.h"
#include "scripts.h"

namespace sluice {
namespace {

redisReplyObjectFunctions g_capped;                             // hiredis's, but createArray
void* (*g_create_array)(const redisReadTask*, int) = nullptr;  // hiredis's own
size_t g_max_elements = 0;                                      // the input's size

void* createCappedArray(const redisReadTask* task, int elements) {
  if (elements > 0 && static_cast<size_t>(elements) > g_max_elements) return nullptr;
  return g_create_array(task, elements);
}

// Reads every part of `reply` through the view; returns a digest so that the
// reads cannot be optimised away.
uint64_t walk(const RedisReply& reply) {
  uint64_t digest = static_cast<uint64_t>(reply.kind());
  digest += static_cast<uint64_t>(reply.integer());
  for (char c : reply.str()) digest = digest * 31 + static_cast<unsigned char>(c);
  for (size_t i = 0; i < reply.size(); ++i) digest += walk(reply[i]);
  return digest;
}

void check(const RedisReply& reply) {
  volatile uint64_t digest = walk(reply);
  (void)digest;
  if (reply.kind() == RedisReply::Kind::kError) return;

  // The conversion the lease manager and the control thread both use.
  bool all_integers = reply.kind() == RedisReply::Kind::kArray;
  for (size_t i = 0; i < reply.size(); ++i) {
    all_integers = all_integers && reply[i].kind() == RedisReply::Kind::kInteger;
  }
  std::optional<std::vector<int64_t>> converted = reply.integers();
  FUZZ_CHECK(converted.has_value() == all_integers,
             "integers() takes exactly the arrays of integers");
  std::vector<int64_t> values = converted.value_or(std::vector<int64_t>{});
  std::optional<scripts::LeaseReply> lease = scripts::parseLeaseReply(values);
  if (values.size() != 5 && values.size() != 6) {
    FUZZ_CHECK(!lease, "a lease reply is 5 or 6 integers");
  }
  if (lease) {
    FUZZ_CHECK(lease->granted == values[0] && lease->granted >= 0, "granted is the 1st, never negative");
    FUZZ_CHECK(lease->remaining >= 0, "remaining is never negative");
    FUZZ_CHECK(lease->never == (values[2] < 0), "a negative retry means never");
    // Any wait, as a deadline in ns from now, fits in an int64.
    constexpr int64_t kYearNs = 365LL * 24 * 3600 * 1'000'000'000;
    FUZZ_CHECK(lease->retry_after_ms >= 0 && lease->retry_after_ms <= (INT64_MAX - kYearNs) / 1'000'000,
               "retry_after_ms is never negative, nor so large its deadline overflows");
    FUZZ_CHECK(lease->reset_after_ms >= 0 && lease->reset_after_ms <= (INT64_MAX - kYearNs) / 1'000'000,
               "reset_after_ms is never negative, nor so large its deadline overflows");
    FUZZ_CHECK(lease->now_ms >= 0, "Redis's clock is never negative");
    FUZZ_CHECK(lease->held == 0, "a rate script's reply holds nothing");
    FUZZ_CHECK(lease->blocked_ms == (values.size() == 6 ? std::min(values[5], int64_t{1} << 41) : 0) &&
                   lease->blocked_ms >= 0,
               "blocked_ms is the 6th integer, never negative, cut to 2^41 ms");
  }
  std::optional<scripts::LeaseReply> held = scripts::parseLeaseReply(values, scripts::Script::kConcurrency);
  FUZZ_CHECK(!held || values.size() == 6, "a concurrency reply is 6 integers");
  if (held) {
    FUZZ_CHECK(held->held == values[5] && held->held >= 0 && held->blocked_ms == 0,
               "held is the 6th integer, never negative");
  }
  std::optional<int64_t> blocked = scripts::parsePenaltyReply(values);
  FUZZ_CHECK(!blocked || (values.size() == 1 && *blocked == values[0] && *blocked >= 0),
             "a penalty reply is one integer, never negative");
  std::optional<scripts::HeartbeatReply> beat = scripts::parseHeartbeatReply(values);
  FUZZ_CHECK(beat.has_value() == (values.size() == 2), "a heartbeat reply is 2 integers");
}

}  // namespace
}  // namespace sluice

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  redisReader* reader = redisReaderCreate();
  FUZZ_CHECK(reader != nullptr, "a reader is created");
  if (sluice::g_create_array == nullptr) {
    sluice::g_capped = *reader->fn;
    sluice::g_create_array = reader->fn->createArray;
    sluice::g_capped.createArray = sluice::createCappedArray;
  }
  sluice::g_max_elements = size;
  reader->fn = &sluice::g_capped;
  if (redisReaderFeed(reader, reinterpret_cast<const char*>(data), size) == REDIS_OK) {
    void* reply = nullptr;
    // Every whole reply in the bytes, in order, until a protocol error or
    // an unfinished reply.
    while (redisReaderGetReply(reader, &reply) == REDIS_OK && reply != nullptr) {
      sluice::check(sluice::RedisReply(reply));
      freeReplyObject(reply);
      reply = nullptr;
    }
  }
  redisReaderFree(reader);
  return 0;
}
