// Tests for the algorithm table (daemon/algorithm.h): each column is tied to
// the behaviour that asks it, so a row that says one thing while the code
// does another fails here.
#include "algorithm.h"

#include <string>
#include <string_view>
#include <vector>

#include <gtest/gtest.h>

#include "config.h"
#include "limiter.h"
#include "rules.h"
#include "scripts.h"
#include "test_support.h"

namespace sluice {
namespace {

std::string ruleText(const AlgorithmTraits& row, std::string_view extra) {
  return "[[rule]]\nname = \"r\"\nalgorithm = \"" + std::string(row.name) +
         "\"\nlimit = 10\nperiod = \"1s\"\n" + std::string(extra) + "\n";
}

// The file with [redis], for rules that must be global.
std::string globalRuleText(const AlgorithmTraits& row, std::string_view extra) {
  return "[redis]\nurl = \"redis://127.0.0.1:6379\"\n" +
         ruleText(row, "scope = \"global\"\n" + std::string(extra));
}

ConfigResult load(const std::string& text) { return loadConfigString(text, "x.toml"); }

// Verifies that every row's name reads back as its own algorithm and no two
// rows share a name.
TEST(AlgorithmTable, EveryNameReadsBackAsItsOwnAlgorithm) {
  for (const AlgorithmTraits& row : kAlgorithmTraits) {
    EXPECT_EQ(algorithmNamed(row.name), row.algorithm) << row.name;
    EXPECT_EQ(algorithmName(row.algorithm), row.name);
  }
  EXPECT_EQ(algorithmNamed("leaky_bucket"), std::nullopt);
}

// Verifies that each algorithm with a lease script has that file in lua/,
// embedded byte for byte (after its preludes') as the script the lease
// manager loads for it, and
// that an algorithm without one has no script.
TEST(AlgorithmTable, EachLeaseScriptIsAFileInLuaEmbeddedAsTheAlgorithmsScript) {
  for (const AlgorithmTraits& row : kAlgorithmTraits) {
    const std::optional<scripts::Script> script = scripts::forAlgorithm(row.algorithm);
    if (row.lease_script.empty()) {
      EXPECT_EQ(script, std::nullopt) << row.name;
      continue;
    }
    ASSERT_TRUE(script.has_value()) << row.name << ": " << row.lease_script << " is not embedded";
    const scripts::ScriptSource& source = scripts::get(*script);
    EXPECT_EQ(source.name, row.lease_script);
    const std::string file =
        test::readFile(std::string(SLUICE_SOURCE_DIR) + "/lua/" + std::string(row.lease_script));
    EXPECT_FALSE(file.empty()) << "lua/" << row.lease_script << " is missing";
    std::string preludes;
    for (std::string_view prelude : source.preludes) {
      preludes += test::readFile(std::string(SLUICE_SOURCE_DIR) + "/lua/" + std::string(prelude));
    }
    EXPECT_EQ(source.source, preludes + file) << row.lease_script;
  }
}

// Verifies that the config takes burst on exactly the algorithms the table
// says have one, and refuses it with the fix on the others.
TEST(AlgorithmTable, ConfigTakesBurstExactlyWhereTheTableSaysOne) {
  for (const AlgorithmTraits& row : kAlgorithmTraits) {
    ConfigResult result = load(ruleText(row, "burst = 5"));
    EXPECT_EQ(result.ok(), row.burst) << row.name << ": " << result.error;
    if (!row.burst) {
      EXPECT_NE(result.error.find("burst applies only to token_bucket and gcra"), std::string::npos)
          << result.error;
    } else {
      EXPECT_EQ(result.config->rules->find("r")->limits[0].burst, 5);
    }
  }
}

// Verifies that max_wait and pace are taken on exactly the algorithms that
// can wait, locally and on a global rule of one limit.
TEST(AlgorithmTable, ConfigTakesMaxWaitAndPaceExactlyWhereTheAlgorithmWaits) {
  for (const AlgorithmTraits& row : kAlgorithmTraits) {
    for (std::string_view option : {"max_wait = \"100ms\"", "pace = true"}) {
      ConfigResult local = load(ruleText(row, option));
      EXPECT_EQ(local.ok(), row.waits) << row.name << " " << option << ": " << local.error;
      ConfigResult global = load(globalRuleText(row, option));
      EXPECT_EQ(global.ok(), row.waits) << row.name << " global " << option << ": " << global.error;
      if (local.ok()) {
        EXPECT_TRUE(canWait(*local.config->rules->find("r")));
      }
    }
  }
}

// Verifies that overrides are taken on exactly the algorithms whose limits
// are one state word (every key of the rule keeps the same layout).
TEST(AlgorithmTable, ConfigTakesOverridesExactlyOnOneWordAlgorithms) {
  for (const AlgorithmTraits& row : kAlgorithmTraits) {
    ConfigResult result = load(ruleText(row, "overrides = [{ key = \"k\", limit = 20 }]"));
    EXPECT_EQ(result.ok(), row.state == StateShape::kOneWord) << row.name << ": " << result.error;
  }
}

// Verifies that a penalty on a global rule is taken exactly where the rule
// leases a slice, through which the block is shared.
TEST(AlgorithmTable, ConfigTakesAGlobalPenaltyExactlyWhereTheRuleLeasesASlice) {
  for (const AlgorithmTraits& row : kAlgorithmTraits) {
    ConfigResult result =
        load(globalRuleText(row, "penalty = { denials = 3, window = \"1m\", block = \"1m\" }"));
    EXPECT_EQ(result.ok(), row.leases_slice) << row.name << ": " << result.error;
  }
}

// Verifies that the config takes a limit of the table's maximum and refuses
// one more, naming the maximum and, where the row has one, the algorithm
// for larger limits.
TEST(AlgorithmTable, ConfigTakesTheMaximumLimitAndRefusesOneMore) {
  for (const AlgorithmTraits& row : kAlgorithmTraits) {
    auto text = [&](int64_t limit) {
      return "[[rule]]\nname = \"r\"\nalgorithm = \"" + std::string(row.name) +
             "\"\nlimit = " + std::to_string(limit) + "\nperiod = \"1h\"\n";
    };
    ConfigResult most = load(text(row.max_limit));
    EXPECT_TRUE(most.ok()) << row.name << ": " << most.error;
    ConfigResult above = load(text(row.max_limit + 1));
    ASSERT_FALSE(above.ok()) << row.name;
    EXPECT_NE(above.error.find("is above " + std::to_string(row.max_limit) + ", the most a " +
                               std::string(row.name) + " rule can hold"),
              std::string::npos)
        << above.error;
    const std::string larger = "or use algorithm = \"" + std::string(row.for_larger_limits) + "\"";
    EXPECT_EQ(above.error.find(larger) != std::string::npos, !row.for_larger_limits.empty())
        << above.error;
  }
}

// Verifies that a period of "0" (no longest hold) is taken exactly on the
// algorithms whose units are held.
TEST(AlgorithmTable, ConfigTakesNoPeriodExactlyWhereUnitsAreHeld) {
  for (const AlgorithmTraits& row : kAlgorithmTraits) {
    const std::string text = "[[rule]]\nname = \"r\"\nalgorithm = \"" + std::string(row.name) +
                             "\"\nlimit = 4\nperiod = \"0\"\n";
    EXPECT_EQ(load(text).ok(), row.holds) << row.name;
  }
}

// Verifies that the limiter keeps one word per limit or one per unit, as
// the table's state shape says.
TEST(AlgorithmTable, LimiterKeepsTheStateWordsOfTheTablesShape) {
  for (const AlgorithmTraits& row : kAlgorithmTraits) {
    Rule rule;
    rule.algorithm = row.algorithm;
    rule.limits = {Limit{5, 1'000'000'000, 5}, Limit{7, 60'000'000'000, 7}};
    const size_t expected = row.state == StateShape::kOneWord ? 2 : 12;
    EXPECT_EQ(stateWords(rule), expected) << row.name;
  }
}

// Verifies that a global rule of several limits is split into parts exactly
// when its algorithm leases a slice, and that a held algorithm leases
// holdings instead.
TEST(AlgorithmTable, AGlobalRuleSplitsIntoPartsExactlyWhereItLeasesASlice) {
  for (const AlgorithmTraits& row : kAlgorithmTraits) {
    Rule rule;
    rule.algorithm = row.algorithm;
    rule.scope = Scope::kGlobal;
    rule.limits = {Limit{5, 1'000'000'000, 5}, Limit{7, 60'000'000'000, 7}};
    EXPECT_EQ(splitsIntoParts(rule), row.leases_slice) << row.name;
    rule.scope = Scope::kLocal;
    EXPECT_FALSE(splitsIntoParts(rule)) << row.name;
  }
}

}  // namespace
}  // namespace sluice
