// Lease: the worker's half of the lease path (docs/design.md, "The lease path").
//
// A global rule's key holds a slice: units this node has leased from the
// rule's global state in Redis and may hand out on its own. The slice lives
// in the key's key-table entry (rule id = the global rule's id) as
// kSliceWords atomic words, so workers decide on it without a lock, exactly
// as on a local rule's state:
//
//  - take() spends from the slice, or says why it cannot: the key is
//    negatively cached ("nothing left in Redis until t"), a lease failed and
//    the key follows its on_redis_down policy for a moment, or the slice is
//    empty and a lease is on its way (the caller may wait for it).
//  - At most one lease per key is in flight: the in-flight bit is claimed by
//    compare-and-swap, and only the claimer sends a LeaseRequest.
//  - A refill is asked for when the slice falls under its low-water mark (a
//    quarter of the last batch), so a hot key does not run dry.
//  - The batch adapts to demand: the units asked for per lease interval,
//    measured over at least one interval (a hot key leases every few ms, and
//    the few units asked for since the last lease say nothing of its rate),
//    never more than the node's share (the rule's capacity / N) and never
//    less than the cost asked for.
//  - While Redis has plenty left after each grant (kRoomyFactor times what
//    it granted), the batch covers twice as many lease intervals each lease,
//    up to 2^kMaxBoost; the first grant that leaves less resets it. An
//    uncontended key then costs Redis one lease per 16 intervals instead of
//    one per interval, which is what lets 10,000 busy keys lease at all; a
//    contended one leases small batches, so no node sits on units another
//    needs.
//
// The control thread (lease_manager.h) applies replies to the same words,
// always through KeyTable::find() under its own ReadGuard, never through a
// kept pointer.
//
// A global concurrency rule's key leases a holding instead (holding.h): the
// same slice words, its pool in kUnits, followed by the units Redis holds
// for the node and one slot per unit callers hold here. Its units are not
// spent but held: a release puts them back into the pool, the control
// thread renews the node's holding in Redis (lua/concurrency.lua, a TTL of
// lease_ttl) and gives back what stays unused. Where a rate rule debits
// what fallback admitted, a holding turns the units its callers hold beyond
// its pool (acquired in fallback, or kept after Redis dropped the node's
// holding) into a debt that it leases back, at recovery before the breaker
// closes: units in use are what Redis must count, and they are still in
// use, whereas a rate rule's fallback admissions are already spent.
//
// LeaseBroker is the meeting point of workers, the control thread and the
// server: which mode global rules are in (leasing, learning), the queue of
// lease and return requests, and the counters `stats` shows. Every method is
// thread-safe.
//
// Time: monotonic ns of this host (clock.h) on the worker side.
#pragma once

#include <uv.h>

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "metrics.h"
#include "rules.h"

