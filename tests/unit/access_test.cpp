// Tests for access decisions (daemon/access.h): who may use the daemon, who
// is an admin, and the per-user connection cap. The credentials a real socket
// reports are tested against the daemon in tests/integration/access_test.py.
#include "access.h"

#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

namespace sluice {
namespace {

constexpr uid_t kDaemonUid = 998;
constexpr uid_t kAppUid = 1001;
constexpr uid_t kOtherUid = 1002;
constexpr gid_t kAppGid = 1001;
constexpr gid_t kClientsGid = 2000;
constexpr gid_t kAdminsGid = 3000;

Peer decide(const AccessConfig& config, uid_t uid, gid_t gid, std::vector<gid_t> groups = {}) {
  return Access(config, kDaemonUid).decide(42, uid, gid, groups);
}

// Verifies that without allow-lists anyone who connects may use the daemon,
// and only root and the daemon's own user are admins.
TEST(AccessTest, WithoutListsEveryoneIsAllowedAndOnlyRootAndTheDaemonAreAdmins) {
  AccessConfig open;
  Peer app = decide(open, kAppUid, kAppGid);
  EXPECT_TRUE(app.allowed);
  EXPECT_FALSE(app.admin);
  EXPECT_EQ(app.pid, 42);
  EXPECT_EQ(app.uid, kAppUid);
  for (uid_t trusted : {uid_t{0}, kDaemonUid}) {
    Peer peer = decide(open, trusted, 0);
    EXPECT_TRUE(peer.allowed) << trusted;
    EXPECT_TRUE(peer.admin) << trusted;
  }
}

// Verifies that with a users list only the listed uids (and root and the
// daemon's user) are allowed.
TEST(AccessTest, UsersListAllowsOnlyListedUids) {
  AccessConfig config;
  config.users = {kAppUid};
  EXPECT_TRUE(decide(config, kAppUid, kAppGid).allowed);
  EXPECT_FALSE(decide(config, kOtherUid, kAppGid).allowed);
  EXPECT_TRUE(decide(config, 0, 0).allowed);
  EXPECT_TRUE(decide(config, kDaemonUid, kDaemonUid).allowed);
}

// Verifies that a groups list admits members by primary or supplementary group.
TEST(AccessTest, GroupsListAdmitsPrimaryAndSupplementaryMembers) {
  AccessConfig config;
  config.groups = {kClientsGid};
  EXPECT_TRUE(decide(config, kOtherUid, kClientsGid).allowed);
  EXPECT_TRUE(decide(config, kOtherUid, kAppGid, {100, kClientsGid}).allowed);
  EXPECT_FALSE(decide(config, kOtherUid, kAppGid, {100, 101}).allowed);
  EXPECT_FALSE(decide(config, kOtherUid, kAppGid, {100, 101}).admin);
}

// Verifies that members of admin_group are admins, and so also allowed when
// the lists do not name them, while other allowed users are not admins.
TEST(AccessTest, AdminGroupMembersAreAdminsAndAllowed) {
  AccessConfig config;
  config.users = {kAppUid};
  config.admin_group = kAdminsGid;
  Peer admin = decide(config, kOtherUid, kAppGid, {kAdminsGid});
  EXPECT_TRUE(admin.admin);
  EXPECT_TRUE(admin.allowed);
  EXPECT_TRUE(decide(config, kOtherUid, kAdminsGid).admin);
  Peer app = decide(config, kAppUid, kAppGid, {kClientsGid});
  EXPECT_TRUE(app.allowed);
  EXPECT_FALSE(app.admin);
}

// Verifies that admit() reads the credentials of a real connected socket:
// this process's own.
TEST(AccessTest, AdmitReadsTheSocketsCredentials) {
  int fds[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, fds), 0);
  AccessConfig config;
  config.groups = {getegid()};
  Peer peer = Access(config, kDaemonUid).admit(fds[0]);
  EXPECT_EQ(peer.pid, getpid());
  EXPECT_EQ(peer.uid, geteuid());
  EXPECT_EQ(peer.gid, getegid());
  EXPECT_TRUE(peer.allowed);
  close(fds[0]);
  close(fds[1]);
}

// Verifies that credentials that cannot be read allow nothing.
TEST(AccessTest, UnreadableCredentialsAllowNothing) {
  Peer peer = Access(AccessConfig{}, kDaemonUid).admit(-1);
  EXPECT_FALSE(peer.allowed);
  EXPECT_FALSE(peer.admin);
}

// Verifies that the cap counts connections per uid, refuses one over it, and
// makes room again when one is released.
TEST(AccessTest, UserConnectionsCapEachUidApart) {
  UserConnections connections(2);
  Peer first{.uid = kAppUid};
  Peer second{.uid = kAppUid};
  Peer third{.uid = kAppUid};
  Peer other{.uid = kOtherUid};
  EXPECT_TRUE(connections.take(&first));
  EXPECT_TRUE(connections.take(&second));
  EXPECT_FALSE(connections.take(&third));
  EXPECT_EQ(third.user_slot, nullptr);
  EXPECT_TRUE(connections.take(&other));
  UserConnections::release(first);
  EXPECT_TRUE(connections.take(&third));
  EXPECT_FALSE(connections.take(&first));
}

// Verifies that without a cap nothing is counted and nothing is refused.
TEST(AccessTest, NoCapTakesEveryConnection) {
  UserConnections connections(0);
  for (int i = 0; i < 1000; ++i) {
    Peer peer{.uid = kAppUid};
    ASSERT_TRUE(connections.take(&peer));
    EXPECT_EQ(peer.user_slot, nullptr);
    UserConnections::release(peer);  // gives back nothing
  }
}

}  // namespace
}  // namespace sluice
