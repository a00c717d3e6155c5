// LeaseManager: the control thread's half of the lease path. It turns the
// workers' LeaseRequests into EVALSHA calls of the lease scripts, applies
// the answers to the keys' slices (slice.h), and sends the calls the
// breaker asks for (breaker.h: what happens when Redis goes down and comes
// back) as its BreakerActions.
//
// Global concurrency rules lease holdings (holding.h, lua/concurrency.lua):
// units this node holds in Redis until it returns them, each node's holding
// with a deadline lease_ttl after its last call. The manager keeps a map of the
// keys that hold units or have calls on the way (holdings_), and every renewal
// interval (lease_ttl / kRenewalsPerTtl; Control's timer calls renewHoldings)
// walks it, at a cost of O(keys holding units): a key whose entry is gone
// returns what Redis holds for it; a key whose pool held a surplus through the
// whole interval returns it (the return renews the rest); any other key holding
// units and not called since half an interval is renewed; a key whose pool is
// in debt leases it back. Every answer says how many units Redis holds for this
// node; once a key has no call left on the way, that is compared with what the
// node believes (holding::kHeld): units Redis no longer holds (the holding
// expired: a stall or restart longer than lease_ttl) are taken out of the pool,
// which may go into debt, so the units callers hold here are leased back before
// new ones are handed out; units Redis holds that the node does not know of (a
// lease that timed out but ran, a key evicted with a lease on the way) are
// returned. The half-open phase renews every holding before the breaker closes,
// so a node learns what Redis kept before it leases again, and leases back the
// debts of every key (the units acquired in fallback beyond the pool), so that
// Redis counts the units callers hold here before the node hands out new ones.
// What Redis cannot grant stays a debt: the key admits nothing new until
// releases or later leases pay it.
//
// Redis keys: each (rule, key) has its global state and its penalty block
// (lua/penalty.lua), named by redis_keys.h so that both share one Redis
// Cluster slot whatever bytes the key holds.
//
// Thread model: every method runs on the control thread (control.h), which
// owns the RedisLink; workers reach the manager only through the
// LeaseBroker's queue. Entries are found again by (rule id, key) under the
// manager's own ReadGuard for every reply: no entry pointer outlives a
// guard.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "breaker.h"
#include "clock.h"
#include "config.h"
#include "key_table.h"
#include "lease.h"
#include "redis_keys.h"
#include "redis_link.h"
#include "rules.h"
#include "script_pipe.h"
#include "scripts.h"

namespace sluice {

// Where the manager finds what it needs; all outlive it.
struct LeaseContext {
  KeyTable* keys = nullptr;
  LeaseBroker* broker = nullptr;
  // The current rule set (any thread; the server's config lock inside).
  std::function<RuleSetPtr()> rules;
  // Redis's clock now (µs), from the control thread's estimate; nullopt
  // before the first heartbeat. Set by Control.
  std::function<std::optional<int64_t>()> redis_now_us;
  // This node's id, the owner of its concurrency holdings. Set by Control.
  std::string node_id;
  // The state version this node writes (redis_keys.h): its keys' names
  // and the fleet marker it claims. Only tests set another (Control reads
  // SLUICE_TEST_STATE_VERSION).
  int64_t state_version = kRedisStateVersion;
  // How long a claim keeps the fleet marker: the members' TTL. Set by
  // Control.
  int64_t fleet_ttl_ms = 3'000;
  // The clock every time the manager and its breaker use comes from
  // (monotonic ns); tests drive a simulated one.
  std::function<int64_t()> now_ns = monotonicNowNs;
};

// A concurrency holding is renewed this many times per lease_ttl when its
// key makes no call of its own, so that one late renewal does not lose it.
constexpr int64_t kRenewalsPerTtl = 3;

// How long after it is built a lease may still grant: at least this, and at
// least twice lease_timeout. Later, Redis runs it as a peek (a lease stuck in
// a frozen Redis's socket), so it cannot take units before this node's
// debit after the outage.
constexpr int64_t kMinLeaseDeadlineUs = 1'000'000;

// After a burst, a taken batch of requests keeps at most this much capacity
// (LeaseRequests); a larger buffer is freed, so that one burst of returns
// does not hold its peak memory for the daemon's life.
constexpr size_t kMaxKeptRequests = 1024;

// A key failing with a Redis error reply (not a timeout), or whose master
// alone is unreachable while Redis as a whole is up (Cluster mode), follows
// its on_redis_down policy this long before it leases again.
constexpr int64_t kLeaseErrorBackoffNs = 1'000'000'000;

// Keys whose debits wait to be sent again (LeaseManager::retryDebits).
constexpr size_t kMaxUnsentDebits = 65'536;

class LeaseManager : private BreakerActions {
 public:
  // Registers the lease scripts on `link` (so before link.start()).
  LeaseManager(RedisTarget& link, const RedisConfig& config, LeaseContext context);
  LeaseManager(const LeaseManager&) = delete;
  LeaseManager& operator=(const LeaseManager&) = delete;

