// CircuitBreaker: what this node does when Redis goes down and comes back
// (docs/design.md, "Fallback"): the breaker's states, the fallback span, the
// recovery calls of the half-open state (debits and debts), and learning
// mode. It decides; the lease manager (lease_manager.h) sends the calls it
// asks for, and the LeaseBroker (lease.h) shows its state to the workers.
//
//                 down                    up
//   closed ─────────────────> open ───────────────> half_open
//     ^                        ^                        │
//     │                        └─────── down ───────────┤
//     └──────────── every recovery call answered ───────┘
//
//  - closed: global rules lease from Redis.
//  - open: Redis is unreachable (link lost, PING error, a command timed
//    out); global rules follow on_redis_down and nothing is sent. The
//    fallback span starts when the breaker opens.
//  - half_open: Redis answers again. The breaker asks who it is (INFO) and
//    compares its run_id with the last one seen:
//      same run_id (or the first ever): what the fallback shares admitted
//        is debited, charged over the fallback span, so the fleet does not
//        get a second budget for the same period;
//      new run_id whose master_replid2 is the last master_replid (a
//        promoted replica, which holds the state but for the writes not
//        yet replicated): debits, and learning mode;
//      any other new run_id (Redis restarted empty): no debits (there is
//        no state to charge them to), and learning mode.
//    A new run_id also ends every rate lease the node holds (rate_lease.h):
//    the new master may lack the rate's last renewal (replication is
//    asynchronous), so a slice that refilled on would admit beside a
//    bucket that does not count it; what the rate admitted while Redis was
//    unreachable is debited with the shares' admissions.
//    With INFO's answer the node claims the fleet marker
//    (lua/fleet_version.lua, redis_keys.h): when the fleet leasing on this
//    key_prefix writes another state version, or the marker cannot be
//    claimed, the node is refused: it stays half-open (global rules follow
//    on_redis_down), logs one line naming both versions, shows it in
//    health, and asks again every heartbeat interval
//    (LeaseManager::checkFleet) until the marker is its own, which it is
//    once the last daemon of the other version has been gone for a
//    members' TTL. Then, as for any other identity, the fallback debits
//    are sent, every concurrency holding is renewed and every holding's
//    debt leased back. Once the identity and every one of these calls are answered (or
//    failed), the breaker closes. A down on the way opens it again; the
//    calls of an older half-open state no longer count (each transition
//    starts a new epoch). A closed breaker keeps the marker claimed every
//    heartbeat interval; one that finds another version there (another
//    fleet claimed it while it had expired) goes half-open, refused.
//
// Learning mode (Redis lost the fleet's state, or in a cluster a master
// took over slots it did not hold): each node also holds itself to its
// fallback share of every global rule (the demand-weighted one, a rate
// the key held when the breaker opened and asks the fresh state for again,
// until the fallback's hold ends: LeasePath::learnedRate; else the equal
// one), for one memory of that
// rule (a window, a bucket's refill from empty; lease_ttl for a
// concurrency rule, by which every node has renewed what it holds), and at
// least until every node can have reconnected (the longest reconnect
// backoff). Learning is
// per rule: learningSpanNs() below, asked through LeaseBroker::learning.
// While a rule learns, a node's worker leases no more than the share still
// allows (what it may not spend stays in Redis for the others); Redis's
// "nothing until t" is asked again after slice::kEmptyRecheckNs at most
// (slice.h), learning or not, as the others give back what they did not
// spend.
//
// Thread model: a CircuitBreaker runs on the control thread only; workers
// read its state through the LeaseBroker's atomics. Time comes in as now_ns
// arguments (monotonic ns): the breaker never reads a clock.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "redis_keys.h"
#include "rules.h"

