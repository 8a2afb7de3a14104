#include "daemon/log.h"

#include <gtest/gtest.h>

#include <thread>

namespace psmd {
namespace {

TEST(EscapedTest, KeepsPrintableTextAndWritesEverythingElseAsHex) {
  EXPECT_EQ(Escaped("exchange-1.0_a b"), "exchange-1.0_a b");
  EXPECT_EQ(Escaped("x\ny"), "x\\x0ay");
  EXPECT_EQ(Escaped("a\\x0ab"), "a\\x5cx0ab");  // a literal "\x0a" stays text
  EXPECT_EQ(Escaped(std::string("\0\x1b\x7f\xff", 4)), "\\x00\\x1b\\x7f\\xff");
  EXPECT_EQ(Escaped("r\xc3\xa9sum\xc3\xa9"), "r\\xc3\\xa9sum\\xc3\\xa9");
}

TEST(RateLimiterTest, LetsABurstThroughThenCountsWhatItSuppressed) {
  RateLimiter limiter(3, std::chrono::milliseconds(200), 16);
  uint64_t suppressed = 99;
  for (int i = 0; i < 3; i++) {
    EXPECT_TRUE(limiter.Allow(7, &suppressed));
    EXPECT_EQ(suppressed, 0u);
  }
  for (int i = 0; i < 10; i++) EXPECT_FALSE(limiter.Allow(7, &suppressed));
  EXPECT_TRUE(limiter.Allow(8, &suppressed)) << "another key has its own";
  std::this_thread::sleep_for(std::chrono::milliseconds(250));
  ASSERT_TRUE(limiter.Allow(7, &suppressed));
  EXPECT_EQ(suppressed, 10u);
  ASSERT_TRUE(limiter.Allow(7, &suppressed));
  EXPECT_EQ(suppressed, 0u);
}

TEST(RateLimiterTest, ManyKeysShareOneOverflowBudget) {
  RateLimiter limiter(1, std::chrono::seconds(60), 4);
  uint64_t suppressed = 0;
  int allowed = 0;
  for (uint64_t key = 0; key < 1000; key++) {
    allowed += limiter.Allow(key, &suppressed);
  }
  // Four keys of their own, then one for all the rest.
  EXPECT_EQ(allowed, 5);
}

}  // namespace
}  // namespace psmd
