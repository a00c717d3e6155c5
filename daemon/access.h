// Access: who may use the daemon's socket and its admin methods, decided once
// per connection from the peer's kernel credentials and the [access] section.
//
// The kernel tells a Unix socket's server who connected: SO_PEERCRED gives
// the pid, uid and primary gid, SO_PEERGROUPS the supplementary groups. From
// them:
//  - root and the daemon's own user may always connect and call admin methods;
//  - anyone else may use the daemon when [access] `users` and `groups` are
//    both empty (the socket's mode is then the only gate), or when their uid
//    is in `users` or one of their groups is in `groups`. A peer that may not
//    is still accepted, and every request it sends is answered FORBIDDEN, so
//    its application logs why instead of seeing a closed connection;
//  - admin methods (`reload`) are for root, the daemon's user and the members
//    of `admin_group`, who may also use everything else;
//  - `max_connections_per_user` caps the connections one uid holds open; one
//    more is closed at once, as one over [limits] max_connections is, so a
//    user (refused or not) cannot take every connection of the daemon.
//
// Thread-safety: an Access is immutable once built and is used on the main
// loop. UserConnections is counted up on the main loop and down from any
// worker thread; its counters are atomics in map nodes that never move.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <unordered_map>
#include <vector>

#include "config.h"

namespace sluice {

// Who is on the other end of a connection, and what it may do.
struct Peer {
  pid_t pid = 0;
  uid_t uid = static_cast<uid_t>(-1);  // (uid_t)-1: the kernel did not say
  gid_t gid = static_cast<gid_t>(-1);
  bool allowed = false;  // may use the daemon; otherwise every request is FORBIDDEN
  bool admin = false;    // may call admin methods
  // The connection this peer's uid holds against max_connections_per_user;
  // null when there is no such cap. Given back by UserConnections::release.
  std::atomic<uint32_t>* user_slot = nullptr;
};

class Access {
 public:
  // `daemon_uid` is the user the daemon runs as (geteuid()).
  Access(const AccessConfig& config, uid_t daemon_uid);

  // Reads the credentials of the connected socket `fd` and decides; a peer
  // whose credentials cannot be read is neither allowed nor admin.
  Peer admit(int fd) const;

  // The decision for given credentials; `groups` are the supplementary ones.
  Peer decide(pid_t pid, uid_t uid, gid_t gid, const std::vector<gid_t>& groups) const;

 private:
  AccessConfig config_;
  uid_t daemon_uid_;
};

// Connections held open per uid, for max_connections_per_user.
class UserConnections {
 public:
  explicit UserConnections(uint32_t max_per_user) : max_per_user_(max_per_user) {}

  // Main loop: takes a connection for `peer`'s uid and records it in
  // peer->user_slot; false when the uid already holds max_per_user (the
  // caller closes the connection). Always true without a cap.
  bool take(Peer* peer);

  // Any thread: gives back what take() recorded in `peer`, if anything.
  static void release(const Peer& peer);

 private:
  uint32_t max_per_user_;  // 0: no cap
  std::unordered_map<uid_t, std::atomic<uint32_t>> open_;  // main loop inserts only
};

}  // namespace sluice
