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
#pragma once

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
  // time one is seen; `refused` (which outlives the front) counts the
  // descriptors whose override gets none (kMaxEnvoyOverrides).
  virtual bool start(const EnvoyConfig& envoy, uint32_t socket_mode, std::vector<Worker*> workers,
                     AddRule add_rule, Counter* refused, std::string* error) = 0;
  // Thread-safe: later calls use this policy (a reload).
  virtual void setConfig(const EnvoyConfig& envoy) = 0;
  // Stops listening and answers what is in flight (bounded); before the
  // workers stop.
  virtual void stop() = 0;
};

// nullptr when sluiced was built without gRPC (SLUICE_GRPC=OFF).
std::unique_ptr<EnvoyFront> makeEnvoyFront();

}  // namespace sluice
