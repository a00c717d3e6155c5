// Integration: the real sluiced, driven through libsluice and sluicectl.
//
// Each test starts its own daemon (SLUICED, set by ctest) on a socket in a
// short temporary directory and stops it at the end; nothing is shared.
#include <signal.h>
#include <sys/wait.h>

#include <cstdio>
#include <memory>
#include <set>
#include <string>

#include <gtest/gtest.h>

#include "sluice.h"
#include "test_support.h"

namespace sluice::test {
namespace {

constexpr int kTimeoutMs = 5000;

constexpr const char* kRules = R"(
[[rule]]
name = "five"
algorithm = "token_bucket"
limit = 5
period = "1s"
burst = 5

[[rule]]
name = "window"
algorithm = "fixed_window"
limit = 1000000
period = "1h"

[[rule]]
name = "slow"
algorithm = "sliding_window"
limit = 2
period = "1h"

[[rule]]
name = "capped"
algorithm = "fixed_window"
limit = 1000
period = "1h"
max_debt = 100
)";

class DaemonTest : public ::testing::Test {
 protected:
  void SetUp() override { start(); }

  void start() {
    socket_ = dir_.file("s.sock");
    config_ = dir_.file("sluice.toml");
    writeFile(config_, "[daemon]\nsocket = \"" + socket_ +
                           "\"\nworkers = 2\nlog_level = \"info\"\n" + kRules);
    daemon_ = std::make_unique<Child>(
        std::vector<std::string>{sluicedPath(), "--config", config_}, dir_.file("log"));
    ASSERT_TRUE(waitFor(10'000, [&] { return connectClient() == 0; })) << readFile(dir_.file("log"));
  }

  int connectClient() {
    sluice_destroy(client_);
    client_ = nullptr;
    return sluice_connect(socket_.c_str(), kTimeoutMs, &client_);
  }

  void TearDown() override { sluice_destroy(client_); }

  sluice_decision acquire(const char* rule, const std::string& key, uint32_t cost = 1) {
    sluice_decision decision{};
    int rc = sluice_acquire(client_, rule, key.data(), key.size(), cost, kTimeoutMs, &decision);
    EXPECT_EQ(rc, 0) << sluice_strerror(rc);
    return decision;
  }

  // Runs sluicectl with `args`; returns its exit code and fills *output.
  int sluicectl(const std::string& args, std::string* output) {
    std::string command = sluicectlPath() + " --socket " + socket_ + " " + args + " 2>&1";
    FILE* pipe = popen(command.c_str(), "r");
    char buffer[4096];
    size_t n;
    output->clear();
    while ((n = fread(buffer, 1, sizeof(buffer), pipe)) > 0) {
      output->append(buffer, n);
    }
    int status = pclose(pipe);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }

  TempDir dir_;
  std::string socket_;
  std::string config_;
  std::unique_ptr<Child> daemon_;
  sluice_client* client_ = nullptr;
};

// Verifies DESIGN's contract through libsluice: exactly 5 of 20 back-to-back.
TEST_F(DaemonTest, FivePerSecondAllowsFiveOfTwentyThroughLibsluice) {
  int allowed = 0;
  for (int i = 0; i < 20; ++i) {
    sluice_decision decision = acquire("five", "contract");
    allowed += decision.allowed;
    EXPECT_EQ(decision.limit, 5);
    EXPECT_EQ(decision.mode, SLUICE_MODE_LOCAL);
    if (!decision.allowed) {
      EXPECT_GT(decision.retry_after_ms, 0);
      EXPECT_LE(decision.retry_after_ms, 200);
    }
  }
  EXPECT_EQ(allowed, 5);
}

// Verifies an unknown rule surfaces as the daemon's UNKNOWN_RULE error.
// A settle past the key's max_debt charges the debt up to it and reports
// the rest as unpaid, through libsluice and through sluicectl.
TEST_F(DaemonTest, ASettlePastTheDebtBoundReportsWhatItLeftUnpaid) {
  sluice_decision d{};
  uint64_t id = 0;
  ASSERT_EQ(sluice_reserve(client_, "capped", "runaway", 7, 1000, 30000, kTimeoutMs, &d, &id), 0);
  ASSERT_NE(id, 0u);
  int64_t refunded = -1;
  int64_t debt = -1;
  int64_t unpaid = -1;
  ASSERT_EQ(sluice_settle_with_unpaid(client_, id, 1500, kTimeoutMs, &d, &refunded, &debt, &unpaid),
            0);
  EXPECT_EQ(refunded, 0);
  EXPECT_EQ(debt, 100);
  EXPECT_EQ(unpaid, 400);
  EXPECT_EQ(d.remaining, -100);

  ASSERT_EQ(sluice_reserve(client_, "window", "fine", 4, 10, 30000, kTimeoutMs, &d, &id), 0);
  ASSERT_EQ(sluice_settle_with_unpaid(client_, id, 15, kTimeoutMs, &d, nullptr, &debt, &unpaid), 0);
  EXPECT_EQ(debt, 5);
  EXPECT_EQ(unpaid, 0);

  std::string output;
  ASSERT_EQ(sluice_reserve(client_, "capped", "shell", 5, 1000, 30000, kTimeoutMs, &d, &id), 0);
  EXPECT_EQ(sluicectl("--json settle " + std::to_string(id) + " 1300", &output), 0) << output;
  EXPECT_NE(output.find("\"debt\":100,\"unpaid\":200"), std::string::npos) << output;
}

TEST_F(DaemonTest, UnknownRuleIsAServerError) {
  sluice_decision decision{};
  int rc = sluice_acquire(client_, "nope", "k", 1, 1, kTimeoutMs, &decision);
  EXPECT_EQ(rc, SLUICE_ESERVER);
  EXPECT_STREQ(sluice_server_error_code(client_), "UNKNOWN_RULE");
}

// Verifies many pipelined requests on one connection are each answered once.
TEST_F(DaemonTest, PipelinedRequestsAreEachAnsweredOnce) {
  constexpr int kRequests = 5000;
  std::set<uint32_t> sent;
  for (int i = 0; i < kRequests; ++i) {
    uint32_t msgid = 0;
    std::string key = "p";
    key += std::to_string(i % 7);  // not "p" + ...: GCC 12 -O3 warns falsely (-Wrestrict)
    ASSERT_EQ(sluice_send_acquire(client_, "window", key.data(), key.size(), 1, &msgid), 0);
    sent.insert(msgid);
  }
  std::set<uint32_t> answered;
  while (sluice_in_flight(client_) > 0) {
    sluice_response response{};
    ASSERT_EQ(sluice_recv(client_, kTimeoutMs, &response), 0);
    EXPECT_EQ(response.status, 0);
    EXPECT_TRUE(response.decision.allowed);
    EXPECT_TRUE(answered.insert(response.msgid).second) << "answered twice: " << response.msgid;
  }
  EXPECT_EQ(answered, sent);
}

// Verifies acquire_all spends nothing when one item denies.
TEST_F(DaemonTest, AcquireAllSpendsNothingOnDenial) {
  acquire("slow", "full");
  acquire("slow", "full");
  sluice_item items[2] = {{"five", "a", 1, 3}, {"slow", "full", 4, 1}};
  int all_allowed = -1;
  sluice_decision results[2];
  ASSERT_EQ(sluice_acquire_all(client_, items, 2, kTimeoutMs, &all_allowed, results), 0);
  EXPECT_EQ(all_allowed, 0);
  EXPECT_FALSE(results[1].allowed);
  sluice_decision peeked{};
  ASSERT_EQ(sluice_peek(client_, "five", "a", 1, kTimeoutMs, &peeked), 0);
  EXPECT_EQ(peeked.remaining, 5);
}

// Verifies the client reconnects by itself after the daemon restarts, and
// the restarted daemon serves it.
TEST_F(DaemonTest, ClientReconnectsAfterDaemonRestart) {
  EXPECT_TRUE(acquire("five", "r").allowed);
  daemon_->signal(SIGTERM);
  ASSERT_NE(daemon_->wait(10'000), -1);
  daemon_ = std::make_unique<Child>(
      std::vector<std::string>{sluicedPath(), "--config", config_}, dir_.file("log2"));
  sluice_decision decision{};
  // The first call may find the old connection dead and report it; the
  // reconnection rule lets the next one through on a fresh connection.
  bool served = waitFor(10'000, [&] {
    return sluice_acquire(client_, "five", "r", 1, 1, 1000, &decision) == 0;
  });
  EXPECT_TRUE(served);
  EXPECT_EQ(decision.remaining, 4);  // a restarted daemon starts from fresh state
}

// Verifies SIGTERM closes every handle and exits 0 (the loop closes cleanly).
TEST_F(DaemonTest, SigtermExitsZeroWithEveryHandleClosed) {
  EXPECT_TRUE(acquire("five", "bye").allowed);
  daemon_->signal(SIGTERM);
  int status = daemon_->wait(10'000);
  ASSERT_NE(status, -1);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
  std::string log = readFile(dir_.file("log"));
  EXPECT_EQ(log.find("handles still open"), std::string::npos) << log;
  EXPECT_NE(log.find("stopped"), std::string::npos) << log;
}

// Verifies sluicectl decides, exits by outcome and prints JSON on request.
TEST_F(DaemonTest, SluicectlAcquireExitsByOutcome) {
  std::string output;
  EXPECT_EQ(sluicectl("acquire slow ctl", &output), 0) << output;
  EXPECT_NE(output.find("allowed"), std::string::npos) << output;
  EXPECT_EQ(sluicectl("acquire slow ctl", &output), 0) << output;
  EXPECT_EQ(sluicectl("acquire slow ctl", &output), 1) << output;
  // peek is acquire with cost 0: allowed, and it shows nothing is left.
  EXPECT_EQ(sluicectl("--json peek slow ctl", &output), 0) << output;
  EXPECT_NE(output.find("\"remaining\":0"), std::string::npos) << output;
  EXPECT_EQ(sluicectl("acquire nope ctl", &output), 3) << output;
  EXPECT_NE(output.find("UNKNOWN_RULE"), std::string::npos) << output;
}

// Verifies sluicectl acquire_all: all or nothing over RULE KEY COST items,
// exit 0 when all pass, 1 when one is denied (and then nothing is spent).
TEST_F(DaemonTest, SluicectlAcquireAllIsAllOrNothing) {
  // Rules that do not refill within the test (a slow run must not see a
  // unit come back between two calls).
  std::string output;
  EXPECT_EQ(sluicectl("acquire_all window all 2 slow all 1", &output), 0) << output;
  EXPECT_EQ(output.rfind("allowed\n", 0), 0u) << output;
  EXPECT_NE(output.find("  1: allowed  remaining=999998 limit=1000000"), std::string::npos)
      << output;
  EXPECT_NE(output.find("  2: allowed  remaining=1 limit=2"), std::string::npos) << output;
  // slow has 1 left: asking for 2 denies the whole call, and window keeps
  // its 999998.
  EXPECT_EQ(sluicectl("--json acquire_all window all 1 slow all 2", &output), 1) << output;
  EXPECT_EQ(output.rfind("{\"allowed\":false,\"results\":[{\"allowed\":true,\"remaining\":", 0), 0u)
      << output;
  EXPECT_EQ(sluicectl("--json peek window all", &output), 0) << output;
  EXPECT_NE(output.find("\"remaining\":999998"), std::string::npos) << output;
}

// Verifies sluicectl's usage errors say what was wrong and give the
// command's synopsis, not the whole help, and that a cost out of range says
// its range rather than "not a whole number".
TEST_F(DaemonTest, SluicectlUsageErrorsAreShortAndSpecific) {
  std::string output;
  EXPECT_EQ(sluicectl("acquire five k 2000000000", &output), 2) << output;
  EXPECT_EQ(output,
            "sluicectl: acquire: COST must be at most 1000000000\n"
            "usage: sluicectl [OPTIONS] acquire RULE KEY [COST]\n"
            "Try 'sluicectl --help' for the commands and options.\n");
  EXPECT_EQ(sluicectl("acquire five k one", &output), 2) << output;
  EXPECT_NE(output.find("COST must be a whole number, e.g. 1"), std::string::npos) << output;
  EXPECT_EQ(sluicectl("acquire_all five k", &output), 2) << output;
  EXPECT_NE(output.find("expected items of three words"), std::string::npos) << output;
  EXPECT_EQ(sluicectl("frobnicate", &output), 2) << output;
  EXPECT_EQ(output, "sluicectl: unknown command 'frobnicate'\n"
                    "Try 'sluicectl --help' for the commands and options.\n");
  EXPECT_EQ(output.find("commands:"), std::string::npos) << output;
}

// Verifies reset through libsluice and sluicectl (the test runs as root, an
// admin): a spent key is fresh again, and other keys keep their state.
TEST_F(DaemonTest, ResetMakesASpentKeyFreshAgain) {
  acquire("slow", "spent");
  acquire("slow", "spent");
  acquire("slow", "other");
  EXPECT_FALSE(acquire("slow", "spent").allowed);
  sluice_decision fresh{};
  ASSERT_EQ(sluice_reset(client_, "slow", "spent", 5, kTimeoutMs, &fresh), 0);
  EXPECT_EQ(fresh.remaining, 2);
  EXPECT_TRUE(acquire("slow", "spent").allowed);
  EXPECT_EQ(acquire("slow", "other").remaining, 0);  // untouched: 1 + 1 of 2

  std::string output;
  EXPECT_EQ(sluicectl("--json reset slow other", &output), 0) << output;
  EXPECT_NE(output.find("\"remaining\":2"), std::string::npos) << output;
  EXPECT_TRUE(acquire("slow", "other").allowed);
  EXPECT_EQ(sluicectl("reset nope k", &output), 3) << output;
  EXPECT_NE(output.find("UNKNOWN_RULE"), std::string::npos) << output;
}

// Verifies sluicectl shows health, stats and rules from the daemon.
TEST_F(DaemonTest, SluicectlShowsHealthStatsAndRules) {
  std::string output;
  EXPECT_EQ(sluicectl("health", &output), 0) << output;
  EXPECT_NE(output.find("\"redis\""), std::string::npos) << output;
  EXPECT_EQ(sluicectl("--json stats", &output), 0) << output;
  EXPECT_NE(output.find("\"decisions\""), std::string::npos) << output;
  EXPECT_EQ(sluicectl("--json rules", &output), 0) << output;
  EXPECT_NE(output.find("\"sliding_window\""), std::string::npos) << output;
}

// Verifies SIGHUP reloads rules, keeps the state of unchanged rules and
// drops the state of changed ones.
TEST_F(DaemonTest, SighupReloadsRulesAndKeepsUnchangedState) {
  acquire("slow", "kept");
  acquire("five", "changed");
  std::string changed = kRules;
  changed.replace(changed.find("limit = 5\n"), 10, "limit = 6\n");
  changed += "\n[[rule]]\nname = \"added\"\nlimit = 1\nperiod = \"1h\"\n";
  writeFile(config_,
            "[daemon]\nsocket = \"" + socket_ + "\"\nworkers = 2\n" + changed);
  daemon_->signal(SIGHUP);
  sluice_decision decision{};
  ASSERT_TRUE(waitFor(5000, [&] {
    return sluice_peek(client_, "added", "x", 1, kTimeoutMs, &decision) == 0;
  }));
  ASSERT_EQ(sluice_peek(client_, "slow", "kept", 4, kTimeoutMs, &decision), 0);
  EXPECT_EQ(decision.remaining, 1);
  ASSERT_EQ(sluice_peek(client_, "five", "changed", 7, kTimeoutMs, &decision), 0);
  EXPECT_EQ(decision.limit, 6);
  EXPECT_EQ(decision.remaining, 5);  // burst stays 5; the changed rule starts afresh
}

// Verifies a bad file on SIGHUP is refused and the old rules stay.
TEST_F(DaemonTest, SighupWithBadFileKeepsOldRules) {
  writeFile(config_, "[[rule]]\nname = \"five\"\nlimit = -1\n");
  daemon_->signal(SIGHUP);
  ASSERT_TRUE(waitFor(5000, [&] {
    return readFile(dir_.file("log")).find("reload refused") != std::string::npos;
  }));
  EXPECT_TRUE(acquire("five", "still").allowed);
}

}  // namespace
}  // namespace sluice::test