namespace sluice {

// Whether a rule's keys lease a slice from Redis: a global rule with one
// limit whose algorithm has a rate lease script (token bucket, GCRA and the
// windows). A global concurrency rule of one limit leases a holding instead
// (leasesHolding, holding.h). A global rate rule of several limits leases
// through its parts (RuleSet::parts), each a leasable rule of one limit.
// Other global rules (sliding_log) always decide on the node's share.
bool leasable(const Rule& rule);
bool leasesHolding(const Rule& rule);

// Units of one limit the whole fleet may hold at once: burst for the
// buckets, limit for the windows.
int64_t leaseCapacity(const Limit& limit);

// The words of a key-table entry of `rule`, in order:
//  - its state: for a leasable global rule its slice (slice::kWords), for
//    a global concurrency rule its holding (holding::words: the slice's
//    words, then its own and one slot per unit), else the limiter's words
//    (stateWords);
//  - for a global rule's share (id with kFallbackIdBit), one word counting
//    units admitted in fallback and not yet debited to Redis
//    (undebitedWord());
//  - with a penalty, penalty::kWords words (penalty.h): penaltyWords() is
//    their number, 0 without one, and penaltyState() their span. A global
//    rule keeps them in its slice entry, whatever mode decides the key;
//  - with overrides, one word: which override decides the key
//    (RuleSet::matchOverride + 1; 0 until resolved).
// entryWords() is their number; take it from the configured rule or share,
// never from a variant (which has no overrides).
size_t entryWords(const Rule& rule);
size_t undebitedWord(const Rule& share);
size_t penaltyWords(const Rule& rule);
std::span<std::atomic<uint64_t>> penaltyState(const Rule& rule,
                                              std::span<std::atomic<uint64_t>> words);
// decidingRule() reads the override word, resolving and recording it on
// first use, and returns the rule that decides the key (the rule itself, or
// an override's variant); `words` are the entry's, entryWords(rule) of them.
const Rule& decidingRule(const RuleSet& rules, const Rule& rule, std::string_view key,
                         std::span<std::atomic<uint64_t>> words);
// The override recorded in an entry of `rule` (0: none, or not resolved yet).
uint32_t storedOverride(const Rule& rule, std::span<const std::atomic<uint64_t>> words);

namespace slice {

// The words of a slice entry.
enum Word : size_t {
  kUnits = 0,      // units held, spendable now (int64)
  kFlags,          // kInFlight | kWarm | kRoomy | the boost (kBoostMask)
  kDenyUntil,      // ns: Redis had nothing for us; deny locally until then
  kDemand,         // units asked for since kDemandSince (an estimate)
  kDemandSince,    // ns: start of the demand measurement under way; 0: none yet
  kExpires,        // ns after which the units may not be spent (windows); 0: never
  kFallbackUntil,  // ns: a lease failed; the key follows on_redis_down until then
  kLeaseNowMs,     // Redis's clock (ms) at the last granting lease: its window
  kBatch,          // units asked for by the last lease request
  kRate,           // demand per lease interval, as last measured over one or more
  kWords
};
constexpr uint64_t kInFlight = 1;
constexpr uint64_t kWarm = 2;   // a lease has granted units at least once
constexpr uint64_t kRoomy = 4;  // the last grant left Redis kRoomyFactor times as much
// Requests of this node wait in line for the key's units (WaitLines): only
// the first in line may spend them. May outlive the line (WaitLines::standing).
constexpr uint64_t kLine = 16;
// Bits 8..11 of kFlags: log2 of how many lease intervals of demand the last
// batch covered.
constexpr int kBoostShift = 8;
constexpr uint64_t kBoostMask = uint64_t{0xF} << kBoostShift;
constexpr int kMaxBoost = 4;
constexpr int64_t kRoomyFactor = 4;

enum class Outcome {
  kTaken,     // spent; `left` units remain
  kDenied,    // negatively cached until `until_ns`
  kEmpty,     // nothing to spend; a lease is in flight (maybe claimed now)
  kFallback,  // a lease failed lately: decide by on_redis_down
  kQueued,    // requests wait in line for the units; `until_ns` is when Redis
              // has units again (0: a lease is on its way or just came)
};

struct TakeResult {
  Outcome outcome = Outcome::kEmpty;
  int64_t left = 0;      // kTaken: units left in the slice
  int64_t until_ns = 0;  // kDenied
  // The caller claimed the in-flight bit and must send a LeaseRequest.
  bool must_request = false;
  bool cold = false;  // no lease has ever granted this key units
  int64_t dropped = 0;  // units dropped because their window had ended
};

// Spends `cost` from the slice when it holds that many. Lock-free. A
// request asked again (it waited for a lease, or for its units) passes
// `again`: its units were counted in the key's demand the first time. While
// requests wait in line for the key (kLine), only the first of them may
// spend (`first_in_line`); any other is told kQueued.
TakeResult take(std::span<std::atomic<uint64_t>> words, int64_t now_ns, int64_t cost,
                bool again = false, bool first_in_line = false);

// Reports what take() would answer, spending and claiming nothing.
TakeResult look(std::span<const std::atomic<uint64_t>> words, int64_t now_ns, int64_t cost);

// Gives up the in-flight bit take() claimed, for a lease that will not be
// sent after all.
void unclaim(std::span<std::atomic<uint64_t>> words);

// Puts back units taken by take() (an all-or-nothing group that failed).
void refund(std::span<std::atomic<uint64_t>> words, int64_t cost);

// Records what a granting lease left in Redis: whether the next batch may
// grow (kRoomy). Called by the control thread with the reply, before it
// clears the key's in-flight bit.
void noteGrant(std::span<std::atomic<uint64_t>> words, int64_t granted, int64_t remaining);

// The size of the next lease, for a caller that has claimed the in-flight
// bit of a key of `rule` (leasable): {n, need}. Once a measurement of demand
// spans a lease interval, it becomes the key's rate and a new one starts.
// A warm bucket key asks for at least a quarter batch, but never for more
// than refills in one lease interval, so a spent bucket is not leased unit
// by unit and a slow one is not left holding units no node may take.
struct Batch {
  int64_t n = 1;
  int64_t need = 1;
};
Batch nextBatch(std::span<std::atomic<uint64_t>> words, int64_t now_ns, int64_t cost,
                const Rule& rule, uint32_t nodes, int64_t lease_interval_ns);

}  // namespace slice

// A global rule's penalty block (one this node counted, or one a lease reply
// reported) is held by the node until it ends (its penalty words), and
// while leasing it is asked of Redis again this long after it was last
// learned (the slice's kDenyUntil is then the time to recheck): the key's
// next acquire after that leases, and Redis says whether the block still
// stands. So a block lifted anywhere (the admin reset) ends on every node
// within about this, at the cost of one lease per blocked key, node and
// interval while the key is still being asked for. While Redis is
// unreachable a node holds the blocks it knows of in full.
constexpr int64_t kBlockRecheckNs = 1'000'000'000;

// The lines in which a node's requests wait for a global rule's units
// (bounded waiting, max_wait), one per (rule, key), shared by all workers so
// that the units a lease brings go to the key's waiters in the order they
// came, whichever connection and worker each came on.
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
class WaitLines {
 public:
  // Puts a request for `cost` units at the end of the line for (rule_id,
  // key) and marks `slice` (the key's slice words), unless the line holds
  // requests and this one would stand behind more than `max_ahead` units.
  // Returns its ticket, or 0 (refused); `ahead` gets the units of the
  // requests before it.
  uint64_t join(uint32_t rule_id, std::string_view key, std::span<std::atomic<uint64_t>> slice,
                int64_t cost, int64_t max_ahead, int64_t* ahead);
  // Whether `ticket` is first in its line.
  bool first(uint64_t ticket) const;
  // Takes `ticket` out of its line. An emptied line clears the mark on
  // `slice` (the caller may not hold the key's words: then it is left for
  // standing() to clear). True when another ticket became first.
  bool leave(uint64_t ticket, std::span<std::atomic<uint64_t>> slice);
  // For a request that found the mark: whether the key has a line. Clears a
  // mark the line has outlived.
  bool standing(uint32_t rule_id, std::string_view key, std::span<std::atomic<uint64_t>> slice);
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

// What a worker asks the control thread for.
struct LeaseRequest {
  // kDebit: units a share admitted while Redis was up but the key could not
  // lease (its lease failed or came late). kBlock: the key's penalty blocks
  // it for n ms across the fleet. kReset: the admin reset of the key's
  // global state and block. A global concurrency rule's key (holding.h)
  // asks only for kLease and kReturn; the units of a kReturn have left its
  // pool already.
  enum class Kind { kLease, kReturn, kDebit, kBlock, kReset };
  Kind kind = Kind::kLease;
  uint32_t rule_id = 0;
  std::string key;
  int64_t n = 0;     // kLease: at most; kReturn, kDebit: units; kBlock: ms
  int64_t need = 0;  // kLease: the fewest worth granting
  int64_t lease_now_ms = 0;  // kReturn: Redis's clock at the lease (its window)
  // Which override of the rule decides the key (RuleSet::variant): its
  // limits are the ones the script is called with.
  uint32_t variant = 0;
};

// Counters of the lease path, for `stats` (each read on its own).
struct LeaseStats {
  uint64_t requested = 0;       // leases sent to Redis
  uint64_t granted = 0;         // leases that granted units
  uint64_t empty = 0;           // leases answered "nothing until t"
  uint64_t failed = 0;          // leases that got an error, timeout or disconnect
  uint64_t granted_units = 0;
  uint64_t returned_units = 0;  // given back (idle keys, stop)
  uint64_t debited_units = 0;   // admitted in fallback, debited on recovery
  uint64_t latency_us_sum = 0;  // answered leases
  uint64_t latency_us_max = 0;
  uint64_t fallback_entries = 0;  // times the breaker opened
  uint64_t fallback_ms = 0;       // time spent with the breaker open (so far)
  uint64_t learning_entries = 0;  // times Redis came back without our state
  // Concurrency holdings (holding.h): units freed into the pools by the
  // sweep and the control thread (expired deadlines; the workers count
  // theirs in MetricsShard), units Redis no longer held for this node
  // (its holding expired), and renewals sent.
  uint64_t released_units = 0;
  uint64_t lost_units = 0;
  uint64_t renewed = 0;
};

// The breaker between the lease path and Redis (docs/design.md, "Fallback").
enum class Breaker {
  kClosed,    // leasing
  kOpen,      // Redis unreachable: global rules follow on_redis_down
  kHalfOpen,  // reconnected: debiting what fallback admitted, then leasing
};
std::string_view breakerName(Breaker breaker);

class LeaseBroker {
 public:
  // lease_interval_ns: a batch covers about this much demand.
  // holding_return_ns: how long a unit of a global concurrency rule that a
  // caller released on another node takes to be leasable here (0: unknown).
  explicit LeaseBroker(int64_t lease_interval_ns, int64_t holding_return_ns = 0);
  LeaseBroker(const LeaseBroker&) = delete;
  LeaseBroker& operator=(const LeaseBroker&) = delete;

