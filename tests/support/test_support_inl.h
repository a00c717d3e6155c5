// Template definitions for test_support.h.
#pragma once

#include <chrono>
#include <thread>

namespace sluice::test {

template <typename Predicate>
bool waitFor(int timeout_ms, Predicate predicate) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (!predicate()) {
    if (std::chrono::steady_clock::now() >= deadline) {
      return false;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

}  // namespace sluice::test
