// systemd integration through libsystemd: readiness, status, reload, stop
// and watchdog notifications (sd_notify) and socket activation
// (sd_listen_fds).
//
// Outside systemd (NOTIFY_SOCKET, WATCHDOG_USEC and LISTEN_FDS unset) every
// notification does nothing, watchdogIntervalUs() is 0 and takeListenSocket()
// finds nothing, so the daemon runs the same by hand, in tests and under
// other supervisors. Notifications may be sent from any thread;
// takeListenSocket() changes the environment: call it once, at start.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace sluice::systemd {

void notifyReady(std::string_view status);  // READY=1 and STATUS=
void notifyStatus(std::string_view status);
void notifyReloading();                     // RELOADING=1; notifyReady() when done
void notifyStopping();                      // STOPPING=1
void notifyWatchdog();                      // WATCHDOG=1

// The watchdog interval systemd set for this process (WatchdogSec=), in
// microseconds, or 0 when there is none.
uint64_t watchdogIntervalUs();

// The listening socket systemd passed (socket activation). Returns false with
// `error` when something unusable was passed (more than one socket, or not a
// listening Unix stream socket); true otherwise, with `*fd` the socket in
// non-blocking mode, or -1 when none was passed. `*path` is its address.
bool takeListenSocket(int* fd, std::string* path, std::string* error);

}  // namespace sluice::systemd
