// systemd integration; see systemd.h.
#include "systemd.h"

#include <fcntl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <systemd/sd-daemon.h>

#include <cerrno>
#include <cstddef>
#include <cstring>
#include <ctime>

namespace sluice::systemd {

namespace {

void notify(const std::string& state) { sd_notify(0, state.c_str()); }

// One line, as STATUS= takes it.
std::string statusLine(std::string_view status) {
  std::string line(status);
  for (char& c : line) {
    if (c == '\n') c = ' ';
  }
  return line;
}

}  // namespace

void notifyReady(std::string_view status) { notify("READY=1\nSTATUS=" + statusLine(status)); }

void notifyStatus(std::string_view status) { notify("STATUS=" + statusLine(status)); }

void notifyReloading() {
  // MONOTONIC_USEC lets systemd (Type=notify-reload) match READY=1 to it.
  timespec now{};
  clock_gettime(CLOCK_MONOTONIC, &now);
  uint64_t usec = static_cast<uint64_t>(now.tv_sec) * 1'000'000 + static_cast<uint64_t>(now.tv_nsec) / 1000;
  notify("RELOADING=1\nMONOTONIC_USEC=" + std::to_string(usec));
}

void notifyStopping() { notify("STOPPING=1"); }

void notifyWatchdog() { notify("WATCHDOG=1"); }

uint64_t watchdogIntervalUs() {
  uint64_t usec = 0;
  return sd_watchdog_enabled(0, &usec) > 0 ? usec : 0;
}

bool takeListenSocket(int* fd, std::string* path, std::string* error) {
  *fd = -1;
  path->clear();
  int count = sd_listen_fds(1);  // 1: later children see no LISTEN_FDS
  if (count < 0) {
    *error = std::string("socket activation: ") + std::strerror(-count);
    return false;
  }
  if (count == 0) return true;
  if (count > 1) {
    *error = "socket activation passed " + std::to_string(count) +
             " sockets; sluiced serves one: give sluiced.socket one ListenStream=";
    return false;
  }
  int passed = SD_LISTEN_FDS_START;
  if (sd_is_socket_unix(passed, SOCK_STREAM, 1, nullptr, 0) <= 0) {
    *error = "socket activation passed a socket that is not a listening Unix stream socket; "
             "give sluiced.socket a ListenStream= with a path";
    return false;
  }
  int flags = fcntl(passed, F_GETFL);
  if (flags < 0 || fcntl(passed, F_SETFL, flags | O_NONBLOCK) != 0 ||
      fcntl(passed, F_SETFD, FD_CLOEXEC) != 0) {
    *error = std::string("socket activation: cannot set up the passed socket: ") + std::strerror(errno);
    return false;
  }
  sockaddr_un addr{};
  socklen_t len = sizeof(addr);
  if (getsockname(passed, reinterpret_cast<sockaddr*>(&addr), &len) == 0 &&
      len > offsetof(sockaddr_un, sun_path)) {
    path->assign(addr.sun_path, strnlen(addr.sun_path, len - offsetof(sockaddr_un, sun_path)));
  }
  *fd = passed;
  return true;
}

}  // namespace sluice::systemd
