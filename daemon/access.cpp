// Access: the decision on a connection's credentials, and per-user counts.
#include "access.h"

#include <sys/socket.h>

#include <algorithm>
#include <cerrno>

namespace sluice {

namespace {

// Supplementary groups most users have fewer of; more are read in a second call.
constexpr size_t kUsualGroups = 64;

// The supplementary groups of the peer of `fd` (SO_PEERGROUPS); empty when
// the kernel does not say.
std::vector<gid_t> peerGroups(int fd) {
  std::vector<gid_t> groups(kUsualGroups);
  socklen_t len = static_cast<socklen_t>(groups.size() * sizeof(gid_t));
  if (getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, groups.data(), &len) != 0) {
    if (errno != ERANGE) return {};
    groups.resize(len / sizeof(gid_t));  // the kernel wrote back the size it needs
    if (getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, groups.data(), &len) != 0) return {};
  }
  groups.resize(len / sizeof(gid_t));
  return groups;
}

bool contains(const std::vector<uint32_t>& ids, uint32_t id) {
  return std::find(ids.begin(), ids.end(), id) != ids.end();
}

// True when `wanted` is the primary group `gid` or one of `groups`.
bool inGroup(gid_t wanted, gid_t gid, const std::vector<gid_t>& groups) {
  return gid == wanted || contains(groups, wanted);
}

}  // namespace

Access::Access(const AccessConfig& config, uid_t daemon_uid)
    : config_(config), daemon_uid_(daemon_uid) {}

Peer Access::admit(int fd) const {
  ucred cred{};
  socklen_t len = sizeof(cred);
  if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
    return Peer{};
  }
  bool needs_groups = !config_.groups.empty() || config_.admin_group >= 0;
  return decide(cred.pid, cred.uid, cred.gid, needs_groups ? peerGroups(fd) : std::vector<gid_t>{});
}

Peer Access::decide(pid_t pid, uid_t uid, gid_t gid, const std::vector<gid_t>& groups) const {
  Peer peer{.pid = pid, .uid = uid, .gid = gid};
  bool trusted = uid == 0 || uid == daemon_uid_;
  bool listed = contains(config_.users, uid) ||
                std::any_of(config_.groups.begin(), config_.groups.end(),
                            [&](uint32_t wanted) { return inGroup(wanted, gid, groups); });
  bool open_to_all = config_.users.empty() && config_.groups.empty();
  peer.admin = trusted || (config_.admin_group >= 0 &&
                           inGroup(static_cast<gid_t>(config_.admin_group), gid, groups));
  peer.allowed = peer.admin || open_to_all || listed;
  return peer;
}

bool UserConnections::take(Peer* peer) {
  if (max_per_user_ == 0) return true;
  std::atomic<uint32_t>& open = open_.try_emplace(peer->uid, 0).first->second;
  // Only this thread counts up, so the check and the increment cannot race
  // with another take(); a release() meanwhile only makes room.
  if (open.load(std::memory_order_relaxed) >= max_per_user_) return false;
  open.fetch_add(1, std::memory_order_relaxed);
  peer->user_slot = &open;
  return true;
}

void UserConnections::release(const Peer& peer) {
  if (peer.user_slot != nullptr) peer.user_slot->fetch_sub(1, std::memory_order_relaxed);
}

}  // namespace sluice
