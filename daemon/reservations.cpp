// Reservations: the table of one worker's open reservations (see reservations.h).
#include "reservations.h"

#include <cstdint>

namespace sluice {

Reservations::Reservations(uint32_t worker_index, Bounds bounds)
    : worker_bits_(static_cast<uint64_t>(worker_index & 0xFFFF) << kSequenceBits), bounds_(bounds) {}

std::optional<Reservations::Refusal> Reservations::refusal(uint32_t rule_id,
                                                           std::string_view key) const {
  if (open_.size() >= bounds_.max_open) return Refusal::kTableFull;
  auto it = per_key_.find(KeyOf{rule_id, std::string(key)});
  if (it != per_key_.end() && it->second >= bounds_.max_per_key) return Refusal::kKeyFull;
  return std::nullopt;
}

uint64_t Reservations::open(uint32_t rule_id, std::string_view key, int64_t estimate,
                            int64_t ttl_ns, int64_t now_ns, bool leased) {
  const uint64_t id = worker_bits_ | next_sequence_;
  // 2^48 reservations per worker before the sequence wraps; it skips 0 so
  // that no id is 0.
  next_sequence_ = (next_sequence_ + 1) & ((uint64_t{1} << kSequenceBits) - 1);
  if (next_sequence_ == 0) next_sequence_ = 1;
  const int64_t expires_ns = ttl_ns > INT64_MAX - now_ns ? INT64_MAX : now_ns + ttl_ns;
  Reservation r{.id = id, .rule_id = rule_id, .key = std::string(key), .estimate = estimate,
                .opened_ns = now_ns, .expires_ns = expires_ns, .leased = leased};
  by_expiry_.emplace(expires_ns, id);
  ++per_key_[KeyOf{rule_id, r.key}];
  reserved_units_ += estimate;
  open_.emplace(id, std::move(r));
  return id;
}

void Reservations::forget(const Reservation& r) {
  by_expiry_.erase({r.expires_ns, r.id});
  auto it = per_key_.find(KeyOf{r.rule_id, r.key});
  if (it != per_key_.end() && --it->second == 0) per_key_.erase(it);
  reserved_units_ -= r.estimate;
}

std::optional<Reservations::Reservation> Reservations::take(uint64_t id) {
  auto it = open_.find(id);
  if (it == open_.end()) return std::nullopt;
  Reservation r = std::move(it->second);
  open_.erase(it);
  forget(r);
  return r;
}

std::vector<Reservations::Reservation> Reservations::expire(int64_t now_ns) {
  std::vector<Reservation> expired;
  while (!by_expiry_.empty() && by_expiry_.begin()->first <= now_ns) {
    std::optional<Reservation> r = take(by_expiry_.begin()->second);
    if (!r) {
      by_expiry_.erase(by_expiry_.begin());  // not reached: every entry is open
      continue;
    }
    expired.push_back(std::move(*r));
  }
  return expired;
}

std::optional<int64_t> Reservations::nextExpiryNs() const {
  if (by_expiry_.empty()) return std::nullopt;
  return by_expiry_.begin()->first;
}

}  // namespace sluice
