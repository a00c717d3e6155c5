// envoy_request_fuzz: any bytes as a ShouldRateLimit request (what gRPC
// hands the front once they parse), planned against a fixed policy and
// encoded with every decision allowed, then every one denied.
//
// Properties checked: one status per descriptor, an item only for a
// limited descriptor and a cost within uint32, and an overall code of
// OVER_LIMIT exactly when a status is.
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>

#include "envoy_rls.h"
#include "fuzz_check.h"

namespace {

const sluice::EnvoyPolicy& policy() {
  static const sluice::EnvoyPolicy* built = [] {
    auto* out = new sluice::EnvoyPolicy();
    const std::string error = sluice::readEnvoyYaml(R"(
domain: web
descriptors:
  - key: a
    rate_limit: {unit: second, requests_per_unit: 5}
    descriptors:
      - key: b
        value: x*
        rate_limit: {unit: minute, requests_per_unit: 2}
  - key: c
    value: y
    unlimited: true
  - key: d
    name: d
    rate_limit: {unit: hour, requests_per_unit: 1}
  - key: e
    rate_limit: {unit: day, requests_per_unit: 9}
    replaces: [{name: d}]
)",
                                                    "fuzz.yaml", {}, out);
    FUZZ_CHECK(error.empty(), "the fixed policy loads");
    return out;
  }();
  return *built;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace sluice;
  RateLimitRequest request;
  if (!request.ParseFromArray(data, static_cast<int>(size))) return 0;
  // Every other limit override is refused its rule (the bound of envoy_front.h).
  size_t overrides = 0;
  const EnvoyPlan plan = planRequest(policy(), request, [&](std::string_view, const EnvoyLimit&) {
    return overrides++ % 2 == 0;
  });
  FUZZ_CHECK(plan.descriptors.size() == static_cast<size_t>(request.descriptors_size()),
             "one planned descriptor per descriptor");
  FUZZ_CHECK(plan.rules.size() == plan.keys.size() && plan.keys.size() == plan.costs.size(),
             "items are whole");
  for (const EnvoyPlan::Descriptor& planned : plan.descriptors) {
    FUZZ_CHECK(planned.item < 0 || (planned.limit != nullptr && !planned.limit->unlimited),
               "an item only for a limited descriptor");
  }
  for (int64_t cost : plan.costs) {
    FUZZ_CHECK(cost >= 0 && cost <= std::numeric_limits<uint32_t>::max(), "a cost fits uint32");
  }
  for (bool allowed : {true, false}) {
    std::vector<EnvoyOutcome> outcomes(plan.rules.size());
    for (EnvoyOutcome& outcome : outcomes) {
      outcome.decision.allowed = allowed;
      outcome.decision.remaining = allowed ? 1 : 0;
      outcome.decision.reset_after_ms = 1500;
    }
    RateLimitResponse response;
    encodeResponse(plan, outcomes, &response);
    FUZZ_CHECK(response.statuses_size() == request.descriptors_size(), "one status per descriptor");
    bool over = false;
    for (const auto& status : response.statuses()) {
      over = over || status.code() == RateLimitResponse::OVER_LIMIT;
    }
    FUZZ_CHECK(over == (response.overall_code() == RateLimitResponse::OVER_LIMIT),
               "overall is OVER_LIMIT exactly when a status is");
    FUZZ_CHECK(over == (!allowed && !plan.rules.empty()), "denials show as OVER_LIMIT");
  }
  return 0;
}