  // The broker's queue has requests.
  void onWakeup();
  // Redis became reachable (handshake done, or PING answered again).
  void onUp();
  // Redis became unreachable.
  void onDown();
  // Graceful stop: returns every slice's unused units and gives up every
  // rate lease the node holds (a rate op of 0), then calls `done`
  // (at once when Redis is down; otherwise when every return is answered or
  // timed out after `timeout_ms`).
  void returnAll(int64_t timeout_ms, std::function<void()> done);

  // Redis's `renew` channel (redis_keys.h, redisRenewChannel) named
  // `state_key`: another node's rate op found the key's rates to be
  // divided again (rate freed while some holder was short of its ask, or
  // the node got well below its share beside holders above theirs). This
  // node's rate on that key, if it holds one, is renewed at the key's next
  // take, not at its schedule, and a key waiting to ask Redis again asks
  // then, not at its wait's end (slice::renewRateNow).
  void renewHeard(std::string_view state_key);

  // One pass over the keys that hold rates (Control calls it every
  // sweepIntervalMs): a key whose demand fell (slice::demandMoved) renews
  // for what it measured, and one idle for slice::idleAfterNs gives its
  // rate up: a key that gets no requests makes no take to see its fall,
  // and would hold its rate until it ends. Nothing while Redis is down.
  // A pass walks every such key but looks in the key table only for those
  // due (slice::moveCheckDueNs, and at most one lease interval after their
  // last look): a node holding rates on many slow keys does not look each
  // of them up every pass.
  void sweepIdleRates();
  // How often sweepIdleRates runs: half the shortest idle time
  // (slice::kIdleWindowsPerInterval), 5 ms at lease_interval 100 ms.
  static int64_t sweepIntervalMs(int64_t lease_interval_ms);

  // Cluster: `master` took over slots it did not hold before (a failover):
  // learning mode, as for a promoted replica (startLearning).
  void newMaster(std::string_view master);

  // One renewal pass over the concurrency holdings (see above); Control
  // calls it every lease_ttl / kRenewalsPerTtl. Nothing while Redis is down.
  void renewHoldings();

  // Claims the fleet marker (breaker.h): a closed breaker keeps it, a
  // refused one asks Redis who it is again. Control calls it every
  // heartbeat interval. Nothing while Redis is down.
  void checkFleet();

  // Sends again the debits that could not be sent (in a cluster, their
  // key's master was unreachable while the breaker stayed closed). Control
  // calls it every health interval.
  void retryDebits();

  // The Redis keys of (rule, key): its global state and its penalty block.
  std::string stateKey(std::string_view rule_name, std::string_view key) const;
  std::string blockKey(std::string_view rule_name, std::string_view key) const;

