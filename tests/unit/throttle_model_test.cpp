// CL.THROTTLE against a reference model of redis-cell's semantics: a seeded
// randomized trace of calls (bursts, quantity 0, quantities above the
// burst, zero and huge parameters, time stepping on a simulated clock) is
// decided by the daemon's GCRA (algorithms/gcra.h) on the rule the Redis
// front makes of the call's parameters, written by the front's codec
// (resp_codec.h), and must read, call for call, as redis-cell answers.
#include <gtest/gtest.h>

#include <cstdint>
#include <map>
#include <random>
#include <string>
#include <tuple>

#include "algorithms/gcra.h"
#include "resp_codec.h"

namespace sluice {
namespace {

using i128 = __int128;
constexpr int64_t kNsPerSecond = 1'000'000'000;

// redis-cell (throttled's RateLimiter::rate_limit): one theoretical arrival
// time per key; emission interval period / count, delay variation
// tolerance interval * (max_burst + 1). Seconds truncated; retry -1 unless
// limited by a quantity the burst could hold.
struct ReferenceModel {
  std::map<std::string, i128> tat_ns;

  std::string throttle(const std::string& key, const resp::Throttle& p, i128 now_ns) {
    const i128 interval = static_cast<i128>(p.period_s) * kNsPerSecond / p.count;
    const i128 tolerance = interval * (p.max_burst + 1);
    const i128 increment = interval * p.quantity;
    auto found = tat_ns.find(key);
    i128 tat = found == tat_ns.end() ? now_ns : std::max(found->second, now_ns);
    const i128 new_tat = tat + increment;
    const i128 allow_at = new_tat - tolerance;
    const i128 diff = now_ns - allow_at;
    bool limited = false;
    i128 retry_after = -kNsPerSecond;
    i128 ttl = 0;
    if (diff < 0) {
      if (increment <= tolerance) retry_after = -diff;
      limited = true;
      ttl = tat - now_ns;
    } else {
      ttl = new_tat - now_ns;
      tat_ns[key] = new_tat;
    }
    const i128 next = tolerance - ttl;
    int64_t remaining = next > -interval ? static_cast<int64_t>(next / interval) : 0;
    std::string out;
    resp::writeArrayHeader(&out, 5);
    resp::writeInteger(&out, limited ? 1 : 0);
    resp::writeInteger(&out, p.max_burst + 1);
    resp::writeInteger(&out, remaining);
    resp::writeInteger(&out, static_cast<int64_t>(retry_after / kNsPerSecond));
    resp::writeInteger(&out, static_cast<int64_t>(ttl / kNsPerSecond));
    return out;
  }
};

// The daemon: the GCRA rule of the call's parameters, a state word per
// (rule, key), and the front's reply.
struct Daemon {
  std::map<std::tuple<std::string, int64_t, int64_t, int64_t>, uint64_t> state;

  std::string throttle(const std::string& key, const resp::Throttle& p, int64_t now_ns) {
    Limit limit{.limit = p.count, .period_ns = p.period_s * kNsPerSecond, .burst = p.max_burst + 1};
    uint64_t& word = state[{key, p.max_burst, p.count, p.period_s}];
    Answer answer;
    answer.decide(gcra::acquire(word, limit, now_ns, p.quantity, 0), Mode::kLocal);
    std::string out;
    resp::writeAnswer(&out, resp::Shape::kThrottle, p.max_burst, answer);
    return out;
  }
};

TEST(ThrottleModelTest, ARandomTraceReadsAsRedisCellCallForCall) {
  // Parameter sets from a burst of one to huge ones, a year-long period,
  // and an interval of no whole milliseconds (60 s / 7).
  const resp::Throttle kSets[] = {
      {.max_burst = 0, .count = 1, .period_s = 1},
      {.max_burst = 15, .count = 30, .period_s = 60},
      {.max_burst = 4, .count = 5, .period_s = 1},
      {.max_burst = 99, .count = 1000, .period_s = 1},
      {.max_burst = 999'999'999, .count = 1'000'000'000, .period_s = 1'000'000},
      {.max_burst = 2, .count = 1, .period_s = 31'622'400},
      {.max_burst = 5, .count = 7, .period_s = 60},
  };
  for (uint32_t seed : {1u, 2u, 3u, 4u, 5u}) {
    std::mt19937_64 random(seed);
    ReferenceModel model;
    Daemon daemon;
    int64_t now_ns = 1'700'000'000 * kNsPerSecond;
    for (int call = 0; call < 5000; ++call) {
      const size_t set = random() % std::size(kSets);
      resp::Throttle p = kSets[set];
      switch (random() % 6) {
        case 0: p.quantity = 0; break;
        case 1: p.quantity = p.max_burst + 1 + static_cast<int64_t>(random() % 3); break;
        case 2: p.quantity = 1 + static_cast<int64_t>(random() % (p.max_burst + 1)); break;
        default: p.quantity = 1;
      }
      // A key keeps its parameters, as callers do: redis-cell keeps one
      // arrival time per key whatever the parameters, sluice one per rule.
      const std::string key = "k" + std::to_string(set) + "." + std::to_string(random() % 3);
      // Time steps: none (a burst), milliseconds, or up to a period.
      switch (random() % 3) {
        case 0: break;
        case 1: now_ns += static_cast<int64_t>(random() % 1000) * 1'000'000; break;
        default: now_ns += static_cast<int64_t>(random() % (p.period_s * 1000 + 1)) * 1'000'000;
      }
      ASSERT_EQ(daemon.throttle(key, p, now_ns), model.throttle(key, p, now_ns))
          << "seed " << seed << " call " << call << ": " << resp::throttleRuleName(p)
          << " quantity " << p.quantity << " key " << key;
    }
  }
}

}  // namespace
}  // namespace sluice
