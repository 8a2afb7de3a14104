#include "tools/format.h"

#include <gtest/gtest.h>

#include <regex>

namespace psmd::tools {
namespace {

using counters::Unit;

TEST(HumanTest, CountsUseDecimalPrefixes) {
  EXPECT_EQ(Human(0, Unit::kCount), "0");
  EXPECT_EQ(Human(999, Unit::kCount), "999");
  EXPECT_EQ(Human(1000, Unit::kCount), "1.0 k");
  EXPECT_EQ(Human(1234567, Unit::kCount), "1.2 M");
  EXPECT_EQ(Human(18446744073709551615.0, Unit::kCount), "18.4 E");
}

TEST(HumanTest, BytesUseBinaryPrefixes) {
  EXPECT_EQ(Human(1023, Unit::kBytes), "1023 B");
  EXPECT_EQ(Human(1024, Unit::kBytes), "1.0 KiB");
  EXPECT_EQ(Human(3.4 * (1ull << 30), Unit::kBytes), "3.4 GiB");
}

TEST(HumanTest, RatesKeepAFraction) {
  EXPECT_EQ(Human(12.5, Unit::kCount), "12.5");
  EXPECT_EQ(Human(1.5e6, Unit::kCount), "1.5 M");
  EXPECT_EQ(Human(2048, Unit::kBytes), "2.0 KiB");
  EXPECT_EQ(Human(3, Unit::kBytes), "3 B");
}

TEST(EscapeTest, ClientTextCannotBreakOutOfItsField) {
  std::string forged = "x\n2026-01-01T00:00:00 critical \"node\" failed\\";
  EXPECT_EQ(Printable(forged),
            "x\\x0a2026-01-01T00:00:00 critical \"node\" failed\\");
  EXPECT_EQ(JsonString(forged),
            "\"x\\u000a2026-01-01T00:00:00 critical \\\"node\\\" failed\\\\\"");
  EXPECT_EQ(PromLabel(forged),
            "\"x\\n2026-01-01T00:00:00 critical \\\"node\\\" failed\\\\\"");
}

TEST(CountersTest, EveryCounterHasANameAndHelp) {
  for (const counters::Info& c : counters::kAll) {
    // The name is also a Prometheus name's middle: snake case, and _total
    // is psmctl's to add.
    const std::string name = c.name;
    EXPECT_TRUE(std::regex_match(name, std::regex("[a-z][a-z_]*[a-z]")))
        << name;
    EXPECT_EQ(name.find("_total"), std::string::npos) << name;
    EXPECT_NE(std::string(c.help), "");
  }
}

TEST(CountedTest, OneIsSingular) {
  EXPECT_EQ(Counted(0, "endpoint"), "0 endpoints");
  EXPECT_EQ(Counted(1, "endpoint"), "1 endpoint");
  EXPECT_EQ(Counted(2, "sleep"), "2 sleeps");
}

TEST(UtcTimestampTest, IsoWithMilliseconds) {
  EXPECT_EQ(UtcTimestamp(0), "1970-01-01T00:00:00.000Z");
  EXPECT_EQ(UtcTimestamp(1796004802123), "2026-11-30T02:13:22.123Z");
}

}  // namespace
}  // namespace psmd::tools
