// EnvoyRls: a ShouldRateLimit request as the seam's questions, and their
// answers as a RateLimitResponse. Pure functions of (policy, request) and
// (plan, answers); any thread. The gRPC plumbing is envoy_front.cpp's.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "envoy/service/ratelimit/v3/rls.pb.h"
#include "envoy_policy.h"
#include "question.h"

namespace sluice {

using RateLimitRequest = envoy::service::ratelimit::v3::RateLimitRequest;
using RateLimitResponse = envoy::service::ratelimit::v3::RateLimitResponse;

// What a request asks: per descriptor, the limit it lands on (nullptr:
// unknown or unlimited, answered OK) and, for a limited one, its item.
struct EnvoyPlan {
  struct Descriptor {
    const EnvoyLimit* limit = nullptr;
    int item = -1;  // index into keys/costs when limited
    bool own_limit = false;  // limited by its own `limit` (an override rule)
  };
  std::vector<Descriptor> descriptors;
  // The limits of descriptors that carry their own (`limit`), each decided
  // on an override rule (envoyOverrideRule). Reserved for every descriptor
  // before the first is added, so that `limit` and `rules` may point into it.
  std::vector<EnvoyLimit> override_limits;
  // One per limited descriptor, in order: the rule (a view into the
  // policy, which the caller keeps alive with the plan, or into
  // override_limits), key and cost.
  std::vector<std::string_view> rules;
  std::vector<std::string> keys;
  std::vector<int64_t> costs;
};

// Whether the rule of a limit override may decide (it exists, or has just
// been added): called with the request's domain and the override's limit
// (rule, requests_per_unit and unit set). The caller's seam: the front
// adds the rule, up to kMaxEnvoyOverrides (envoy_front.h).
using AdmitOverride = std::function<bool(std::string_view domain, const EnvoyLimit& limit)>;

// Matches each descriptor (envoy_policy.h), drops the limits another
// matched limit `replaces`, and works out each cost: the descriptor's
// hits_addend when set, else the request's, else 1. A descriptor with its
// own `limit` (second to day, at least 1) is limited by it, as the
// reference server does, on the rule envoyOverrideRuleName names, keyed by
// its entries' keys and values; when `admit` refuses that rule, the
// descriptor is planned as if it had no `limit` (its configured limit, if
// any).
EnvoyPlan planRequest(const EnvoyPolicy& policy, const RateLimitRequest& request,
                      const AdmitOverride& admit);

// The name of the rule that decides a domain's descriptors of limit
// override (requests_per_unit, unit): "<domain>/=<requests_per_unit>/<unit>",
// the domain written by appendEnvoyNamePart; kEnvoyOverrideMark keeps it
// apart from every descriptor's rule, and the escaped domain from every
// other domain's.
std::string envoyOverrideRuleName(std::string_view domain, uint32_t requests_per_unit,
                                  EnvoyUnit unit);

// That rule, built with `options`.
Rule envoyOverrideRule(std::string_view domain, uint32_t requests_per_unit, EnvoyUnit unit,
                       const EnvoyRuleOptions& options);

// The plan's item i as a seam Item (views into the plan).
Item envoyItem(const EnvoyPlan& plan, size_t i);

// The outcome of one limited descriptor.
struct EnvoyOutcome {
  bool failed = false;  // the seam answered an error: counted as OK
  Decision decision;
};

// The response: per descriptor a status (OVER_LIMIT when its decision
// denied; OK otherwise, with current_limit, limit_remaining and
// duration_until_reset when limited), overall OVER_LIMIT when any is, and
// the draft-11 RateLimit and RateLimit-Policy response headers of the most
// restrictive limited descriptor (a denied one, else the fewest remaining).
void encodeResponse(const EnvoyPlan& plan, const std::vector<EnvoyOutcome>& outcomes,
                    RateLimitResponse* response);

}  // namespace sluice
