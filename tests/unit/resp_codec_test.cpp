// The Redis protocol front's codec (resp_codec.h): RESP2 commands in,
// Commands and replies out, without sockets.
#include "resp_codec.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace sluice::resp {
namespace {

const Limits kLimits{.max_command_bytes = 256, .max_arguments = 8, .max_key_bytes = 32};

struct Parsed {
  Parse status;
  size_t consumed = 0;
  std::vector<std::string> args;
  std::string error;
};

Parsed parse(std::string_view input) {
  Parsed parsed;
  std::vector<std::string_view> args;
  parsed.status = parseCommand(input, kLimits, &parsed.consumed, &args, &parsed.error);
  for (std::string_view arg : args) parsed.args.emplace_back(arg);
  return parsed;
}

Command command(std::vector<std::string_view> args) { return interpret(args, kLimits); }

TEST(RespCodecTest, AnArrayOfBulkStringsIsOneCommand) {
  Parsed parsed = parse("*2\r\n$4\r\nECHO\r\n$3\r\na b\r\n*1\r\n");
  ASSERT_EQ(parsed.status, Parse::kCommand);
  EXPECT_EQ(parsed.consumed, 23u);
  EXPECT_EQ(parsed.args, (std::vector<std::string>{"ECHO", "a b"}));
}

TEST(RespCodecTest, ABulkStringMayHoldAnyByte) {
  Parsed parsed = parse(std::string("*1\r\n$3\r\n\0\r\n\r\n", 13));
  ASSERT_EQ(parsed.status, Parse::kCommand);
  EXPECT_EQ(parsed.args[0], std::string("\0\r\n", 3));
}

TEST(RespCodecTest, APartialCommandWaitsForMoreAtEveryCut) {
  const std::string whole = "*2\r\n$11\r\nCL.THROTTLE\r\n$1\r\nk\r\n";
  for (size_t cut = 0; cut < whole.size(); ++cut) {
    EXPECT_EQ(parse(whole.substr(0, cut)).status, Parse::kIncomplete) << cut;
  }
  EXPECT_EQ(parse(whole).status, Parse::kCommand);
}

TEST(RespCodecTest, InlineCommandsAreSplitOnBlanks) {
  Parsed parsed = parse("PING  hello\r\nrest");
  ASSERT_EQ(parsed.status, Parse::kCommand);
  EXPECT_EQ(parsed.consumed, 13u);
  EXPECT_EQ(parsed.args, (std::vector<std::string>{"PING", "hello"}));
  EXPECT_EQ(parse("PING\n").args, (std::vector<std::string>{"PING"}));
  EXPECT_TRUE(parse("\r\n").args.empty());
}

TEST(RespCodecTest, MalformedOrOversizedInputIsAnError) {
  for (std::string_view bad : {"*x\r\n", "*-1\r\n", "*1\r\n:1\r\n", "*1\r\n$-5\r\n",
                               "*1\r\n$1\r\nab\r\n", "*9\r\n", "*1\r\n$999\r\n"}) {
    Parsed parsed = parse(bad);
    EXPECT_EQ(parsed.status, Parse::kError) << bad;
    EXPECT_EQ(parsed.error.rfind("ERR Protocol error", 0), 0u) << parsed.error;
  }
  EXPECT_EQ(parse(std::string(300, 'a')).status, Parse::kError);
}

TEST(RespCodecTest, ThrottleAsksAnAcquireOfItsQuantity) {
  Command c = command({"cl.throttle", "user", "15", "30", "60", "3"});
  ASSERT_EQ(c.kind, Command::Kind::kAsk);
  EXPECT_TRUE(c.throttle);
  EXPECT_EQ(c.method, Method::kAcquire);
  EXPECT_EQ(c.item.key, "user");
  EXPECT_EQ(c.item.cost, 3);
  EXPECT_EQ(throttleRuleName(c.parameters), "cl.throttle/15/30/60");
  EXPECT_EQ(command({"CL.THROTTLE", "user", "15", "30", "60"}).item.cost, 1);
  EXPECT_EQ(command({"CL.THROTTLE", "user", "15", "30", "60", "0"}).item.cost, 0);
}

TEST(RespCodecTest, ThrottleRefusesParametersOutOfRangeNamingThem) {
  struct Case {
    std::vector<std::string_view> args;
    std::string_view names;
  };
  for (const Case& c : {Case{{"CL.THROTTLE", "k", "-1", "30", "60"}, "max_burst"},
                        Case{{"CL.THROTTLE", "k", "1", "0", "60"}, "count"},
                        Case{{"CL.THROTTLE", "k", "1", "30", "0"}, "period"},
                        Case{{"CL.THROTTLE", "k", "1", "30", "99999999999"}, "period"},
                        Case{{"CL.THROTTLE", "k", "1", "30", "60", "x"}, "quantity"},
                        Case{{"CL.THROTTLE", "k", "1", "30"}, "wrong number"}}) {
    Command got = command(c.args);
    EXPECT_EQ(got.kind, Command::Kind::kReply);
    EXPECT_EQ(got.reply.rfind("-ERR", 0), 0u) << got.reply;
    EXPECT_NE(got.reply.find(c.names), std::string::npos) << got.reply;
  }
}

TEST(RespCodecTest, ThrottleAnswersAsRedisCellDoes) {
  Answer allowed;
  allowed.decide(Decision{.allowed = true, .remaining = 14, .limit = 30, .reset_after_ms = 2999},
                 Mode::kLocal);
  std::string out;
  writeAnswer(&out, Shape::kThrottle, 15, allowed);
  EXPECT_EQ(out, "*5\r\n:0\r\n:16\r\n:14\r\n:-1\r\n:2\r\n");
  Answer denied;
  denied.decide(Decision{.allowed = false, .remaining = 0, .limit = 30, .reset_after_ms = 31000,
                         .retry_after_ms = 1999},
                Mode::kLocal);
  out.clear();
  writeAnswer(&out, Shape::kThrottle, 15, denied);
  EXPECT_EQ(out, "*5\r\n:1\r\n:16\r\n:0\r\n:1\r\n:31\r\n");
}

TEST(RespCodecTest, SluiceAcquireAnswersTheDecisionAndItsMode) {
  Command c = command({"SLUICE.ACQUIRE", "api", "k", "2"});
  ASSERT_EQ(c.kind, Command::Kind::kAsk);
  EXPECT_EQ(c.item.rule, "api");
  EXPECT_EQ(c.item.cost, 2);
  EXPECT_EQ(command({"sluice.peek", "api", "k"}).method, Method::kPeek);
  EXPECT_EQ(command({"sluice.peek", "api", "k"}).item.cost, 0);
  Answer answer;
  answer.decide(Decision{.allowed = true, .remaining = 9, .limit = 10, .reset_after_ms = 100},
                Mode::kNormal);
  std::string out;
  writeAnswer(&out, Shape::kDecision, 0, answer);
  EXPECT_EQ(out, "*6\r\n:1\r\n:9\r\n:10\r\n:100\r\n:0\r\n$6\r\nnormal\r\n");
}

TEST(RespCodecTest, AnErrorAnswerIsAnErrorReplyWithItsCode) {
  Answer answer;
  answer.fail(ErrorCode::kUnknownRule, "no rule named \"x\"\nsecond line");
  std::string out;
  writeAnswer(&out, Shape::kDecision, 0, answer);
  EXPECT_EQ(out, "-UNKNOWN_RULE no rule named \"x\" second line\r\n");
}

TEST(RespCodecTest, StockClientsHandshakeInRespTwo) {
  EXPECT_EQ(command({"PING"}).reply, "+PONG\r\n");
  EXPECT_EQ(command({"ping", "x"}).reply, "$1\r\nx\r\n");
  EXPECT_EQ(command({"SELECT", "0"}).reply, "+OK\r\n");
  EXPECT_EQ(command({"SELECT", "1"}).reply.rfind("-ERR", 0), 0u);
  EXPECT_EQ(command({"CLIENT", "SETINFO", "lib-name", "x"}).reply, "+OK\r\n");
  EXPECT_EQ(command({"HELLO", "3"}).reply.rfind("-NOPROTO", 0), 0u);
  EXPECT_EQ(command({"COMMAND", "DOCS"}).reply, "*0\r\n");
  EXPECT_NE(command({"INFO"}).reply.find("loading:0"), std::string::npos);
  EXPECT_EQ(command({"QUIT"}).kind, Command::Kind::kQuit);
  Command unknown = command({"GET", "x"});
  EXPECT_EQ(unknown.reply.rfind("-ERR unknown command 'GET'", 0), 0u) << unknown.reply;
}

}  // namespace
}  // namespace sluice::resp
