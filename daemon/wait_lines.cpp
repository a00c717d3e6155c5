// WaitLines: requests in line for a global rule's units; see wait_lines.h.
#include "wait_lines.h"

#include <algorithm>

namespace sluice {

std::string WaitLines::lineName(uint32_t rule_id, std::string_view key) {
  std::string name(reinterpret_cast<const char*>(&rule_id), sizeof rule_id);
  name.append(key);
  return name;
}

uint64_t WaitLines::join(uint32_t rule_id, std::string_view key,
                         slice::Words slice, int64_t cost, int64_t max_ahead,
                         int64_t* ahead) {
  std::lock_guard<std::mutex> lock(mutex_);
  std::string name = lineName(rule_id, key);
  Line& line = lines_[name];
  *ahead = line.units;
  if (!line.tickets.empty() && line.units > max_ahead) return 0;
  uint64_t ticket = next_ticket_++;
  line.tickets.push_back(ticket);
  line.units += cost;
  places_.emplace(ticket, Place{std::move(name), cost});
  slice::markLine(slice);
  return ticket;
}

bool WaitLines::first(uint64_t ticket) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = places_.find(ticket);
  return it != places_.end() && lines_.at(it->second.line).tickets.front() == ticket;
}

bool WaitLines::leave(uint64_t ticket, slice::Words slice) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto place = places_.find(ticket);
  if (place == places_.end()) return false;
  auto it = lines_.find(place->second.line);
  Line& line = it->second;
  line.units -= place->second.cost;
  places_.erase(place);
  bool was_first = line.tickets.front() == ticket;
  line.tickets.erase(std::find(line.tickets.begin(), line.tickets.end(), ticket));
  if (line.tickets.empty()) {
    lines_.erase(it);
    if (!slice.empty()) slice::clearLine(slice);
    return false;
  }
  if (!was_first) return false;
  promotions_.fetch_add(1, std::memory_order_acq_rel);
  return true;
}

bool WaitLines::standing(uint32_t rule_id, std::string_view key,
                         slice::Words slice) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (lines_.contains(lineName(rule_id, key))) return true;
  slice::clearLine(slice);
  return false;
}

size_t WaitLines::size() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return places_.size();
}

}  // namespace sluice
