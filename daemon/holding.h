// Holding: the worker's half of a global concurrency rule's lease
// (docs/design.md, "The lease path"; the Redis half is lua/concurrency.lua).
//
// A global concurrency rule caps the units held at once across the fleet.
// Each node leases units from Redis in batches into the key's pool and hands
// them to local acquires; a release puts a unit back into the pool, not into
// Redis, so a key that is busy costs Redis nothing per acquire. The key's
// entry holds, in order (entryWords() in entry.h):
//
//  - the slice words (slice.h): slice::kUnits is the pool, units held from
//    Redis that no caller holds now; the in-flight bit, the negative cache,
//    the demand and the batch work as for a rate rule's slice;
//  - kHeld: the units Redis holds for this node, as the node believes it;
//    only the control thread writes it (grants, returns, corrections);
//  - kPoolLow: the fewest units the pool held since the control thread's
//    last renewal pass (a surplus unused for a whole pass goes back);
//  - one slot per unit of the limit (algorithms/slots.h, as concurrency.h):
//    the deadline of a unit a caller holds here (encodeTime; kMaxTimeNs when
//    the rule has no period), so a crashed caller's unit comes back into the
//    pool when its deadline passes. A slot is free only when its word is 0:
//    an expired deadline is reclaimed (word to 0, one unit to the pool) by
//    reclaim() before the slot is claimed again.
//
// Invariant: pool + live slots == kHeld, whatever the workers do (an
// acquire moves units from the pool to slots, a release or a reclaim moves
// them back), so only the control thread changes the node's holding. The
// pool may be negative: units callers hold here that Redis does not hold for
// this node (a debt), after an acquire in fallback or after Redis said the
// node's holding had expired. A negative pool lets no acquire through while
// leasing; its next lease asks for the debt on top of the cost, and grants
// pay the debt first.
//
// Modes (holding_path.cpp decides which applies):
//  - leasing: acquire() spends from the pool; with `cap` > 0 (learning
//    mode), the node also holds to its share of the limit;
//  - fallback (breaker open, or the key's lease failed or came late) with
//    on_redis_down "local": acquireLocal() claims slots up to the node's
//    share (limit / N), and the pool goes into debt by what it claims;
//    recovery needs nothing more: the debt is leased like any cost.
//
// Thread-safety: every function may run on any thread at once on the same
// words; compare-and-swap only, no lock, no allocation, no clock read.
// Time: monotonic ns of this host, passed in.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <span>

#include "decision.h"
#include "rules.h"
#include "slice.h"

namespace sluice::holding {

// The words after the slice's.
enum Word : size_t {
  kHeld = slice::kWords,
  kPoolLow,
  kSlots,  // the first slot
};

// Words of a holding of `limit`: kSlots plus one per unit.
size_t words(const Limit& limit);

// The pool (slice::kUnits) as a signed count.
int64_t pool(std::span<const std::atomic<uint64_t>> words);

// Units callers hold here at now_ns (slots whose deadline has not passed).
int64_t live(std::span<const std::atomic<uint64_t>> words, int64_t now_ns);

// Clears the slots whose deadline has passed and puts their units back into
// the pool; returns how many.
int64_t reclaim(std::span<std::atomic<uint64_t>> words, int64_t now_ns);

struct Acquired {
  slice::TakeResult taken;  // outcome kTaken: held; else why not
  bool capped = false;      // the pool had units but the cap did not allow them
  int64_t reclaimed = 0;    // expired slots put back into the pool first
};

// Leasing: holds `cost` units from the pool until now_ns + the rule's period
// (or until released). With cap > 0 the units held here must also stay
// within cap. A request asked again passes `again` (slice::take).
Acquired acquire(std::span<std::atomic<uint64_t>> words, const Limit& limit, int64_t now_ns,
                 int64_t cost, bool again, int64_t cap);

// Fallback: holds `cost` units when the units held here stay within `cap`,
// whatever the pool holds (it goes into debt). Returns whether it held them;
// `reclaimed` as for acquire().
bool acquireLocal(std::span<std::atomic<uint64_t>> words, const Limit& limit, int64_t now_ns,
                  int64_t cost, int64_t cap, int64_t* reclaimed);

// Undoes an acquire() or acquireLocal() of `cost` made at now_ns (an
// all-or-nothing group that failed).
void refund(std::span<std::atomic<uint64_t>> words, const Limit& limit, int64_t now_ns,
            int64_t cost);

// Frees the `cost` held units whose deadlines are soonest (all when fewer
// are held) into the pool; returns how many it freed (expired ones it found
// on the way are reclaimed and counted too).
int64_t release(std::span<std::atomic<uint64_t>> words, int64_t now_ns, int64_t cost);

// Records that the pool held `left` units (after a take): kPoolLow.
void notePool(std::span<std::atomic<uint64_t>> words, int64_t left);

// Control thread, at each renewal pass: the units the pool held all through
// the pass now ending (at most what it holds now), taken out of the pool to
// go back to Redis; starts the next pass's measurement.
int64_t takeSurplus(std::span<std::atomic<uint64_t>> words);

// Control thread: claims the key's in-flight bit for a lease of its own (a
// debt to lease back); false when a lease is on the way already.
bool claimLease(std::span<std::atomic<uint64_t>> words);

// The size of the next lease, for a caller that claimed the in-flight bit:
// slice::nextBatch's, plus the pool's debt, so that a grant of `need` lets
// `cost` through. Never more than the limit.
slice::Batch nextBatch(std::span<std::atomic<uint64_t>> words, int64_t now_ns, int64_t cost,
                       const Rule& rule, uint32_t nodes, int64_t lease_interval_ns);

// A decision on a holding: `free_units` may be held now (allowed says
// whether the request got them); reset_after_ms is until the last unit held
// here passes its deadline, and a denial's retry_after_ms until enough
// deadlines pass for `cost` (0 when only releases can free them) or
// `retry_ns` when that is later. With `others_back_ns` > 0 (leasing: how
// soon a unit another node releases can be leased here) and units held by
// other nodes (this node holds fewer than the limit in Redis), a denial's
// retry_after_ms is at most that, though never below `retry_ns`: a release
// elsewhere usually comes long before a deadline here.
Decision decide(std::span<const std::atomic<uint64_t>> words, const Limit& limit, int64_t now_ns,
                int64_t cost, int64_t free_units, bool allowed, int64_t retry_ns = 0,
                int64_t others_back_ns = 0);

// --- The control thread: what Redis holds for the node ------------------------

// The units Redis holds for this node, as the node believes it (kHeld).
int64_t held(std::span<const std::atomic<uint64_t>> words);

// A lease granted `granted` units: into kHeld and the pool; the negative
// cache ends; the key is warm.
void applyGrant(std::span<std::atomic<uint64_t>> words, int64_t granted);

// `units` left the pool to go back to Redis (a return sent): out of kHeld.
void returned(std::span<std::atomic<uint64_t>> words, int64_t units);

// Redis says it holds `redis_held` units for the node. When that is fewer
// than kHeld, the difference is lost (the holding expired, or shrank): it
// leaves the pool too (which may go into debt) and kHeld becomes
// redis_held. Returns the units lost (0: none).
int64_t reconcile(std::span<std::atomic<uint64_t>> words, int64_t redis_held);

// The node is leaving: every unit Redis holds for it goes back. Empties kHeld
// and the pool; returns what kHeld held.
int64_t takeAll(std::span<std::atomic<uint64_t>> words);

}  // namespace sluice::holding