  int64_t leaseIntervalNs() const { return lease_interval_ns_; }
  int64_t holdingReturnNs() const { return holding_return_ns_; }

  // Workers: global rules lease while the breaker is closed.
  bool leasing() const { return breaker() == Breaker::kClosed; }
  Breaker breaker() const { return static_cast<Breaker>(breaker_.load(std::memory_order_acquire)); }
  // Whether `rule` is in learning mode at now_ns (breaker.h): Redis came
  // back without the fleet's state less than the rule's learning span ago,
  // so each node also holds itself to its share of the rule. Once every
  // rule is done, one load.
  bool learning(const Rule& rule, int64_t now_ns) const {
    return learningAny(now_ns) && now_ns < learningUntilNs(rule);
  }
  // When `rule`'s learning mode ends (monotonic ns; 0: it never began).
  int64_t learningUntilNs(const Rule& rule) const;
  // Whether some rule may still be learning (the longest span at the start).
  bool learningAny(int64_t now_ns) const {
    return now_ns < learning_until_ns_.load(std::memory_order_acquire);
  }

  // Workers and the server's sweep: queue a request for the control thread.
  void submit(LeaseRequest request);

  // Control thread.
  void setBreaker(Breaker breaker, int64_t now_ns);
  // While the breaker is open: since when (monotonic ns); 0 otherwise.
  int64_t openSinceNs() const { return open_since_ns_.load(std::memory_order_acquire); }
  // Learning mode starts at now_ns (CircuitBreaker): each rule learns for
  // learningSpanNs(rule, holding_memory_ns, reconnect_ns), the longest of
  // them longest_ns.
  void startLearning(int64_t now_ns, int64_t holding_memory_ns, int64_t reconnect_ns,
                     int64_t longest_ns);
  // Takes every queued request.
  void takeRequests(std::vector<LeaseRequest>* out);
  // The handle submit() wakes (nullptr: none yet, requests wait).
  void setWakeup(uv_async_t* wakeup);
  // Wakes every worker with deferred requests (set by the server).
  void onReplies(std::function<void()> notify) { notify_ = std::move(notify); }
  void notifyWorkers() const {
    if (notify_) notify_();
  }
  // Where this node's waiting requests stand in line (any thread).
  WaitLines& lines() { return lines_; }

