#include "hw/fabric.h"

#include <gtest/gtest.h>

namespace psmd::hw {
namespace {

TEST(ListenAddress, Forms) {
  ListenAddress a;
  std::string error;
  ASSERT_TRUE(ParseListenAddress("10.0.0.1", &a, &error)) << error;
  EXPECT_EQ(a.host, "10.0.0.1");
  EXPECT_EQ(a.port_lo, 0);
  EXPECT_EQ(a.port_hi, 0);
  ASSERT_TRUE(ParseListenAddress("10.0.0.1:7000", &a, &error)) << error;
  EXPECT_EQ(a.port_lo, 7000);
  EXPECT_EQ(a.port_hi, 7000);
  ASSERT_TRUE(ParseListenAddress("10.0.0.1:7000-7010", &a, &error)) << error;
  EXPECT_EQ(a.port_hi, 7010);
  ASSERT_TRUE(ParseListenAddress("[::1]:9-10", &a, &error)) << error;
  EXPECT_EQ(a.host, "::1");
  ASSERT_TRUE(ParseListenAddress("[fe80::1]", &a, &error)) << error;

  for (const char* bad :
       {"", "host.example:1", "10.0.0.1:", "10.0.0.1:70000", "10.0.0.1:9-8",
        "10.0.0.1:0-5", "::1:5", "[::1", "[::1]5", "10.0.0.1:5-x", "1.2.3:4"}) {
    EXPECT_FALSE(ParseListenAddress(bad, &a, &error)) << bad;
    EXPECT_FALSE(error.empty());
  }
}

TEST(HostDescription, RoundTripAndRejects) {
  HostDescription d{12, {{"10.0.0.1", 7000}, {"::1", 7001}}};
  std::string text = FormatHostDescription(d);
  EXPECT_EQ(text, "12@10.0.0.1:7000,[::1]:7001");
  HostDescription back;
  std::string error;
  ASSERT_TRUE(ParseHostDescription(text, &back, &error)) << error;
  EXPECT_EQ(back.node, 12u);
  ASSERT_EQ(back.addresses.size(), 2u);
  EXPECT_EQ(back.addresses[1].host, "::1");
  EXPECT_EQ(back.addresses[1].port, 7001);

  std::string many = "1@";
  for (int i = 0; i < 17; i++)
    many += (i ? "," : "") + std::string("1.1.1.1:1");
  for (const std::string& bad :
       {std::string("10.0.0.1:7000"), std::string("0@10.0.0.1:1"),
        std::string("-1@10.0.0.1:1"), std::string("x@10.0.0.1:1"),
        std::string("1@10.0.0.1"), std::string("1@10.0.0.1:0"),
        std::string("1@"), std::string("1@10.0.0.1:1,"),
        std::string("99999999999999999999999@1.1.1.1:1"), many}) {
    EXPECT_FALSE(ParseHostDescription(bad, &back, &error)) << bad;
  }
}

TEST(Loopback, Detects) {
  EXPECT_TRUE(IsLoopback("127.0.0.1"));
  EXPECT_TRUE(IsLoopback("127.5.6.7"));
  EXPECT_TRUE(IsLoopback("::1"));
  EXPECT_FALSE(IsLoopback("10.0.0.1"));
  EXPECT_FALSE(IsLoopback("0.0.0.0"));
  EXPECT_FALSE(IsLoopback("::"));
  EXPECT_FALSE(IsLoopback("nonsense"));
}

}  // namespace
}  // namespace psmd::hw
