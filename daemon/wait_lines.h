// WaitLines: a node's waiting requests in line for a global rule's units.
//
// The lines in which a node's requests wait for a global rule's units
// (bounded waiting, max_wait), one per (rule, key), shared by all workers
// (the LeaseBroker owns them) so that the units a lease brings go to the
// key's waiters in the order they came, whichever connection and worker
// each came on.
//
// A waiting request that cannot be served at once joins the line of its key
// and gets a ticket; joining marks the key's slice (slice::kLine), and from
// then on take() serves the first in line only. The first waits for its
// lease or for the time Redis said it has units again, as any request does;
// the others wait for their turn. Leaving (served, answered when its wait
// ended, or its connection gone) makes the next one first; the worker that
// holds it is woken (LeaseBroker::notifyWorkers) and sees promotions()
// change. A request that does not wait, on a key with a line, is refused
// (or waits for the lease under way): the units are the waiters'. A line is
// bounded by what its waiters could be given within their wait: a request
// that would stand behind more units than that is refused at once.
//
// Thread-safe; one mutex, taken only by requests that wait and by those
// that find a line mark (the slice's flags carry it, so a key without
// waiters never takes the lock).
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>

#include "slice.h"

namespace sluice {

class WaitLines {
 public:
  // Puts a request for `cost` units at the end of the line for (rule_id,
  // key) and marks `slice` (the key's slice words), unless the line holds
  // requests and this one would stand behind more than `max_ahead` units.
  // Returns its ticket, or 0 (refused); `ahead` gets the units of the
  // requests before it.
  uint64_t join(uint32_t rule_id, std::string_view key, slice::Words slice,
                int64_t cost, int64_t max_ahead, int64_t* ahead);
  // Whether `ticket` is first in its line.
  bool first(uint64_t ticket) const;
  // Takes `ticket` out of its line. An emptied line clears the mark on
  // `slice` (the caller may not hold the key's words: then it is left for
  // standing() to clear). True when another ticket became first.
  bool leave(uint64_t ticket, slice::Words slice);
  // For a request that found the mark: whether the key has a line. Clears a
  // mark the line has outlived.
  bool standing(uint32_t rule_id, std::string_view key, slice::Words slice);
  // Changes each time a ticket becomes first by another's leaving.
  uint64_t promotions() const { return promotions_.load(std::memory_order_acquire); }
  // Tickets in all lines.
  size_t size() const;

 private:
  static std::string lineName(uint32_t rule_id, std::string_view key);

  struct Line {
    std::deque<uint64_t> tickets;  // in arrival order
    int64_t units = 0;             // asked for by them together
  };
  struct Place {
    std::string line;
    int64_t cost;
  };

  mutable std::mutex mutex_;
  std::unordered_map<std::string, Line> lines_;  // by rule id and key
  std::unordered_map<uint64_t, Place> places_;   // by ticket
  uint64_t next_ticket_ = 1;
  std::atomic<uint64_t> promotions_{0};
};

}  // namespace sluice
