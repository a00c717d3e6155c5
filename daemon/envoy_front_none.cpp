// Built without gRPC (SLUICE_GRPC=OFF): no Envoy front.
#include "envoy_front.h"

namespace sluice {

std::unique_ptr<EnvoyFront> makeEnvoyFront(DeadlineClock) { return nullptr; }

}  // namespace sluice
