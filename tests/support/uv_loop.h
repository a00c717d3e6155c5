// Test support for code driven by a libuv loop: run the loop until a
// condition holds, with a guard timer instead of a sleep. Header-only, so
// that test_support itself needs no libuv.
#pragma once

#include <uv.h>

#include <cstdint>
#include <functional>

namespace sluice::test {

// Runs `loop` until `done()` holds or timeout_ms passes; returns done(). The
// guard timer is closed again before returning, so the loop can be closed.
inline bool runLoopUntil(uv_loop_t* loop, const std::function<bool()>& done, int timeout_ms) {
  bool expired = false;
  uv_timer_t guard;
  uv_timer_init(loop, &guard);
  guard.data = &expired;
  uv_timer_start(
      &guard, [](uv_timer_t* timer) { *static_cast<bool*>(timer->data) = true; },
      static_cast<uint64_t>(timeout_ms), 0);
  while (!done() && !expired) uv_run(loop, UV_RUN_ONCE);
  bool closed = false;
  guard.data = &closed;
  uv_close(reinterpret_cast<uv_handle_t*>(&guard),
           [](uv_handle_t* handle) { *static_cast<bool*>(handle->data) = true; });
  while (!closed) uv_run(loop, UV_RUN_NOWAIT);
  return done();
}

}  // namespace sluice::test