 private:
  // `rules` keeps `rule` alive until the reply.
  void sendLease(const LeaseRequest& request, const Rule& rule, RuleSetPtr rules);
  // Runs penalty.lua's `op` on (rule, key); a block lasts block_ms.
  void sendPenalty(const Rule& rule, std::string_view key, scripts::PenaltyOp op,
                   int64_t block_ms);
  void sendReturn(const Rule& rule, std::string_view key, int64_t units, int64_t lease_now_ms,
                  int64_t timeout_ms, std::function<void()> done);
  // Sends a debit of `units` admitted over the last `span_ms` (0: just now);
  // `done` runs once it is answered or failed.
  void sendDebit(const Rule& rule, std::string_view key, int64_t units, int64_t span_ms,
                 std::function<void(const RedisResult&)> done);
  // A worker's debit of units admitted just now (LeaseRequest::Kind::kDebit);
  // one that cannot be sent waits in unsent_debits_ for retryDebits().
  void sendDebitNow(const Rule& rule, uint32_t variant, std::string_view key, int64_t units);
  // BreakerActions (breaker.h).
  bool askIdentity(uint64_t epoch) override;
  void recover(uint64_t epoch, bool state_lost, bool master_changed,
               int64_t fallback_span_ms) override;
  // Sends fleet_version.lua's claim; `done` gets the marker's version
  // (nullopt: no answer). False when it could not be sent.
  bool claimFleet(std::function<void(std::optional<int64_t>)> done);
  // Ends every rate lease this node holds (rate_lease.h): the master changed
  // (a promoted replica, an empty restart, a cluster master taking over
  // slots), and it may not have the rate's last renewal, so it may not
  // count it, and a slice that refilled on would admit beside a bucket that
  // refills at the full rate. Each is given up in Redis too (a master that
  // has it would charge it on). A key asks for a rate again once its
  // bucket runs dry.
  void endRates();
  // Debits what fallback admitted over span_ms, the shares' and the rate
  // leases' (slice::takeRateFallback), one debit per key (nothing when
  // Redis lost the state); `expect` counts the debits before they are sent,
  // and each one's answer calls `answered`.
  void debitFallback(bool state_lost, int64_t span_ms, const std::function<void()>& answered,
                     const std::function<void(size_t)>& expect);
  // Serves taken requests, taking more from the broker as those run out,
  // while the pipeline has room for their script calls (all of them when
  // `all`); a request that sends nothing (Redis down, rule gone) needs no room.
  void serveTaken(bool all = false);
  // Serves one request; false, doing nothing, when it would send a script
  // call and there is no `room`.
  bool serve(const LeaseRequest& request, const RuleSetPtr& rules, bool room);
  // Sends (or queues: script_pipe.h) an EVALSHA of rule's lease script on
  // (rule, key); `on_result` gets its result, kDisconnected when Redis went
  // down before it could be sent.
  void callScript(const Rule& rule, std::string_view key, std::vector<std::string> argv,
                  int64_t timeout_ms, RedisCallback on_result);
  // sent_ns: when the lease was sent (a rate lease's start, at the latest).
  void onLeaseReply(const LeaseRequest& request, const Rule& rule, const RedisResult& result,
                    int64_t sent_ns);
  // How long a rate lease holds (lease_ttl, at most rate_lease::kMaxLeaseMs).
  int64_t rateLeaseMs() const;
  // A lease that got no usable answer: counted, and the key follows its
  // policy for a while when Redis answered (or its master alone is lost).
  // `rate_rule`: the rule of a rate op (request.rate >= 0), whose key then
  // holds at most the rate it asked for (slice::holdAtMostRate).
  void leaseFailed(const LeaseRequest& request, const RedisResult& result, const Rule* rate_rule = nullptr);
  // Counts an answered lease (latency, granted or empty).
  void countLease(const scripts::LeaseReply& reply, const RedisResult& result);

