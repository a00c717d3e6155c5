// EnvoyFront: Envoy's rate limit service
// (envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit) and
// grpc.health.v1.Health, over gRPC, on [envoy] listen.
//
// A thin front over the decision seam (question.h): each request
// descriptor is matched against the YAML policy (envoy_policy.h); those
// that land on a limit become Items of rule (the descriptor's rule) and key
// (its values), cost hits_addend. By default each is asked as its own
// acquire and the results ORed, as the reference server spends every
// matching descriptor; with all_or_nothing they are one acquire_all, so a
// denied request spends nothing. Each question is decided on the gRPC
// thread that read the call, on a worker's lane (Worker::decideOnLane: the
// worker's second dispatcher, free when no other thread is on it), so a
// call answered at once costs no hop to a worker's loop and back; when
// every lane is busy it goes to a worker with Worker::submit, and one that
// waits (a cold key's lease) is answered on the worker's thread. The last
// answer encodes the RateLimitResponse (envoy_rls.h) and finishes the call.
//
// The calls are read by [envoy] threads polling threads of the front's own
// (gRPC's async API; envoy_front.cpp says why), which also answer
// grpc.health.v1.Health's Check; nothing here blocks them: the lanes are
// taken with try_lock.
// An error answer (a rule gone in a reload, a full key table) is answered
// OK, never an error Envoy would turn into its failure mode, and logged.
//
// Deadlines and backlogs: Envoy sends each call with `grpc-timeout` (20 ms
// by default) and gives up on it then. A call whose deadline has passed
// when the front reads it is finished DEADLINE_EXCEEDED without a
// decision, so it spends nothing, and counted
// (sluice_envoy_deadline_exceeded_total): a front that fell behind drains
// its backlog at a fraction of a decision's cost instead of spending units
// for calls nobody waits for. A connection holds at most
// kMaxCallsPerConnection calls at once (HTTP/2's
// SETTINGS_MAX_CONCURRENT_STREAMS); the client queues the rest, where its
// own deadline ends them, so the calls gRPC holds for the front stay few
// however far a client outruns it.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "config.h"
#include "metrics.h"

namespace sluice {

class Worker;

// At most this many distinct limit overrides (domain, requests_per_unit,
// unit) get a rule, whatever domains clients send, and only for domains of
// at most kMaxEnvoyOverrideDomainBytes: the rules and their series on
// /metrics stay bounded. A descriptor with an override refused is decided
// as if it had no `limit` (its configured limit, else OK), counted
// (sluice_envoy_overrides_refused_total) and logged at most once a minute.
constexpr size_t kMaxEnvoyOverrides = 256;
constexpr size_t kMaxEnvoyOverrideDomainBytes = 256;

// Calls (HTTP/2 streams) one client connection may have open at once: the
// smallest value HTTP/2 recommends (RFC 9113, 6.5.2). Envoy queues calls
// past it (and opens connections, within its circuit breakers). Without a
// bound a client sending faster than the front answers has all its calls
// open in gRPC at once, and gRPC's cost a call grows with them: at 40,000
// paced calls/s the front answered under 2,000 calls/s and went on
// deciding the abandoned calls for seconds after the client hung up
// (bench/results/rls.md).
constexpr int kMaxCallsPerConnection = 100;

// The clock a call's deadline is compared with: gRPC gives the deadline as
// a std::chrono::system_clock time point (what is left of `grpc-timeout`,
// converted at the asking), so this is system_clock::now in the daemon; a
// test sets it ahead to make every deadline passed. Called on the polling
// threads.
using DeadlineClock = std::function<std::chrono::system_clock::time_point()>;

// What the front counts on /metrics; the counters outlive the front.
struct EnvoyCounters {
  Counter* overrides_refused = nullptr;  // descriptors whose override got no rule
  Counter* deadline_exceeded = nullptr;  // calls finished DEADLINE_EXCEEDED, undecided
};

// Adds a rule to the running rule set (Server::addRule); false when it
// cannot (stopping). Thread-safe; the workers have the rule when it returns.
using AddRule = std::function<bool(const Rule&)>;

class EnvoyFront {
 public:
  virtual ~EnvoyFront() = default;
  // Listens on envoy.listen and serves, handing calls to `workers` in turn
  // (they outlive the front); a Unix socket gets `socket_mode` ([daemon]
  // socket_mode), so that Envoy's user can connect as apps do. false with
  // `error` when it cannot listen.
  // `add_rule` installs the rule of a descriptor's limit override the first
  // time one is seen; `counters.overrides_refused` counts the descriptors
  // whose override gets none (kMaxEnvoyOverrides).
  virtual bool start(const EnvoyConfig& envoy, uint32_t socket_mode, std::vector<Worker*> workers,
                     AddRule add_rule, EnvoyCounters counters, std::string* error) = 0;
  // Thread-safe: later calls use this policy (a reload).
  virtual void setConfig(const EnvoyConfig& envoy) = 0;
  // Stops listening and answers what is in flight (bounded); before the
  // workers stop.
  virtual void stop() = 0;
};

// nullptr when sluiced was built without gRPC (SLUICE_GRPC=OFF). Deadlines
// are read on `clock` (system_clock::now when empty).
std::unique_ptr<EnvoyFront> makeEnvoyFront(DeadlineClock clock = {});

}  // namespace sluice