namespace sluice {

class LeaseBroker;  // lease.h, which shows the breaker's state to workers

// The breaker between the lease path and Redis (docs/design.md, "Fallback").
enum class Breaker {
  kClosed,    // leasing
  kOpen,      // Redis unreachable: global rules follow on_redis_down
  kHalfOpen,  // reconnected: debiting what fallback admitted, then leasing
};
std::string_view breakerName(Breaker breaker);

// Who a Redis server is, from INFO.
struct RedisIdentity {
  std::string run_id;          // changes when the process restarts
  std::string master_replid;   // its replication history
  std::string master_replid2;  // the history it continued (a promoted replica)
};

// Reads INFO's text; nullopt when it carries no run_id.
std::optional<RedisIdentity> parseInfo(std::string_view info);

// How long `rule` learns after Redis lost the fleet's state: one memory of
// the rule (its period, or a bucket's refill from empty when longer;
// holding_memory_ns for a concurrency rule), and at least reconnect_ns.
int64_t learningSpanNs(const Rule& rule, int64_t holding_memory_ns, int64_t reconnect_ns);

// A configured rule in learning mode and how long it still learns.
struct LearningRule {
  std::string name;
  int64_t left_ms = 0;  // until it stops learning (rounded up)
};
// The configured global rules of `rules` that learn at now_ns, in order; a
// rule of several limits learns while any of its parts does.
std::vector<LearningRule> learningRules(const RuleSet& rules, const LeaseBroker& broker,
                                        int64_t now_ns);

// The calls the breaker asks for; implemented by the lease manager.
class BreakerActions {
 public:
  virtual ~BreakerActions() = default;
  // Asks Redis who it is (INFO) and claims the fleet marker; the answers
  // go to CircuitBreaker::identified(epoch, ...). False when it could not
  // be sent: then no answer comes.
  virtual bool askIdentity(uint64_t epoch) = 0;
  // Sends the half-open calls: the debits of what fallback admitted (the
  // shares, and the rate leases spent while Redis was unreachable), charged
  // over fallback_span_ms (with state_lost the counts are cleared and
  // nothing is debited), the renewal of every holding, and the lease of
  // every holding's debt. master_changed (a new run_id: a promoted replica
  // or an empty restart) first ends every rate lease the node holds: the
  // new master may not know its last renewal. Tells the breaker of each
  // call with expect(epoch, 1) before it is sent, and of its answer or
  // failure with answered(epoch, now_ns).
  virtual void recover(uint64_t epoch, bool state_lost, bool master_changed,
                       int64_t fallback_span_ms) = 0;
};

class CircuitBreaker {
 public:
  struct Options {
    int64_t holding_memory_ns = 0;  // lease_ttl
    int64_t reconnect_ns = 0;       // the longest reconnect backoff
    int64_t state_version = kRedisStateVersion;  // what this node writes (redis_keys.h)
    std::string key_prefix = "sluice:";          // for the log line of a refusal
  };
  // `broker` shows the state to the workers; `rules` gives the current rule
  // set (for the fleet-wide end of learning). All outlive the breaker.
  CircuitBreaker(LeaseBroker& broker, BreakerActions& actions, Options options,
                 std::function<RuleSetPtr()> rules);
  CircuitBreaker(const CircuitBreaker&) = delete;
  CircuitBreaker& operator=(const CircuitBreaker&) = delete;

  // Redis became unreachable: open.
  void down(int64_t now_ns);
  // Redis answers again: half-open, and asks who it is.
  void up(int64_t now_ns);
  // INFO's answer for `epoch` (nullopt: no answer, or no run_id in it) and
  // the fleet marker's state version after the claim (nullopt: no answer;
  // 0: not a version). Another version than options.state_version refuses.
  void identified(uint64_t epoch, const std::optional<RedisIdentity>& identity, int64_t now_ns,
                  std::optional<int64_t> fleet_version = kRedisStateVersion);
  // The marker's state version from a closed breaker's claim: another
  // version (not 0, not nullopt: a failed claim changes nothing) refuses.
  void checked(std::optional<int64_t> fleet_version, int64_t now_ns);
  // A recovery call of `epoch` is about to be sent / was answered or failed.
  void expect(uint64_t epoch, size_t calls);
  void answered(uint64_t epoch, int64_t now_ns);
  // A cluster master took over slots it did not hold: learning mode.
  void newMaster(int64_t now_ns);

  Breaker state() const { return state_; }
  // Whether Redis is reachable (half-open or closed).
  bool redisUp() const { return state_ != Breaker::kOpen; }
  // Bumped by every down and up: the calls of an older one do not count.
  uint64_t epoch() const { return epoch_; }
  // Recovery calls (and the identity) not answered yet.
  size_t pending() const { return pending_; }
  // Whether the fleet marker names another state version than this node's
  // (the breaker is then half-open, asking again every heartbeat interval).
  bool refused() const { return refused_; }

 private:
  void publish(Breaker state, int64_t now_ns);
  void startLearning(int64_t now_ns);
  void closeWhenDone(int64_t now_ns);
  // Publishes the marker's version; false (logged, once per version) when
  // it refuses this node.
  bool admit(std::optional<int64_t> fleet_version);

  LeaseBroker& broker_;
  BreakerActions& actions_;
  const Options options_;
  std::function<RuleSetPtr()> rules_;
  Breaker state_ = Breaker::kOpen;
  uint64_t epoch_ = 0;
  size_t pending_ = 0;
  int64_t open_since_ns_ = 0;  // when the breaker last opened (0: never: the start)
  bool known_ = false;         // some INFO has been read
  RedisIdentity last_;         // of the Redis we last talked to
  bool master_changed_ = false;  // a new run_id seen since the last recovery
  bool refused_ = false;       // the marker names another version (or none)
  int64_t refused_by_ = -1;    // the marker's version last logged (0: none; -1: no refusal logged)
};

}  // namespace sluice