  // Concurrency holdings (holding.h). `rules` keeps `rule` alive until the
  // answer; `then` (may be null) gets the parsed answer (null when there is
  // none) before it is reconciled with the entry.
  using HoldingDone = std::function<void(const scripts::LeaseReply*, const RedisResult&)>;
  void callHolding(const Rule& rule, const RuleSetPtr& rules, std::string_view key,
                   scripts::Op op, int64_t n, int64_t need, int64_t timeout_ms, HoldingDone then);
  // `done` (may be null) runs once the lease is answered or failed.
  void sendHoldingLease(const LeaseRequest& request, const Rule& rule, const RuleSetPtr& rules,
                        std::function<void()> done = nullptr);
  // Half-open: leases back the debts of every holding (units acquired in
  // fallback beyond its pool), so that Redis counts them before this node
  // closes its breaker. Visits the whole key table, as debitFallback does.
  void leaseDebts(const std::function<void()>& answered,
                  const std::function<void(size_t)>& expect);
  // A worker's (the sweep's) return of units that left a pool.
  bool serveHoldingReturn(const LeaseRequest& request, const Rule& rule, const RuleSetPtr& rules,
                          bool room);
  void sendHoldingReturn(const Rule& rule, const RuleSetPtr& rules, std::string_view key,
                         int64_t units, bool counted, std::function<void()> done);
  // Compares what Redis holds for this node with what the node believes,
  // once no call on the key is on the way (see above).
  void reconcile(const Rule& rule, const RuleSetPtr& rules, const std::string& key,
                 const scripts::LeaseReply& reply);
  // A renewal pass; `recovering` (half-open) renews every holding and keeps
  // surpluses. Each call's answer runs `answered`; `expect` (may be null)
  // gets the number of calls before any is sent.
  void passHoldings(bool recovering, const std::function<void()>& answered,
                    const std::function<void(size_t)>& expect);
  // Clears the in-flight bit of (rule_id, key), after `apply` has run on its
  // words (when the entry is still there); then wakes the workers.
  void finish(uint32_t rule_id, std::string_view key,
              const std::function<void(std::span<std::atomic<uint64_t>>)>& apply);
  int64_t now() const { return context_.now_ns(); }
  RedisLink::ScriptId scriptFor(Algorithm algorithm) const;

  RedisTarget& link_;
  const RedisConfig config_;
  LeaseContext context_;
  KeyTable::ReaderId reader_;
  // By algorithm, of those that lease a slice (algorithm.h).
  std::array<RedisLink::ScriptId, kAlgorithmCount> slice_scripts_{};
  RedisLink::ScriptId concurrency_ = 0, penalty_ = 0, fleet_version_ = 0;
  const std::string version_key_;  // the fleet marker
  size_t identities_in_flight_ = 0;   // askIdentity calls not answered
  bool claim_in_flight_ = false;      // checkFleet's claim, while closed

  ScriptPipe pipe_;  // every script call goes through it

  // Requests taken from the broker; those from taken_next_ on are not served
  // yet (see kMaxScriptsInFlight).
  std::vector<LeaseRequest> taken_;
  size_t taken_next_ = 0;
  bool serving_ = false;  // serveTaken() is running (a callback must not re-enter it)
  // Debits that could not be sent, by (rule id, variant, key): units. At
  // most kMaxUnsentDebits keys; beyond, a debit is dropped (and logged).
  struct DebitKey {
    uint32_t rule_id;
    uint32_t variant;
    std::string key;
    auto operator<=>(const DebitKey&) const = default;
  };
  std::map<DebitKey, int64_t> unsent_debits_;
  // The keys (rule id, key) granted a rate, for sweepIdleRates, each with
  // when the sweep looks at it next (monotonic ns); a key leaves at the
  // first look that finds it holding none.
  std::map<std::pair<uint32_t, std::string>, int64_t> rate_keys_;
  // Concurrency keys holding units in Redis, or with calls on the way.
  struct HeldKey {
    uint32_t rule_id;
    std::string key;
    auto operator<=>(const HeldKey&) const = default;
  };
  struct Holding {
    int64_t redis_held = 0;    // what Redis's last answer said it holds for us
    uint32_t in_flight = 0;    // calls sent and not answered
    int64_t last_call_ns = 0;  // the last call sent (each renews the holding)
  };
  std::map<HeldKey, Holding> holdings_;
  int64_t lost_logged_ns_ = 0;  // holdings found expired are logged this often at most
  std::string last_error_;        // the last lease error logged
  CircuitBreaker breaker_;        // last: built on the members above
};

}  // namespace sluice