  // Counters (control thread writes, anyone reads).
  struct Counters {
    std::atomic<uint64_t> requested{0}, granted{0}, empty{0}, failed{0}, granted_units{0},
        returned_units{0}, debited_units{0}, latency_us_sum{0}, latency_us_max{0},
        fallback_entries{0}, learning_entries{0}, released_units{0}, lost_units{0}, renewed{0};
    Histogram latency;  // answered leases; the control thread is its one writer
  };
  Counters& counters() { return counters_; }
  LeaseStats stats(int64_t now_ns) const;

 private:
  const int64_t lease_interval_ns_;
  const int64_t holding_return_ns_;
  std::atomic<int> breaker_{static_cast<int>(Breaker::kOpen)};
  std::atomic<int64_t> learning_since_ns_{0};  // 0: never
  std::atomic<int64_t> learning_holding_ns_{0};
  std::atomic<int64_t> learning_reconnect_ns_{0};
  std::atomic<int64_t> learning_until_ns_{0};  // the longest rule's end
  std::atomic<int64_t> open_since_ns_{0};      // while open: since when
  std::atomic<uint64_t> open_ns_total_{0};     // closed periods of fallback
  Counters counters_;
  WaitLines lines_;

  std::mutex mutex_;  // guards queue_ and wakeup_
  std::vector<LeaseRequest> queue_;
  uv_async_t* wakeup_ = nullptr;
  std::function<void()> notify_;  // set before any thread starts
};

}  // namespace sluice
