// Scripts: the embedded Lua sources and their argument lists (see scripts.h).
#include "scripts.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>

#include "calendar.h"

namespace sluice::scripts {
namespace {

// kLua_<name>: lua/<name>.lua's bytes, written by daemon/embed_lua.cmake.
#include "lua_sources.inc"

// The bytes of the preludes and then a script, joined at compile time.
template <const std::string_view&... kParts>
struct Joined {
  static constexpr size_t kSize = (kParts.size() + ...);
  static constexpr std::array<char, kSize> kBytes = [] {
    std::array<char, kSize> bytes{};
    auto out = bytes.begin();
    ((out = std::copy(kParts.begin(), kParts.end(), out)), ...);
    return bytes;
  }();
  static constexpr std::string_view kText{kBytes.data(), kBytes.size()};
};

// The preludes' file names, in the order they are joined.
constexpr std::array<std::string_view, 1> kCommon = {"common.lua"};
constexpr std::array<std::string_view, 2> kCommonAndRateLease = {"common.lua", "rate_lease.lua"};

constexpr std::array<ScriptSource, 9> kScripts = {{
    {Script::kTokenBucket, "token_bucket.lua", kCommonAndRateLease,
     Joined<kLua_common, kLua_rate_lease, kLua_token_bucket>::kText},
    {Script::kGcra, "gcra.lua", kCommonAndRateLease, Joined<kLua_common, kLua_rate_lease, kLua_gcra>::kText},
    {Script::kFixedWindow, "fixed_window.lua", kCommon, Joined<kLua_common, kLua_fixed_window>::kText},
    {Script::kSlidingWindow, "sliding_window.lua", kCommon, Joined<kLua_common, kLua_sliding_window>::kText},
    {Script::kSlidingLog, "sliding_log.lua", kCommon, Joined<kLua_common, kLua_sliding_log>::kText},
    {Script::kConcurrency, "concurrency.lua", kCommon, Joined<kLua_common, kLua_concurrency>::kText},
    {Script::kHeartbeat, "heartbeat.lua", kCommon, Joined<kLua_common, kLua_heartbeat>::kText},
    {Script::kPenalty, "penalty.lua", kCommon, Joined<kLua_common, kLua_penalty>::kText},
    {Script::kFleetVersion, "fleet_version.lua", kCommon, Joined<kLua_common, kLua_fleet_version>::kText},
}};

constexpr int64_t kNsPerMs = 1'000'000;

int64_t ceilMs(int64_t ns) { return ns <= 0 ? 0 : (ns - 1) / kNsPerMs + 1; }

// A calendar limit's ARGV[8] placeholder and ARGV[9..]: the windows before,
// at and after now_us (Unix µs; 0: this host's wall clock), as id, start_us,
// end_us. Redis's clock may differ from this host's by less than a window
// either way and still find its window among them.
void appendCalendar(std::vector<std::string>* argv, const Limit& limit, int64_t now_us) {
  if (limit.window == calendar::Span::kNone) return;
  const int64_t now_ns =
      now_us != 0 ? now_us * 1000
                  : std::chrono::duration_cast<std::chrono::nanoseconds>(
                        std::chrono::system_clock::now().time_since_epoch())
                        .count();
  const calendar::Window now = calendar::windowAt(now_ns, limit.window, limit.time_zone);
  const calendar::Window windows[] = {
      calendar::windowAt(now.start_unix_ns - 1, limit.window, limit.time_zone), now,
      calendar::windowAt(now.end_unix_ns, limit.window, limit.time_zone)};
  if (argv->size() == 7) argv->push_back("0");
  for (const calendar::Window& w : windows) {
    argv->push_back(std::to_string(w.id));
    argv->push_back(std::to_string(w.start_unix_ns / 1000));
    argv->push_back(std::to_string(w.end_unix_ns / 1000));
  }
}

}  // namespace

std::span<const ScriptSource> all() { return kScripts; }

const ScriptSource& get(Script script) { return kScripts[static_cast<size_t>(script)]; }

std::optional<Script> forAlgorithm(Algorithm algorithm) {
  const std::string_view file = algorithmTraits(algorithm).lease_script;
  for (const ScriptSource& source : kScripts) {
    if (!file.empty() && source.name == file) return source.script;
  }
  return std::nullopt;
}

std::string_view opName(Op op) {
  switch (op) {
    case Op::kLease: return "lease";
    case Op::kReturn: return "return";
    case Op::kDebit: return "debit";
    case Op::kPeek: return "peek";
    case Op::kRenew: return "renew";
  }
  return "peek";
}

std::string_view heartbeatOpName(HeartbeatOp op) {
  switch (op) {
    case HeartbeatOp::kBeat: return "beat";
    case HeartbeatOp::kLeave: return "leave";
    case HeartbeatOp::kPeek: return "peek";
  }
  return "peek";
}

namespace {

std::vector<std::string> baseArgv(Op op, int64_t n, int64_t need, const Limit& limit, int64_t now_us) {
  return {std::string(opName(op)),
          std::to_string(n),
          std::to_string(need),
          std::to_string(limit.limit),
          std::to_string(ceilMs(limit.period_ns)),
          std::to_string(limit.burst),
          std::to_string(now_us)};
}

}  // namespace

std::vector<std::string> rateArgv(Op op, int64_t n, int64_t need, const Limit& limit, int64_t now_us) {
  std::vector<std::string> argv = baseArgv(op, n, need, limit, now_us);
  appendCalendar(&argv, limit, now_us);
  return argv;
}

int64_t leaseWindow(int64_t lease_now_ms, const Limit& limit) {
  if (lease_now_ms < 0) return 0;
  if (limit.window != calendar::Span::kNone) {
    return calendar::windowAt(lease_now_ms * kNsPerMs, limit.window, limit.time_zone).id;
  }
  const int64_t period_ms = ceilMs(limit.period_ns);
  if (period_ms <= 0) return 0;
  return lease_now_ms / period_ms;
}

int64_t leaseWindowEndMs(int64_t lease_now_ms, const Limit& limit) {
  if (limit.window != calendar::Span::kNone) {
    const calendar::Window w =
        calendar::windowAt(std::max<int64_t>(lease_now_ms, 0) * kNsPerMs, limit.window, limit.time_zone);
    return w.end_unix_ns / kNsPerMs;
  }
  const int64_t period_ms = std::max<int64_t>(ceilMs(limit.period_ns), 1);
  return (leaseWindow(lease_now_ms, limit) + 1) * period_ms;
}

std::vector<std::string> leaseArgv(int64_t n, int64_t need, const Limit& limit, int64_t deadline_us) {
  std::vector<std::string> argv = baseArgv(Op::kLease, n, need, limit, 0);
  argv.push_back(std::to_string(deadline_us));
  appendCalendar(&argv, limit, 0);
  return argv;
}

std::vector<std::string> returnArgv(int64_t n, const Limit& limit, int64_t lease_window, int64_t now_us) {
  std::vector<std::string> argv = baseArgv(Op::kReturn, n, 0, limit, now_us);
  argv.push_back(std::to_string(lease_window));
  appendCalendar(&argv, limit, now_us);
  return argv;
}

int64_t returnMark(int64_t lease_now_ms, Algorithm algorithm, const Limit& limit) {
  return algorithmTraits(algorithm).stamps_lease ? lease_now_ms : leaseWindow(lease_now_ms, limit);
}

std::vector<std::string> concurrencyArgv(Op op, int64_t n, int64_t need, const Limit& limit, int64_t lease_ttl_ms,
                                         std::string_view node_id, int64_t now_us) {
  return {std::string(opName(op)),
          std::to_string(n),
          std::to_string(need),
          std::to_string(limit.limit),
          std::to_string(lease_ttl_ms),
          std::string(node_id),
          std::to_string(now_us)};
}

std::vector<std::string> heartbeatArgv(HeartbeatOp op, std::string_view node_id, int64_t ttl_ms, int64_t now_us) {
  return {std::string(heartbeatOpName(op)), std::string(node_id), std::to_string(ttl_ms), std::to_string(now_us)};
}

std::vector<std::string> penaltyArgv(PenaltyOp op, int64_t block_ms) {
  std::string_view name = op == PenaltyOp::kBlock ? "block" : op == PenaltyOp::kReset ? "reset" : "peek";
  return {std::string(name), std::to_string(block_ms)};
}

std::optional<int64_t> parsePenaltyReply(std::span<const int64_t> values) {
  if (values.size() != 1 || values[0] < 0) return std::nullopt;
  return values[0];
}

std::optional<LeaseReply> parseLeaseReply(std::span<const int64_t> values, Script script) {
  bool concurrency = script == Script::kConcurrency;
  if (values.size() != 6 && (concurrency || values.size() != 5)) return std::nullopt;
  // Nothing our scripts return is negative (but a retry of -1) and no clock
  // comes near 2^50 ms: such a reply is not from them, and a negative grant
  // added to a slice would wrap around. Waits (huge after an absurd debt)
  // are cut to 2^41 ms, 70 years, so that one in ns cannot overflow.
  constexpr int64_t kMaxWaitMs = int64_t{1} << 41;
  constexpr int64_t kMaxClockMs = int64_t{1} << 50;
  auto bad = [](int64_t v, int64_t low, int64_t high) { return v < low || v > high; };
  if (bad(values[0], 0, INT64_MAX / 2) || bad(values[2], -1, INT64_MAX) ||
      bad(values[3], 0, INT64_MAX) || bad(values[4], 0, kMaxClockMs) ||
      (values.size() == 6 && bad(values[5], 0, INT64_MAX / 2))) {
    return std::nullopt;
  }
  LeaseReply r;
  r.granted = values[0];
  r.remaining = std::max<int64_t>(values[1], 0);
  r.never = values[2] < 0;
  r.retry_after_ms = r.never ? 0 : std::min(values[2], kMaxWaitMs);
  r.reset_after_ms = std::min(values[3], kMaxWaitMs);
  r.now_ms = values[4];
  if (concurrency) {
    r.held = values[5];
  } else if (values.size() == 6) {
    r.blocked_ms = std::min(values[5], kMaxWaitMs);
  }
  return r;
}

std::vector<std::string> fleetVersionArgv(FleetVersionOp op, int64_t version, int64_t ttl_ms) {
  return {op == FleetVersionOp::kClaim ? "claim" : "peek", std::to_string(version),
          std::to_string(ttl_ms)};
}

std::optional<int64_t> parseFleetVersionReply(std::span<const int64_t> values) {
  if (values.size() != 1 || values[0] < 0) return std::nullopt;
  return values[0];
}

std::optional<HeartbeatReply> parseHeartbeatReply(std::span<const int64_t> values) {
  if (values.size() != 2) return std::nullopt;
  return HeartbeatReply{values[0], values[1]};
}

}  // namespace sluice::scripts
