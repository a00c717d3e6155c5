// The libuv handles open on a loop, for health's "handles" (each loop counts
// its own before it runs and then on a timer of its own): a daemon under
// steady load holds a steady number (listeners, timers, async wakeups, one
// pipe per connection, the Redis links' sockets and timers), so a count that
// grows is a leak of handles that the fd count would not show (timers) or
// would show late.
#pragma once

#include <uv.h>

#include <cstddef>

namespace sluice {

// Handles of `loop` that are not closing, active or not. Walks them all, so
// call it from the loop's own thread, at most every few hundred milliseconds.
inline size_t openHandles(uv_loop_t* loop) {
  size_t open = 0;
  uv_walk(
      loop,
      [](uv_handle_t* handle, void* count) {
        if (!uv_is_closing(handle)) ++*static_cast<size_t*>(count);
      },
      &open);
  return open;
}

}  // namespace sluice
