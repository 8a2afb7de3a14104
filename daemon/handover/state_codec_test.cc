#include "daemon/handover/state_codec.h"

#include <gtest/gtest.h>

namespace psmd::handover {
namespace {

TEST(StateCodec, RoundTripsFieldsAndSections) {
  StateWriter w;
  w.U8(7);
  w.Bool(true);
  w.U32(0xdeadbeef);
  const size_t s = w.BeginSection(42);
  w.U64(0x0102030405060708ull);
  w.Str("endpoint");
  w.EndSection(s);
  w.I32(-5);

  StateReader r(w.bytes().data(), w.bytes().size());
  uint8_t u8 = 0;
  bool b = false;
  uint32_t u32 = 0;
  ASSERT_TRUE(r.U8(&u8, "u8"));
  ASSERT_TRUE(r.Bool(&b, "bool"));
  ASSERT_TRUE(r.U32(&u32, "u32"));
  StateReader body;
  ASSERT_TRUE(r.Section(42, &body, "section"));
  uint64_t u64 = 0;
  std::string str;
  ASSERT_TRUE(body.U64(&u64, "u64"));
  ASSERT_TRUE(body.Str(&str, 64, "str"));
  EXPECT_TRUE(body.AtEnd());
  int32_t i32 = 0;
  ASSERT_TRUE(r.I32(&i32, "i32"));
  EXPECT_TRUE(r.AtEnd());
  EXPECT_EQ(u8, 7);
  EXPECT_TRUE(b);
  EXPECT_EQ(u32, 0xdeadbeefu);
  EXPECT_EQ(u64, 0x0102030405060708ull);
  EXPECT_EQ(str, "endpoint");
  EXPECT_EQ(i32, -5);
}

TEST(StateCodec, ShortInputFailsStickilyNamingTheField) {
  StateWriter w;
  w.U16(1);
  StateReader r(w.bytes().data(), w.bytes().size());
  uint32_t v = 0;
  EXPECT_FALSE(r.U32(&v, "endpoint id"));
  EXPECT_NE(r.error().find("endpoint id runs past the end"), std::string::npos)
      << r.error();
  uint8_t b = 0;
  EXPECT_FALSE(r.U8(&b, "later"));  // sticky
  EXPECT_EQ(r.error().find("later"), std::string::npos);
}

TEST(StateCodec, CountIsBoundedByTheBytesLeftBeforeAnyAllocation) {
  StateWriter w;
  w.U32(1000000);  // a million items claimed, none present
  w.U64(0);
  StateReader r(w.bytes().data(), w.bytes().size());
  uint32_t n = 0;
  EXPECT_FALSE(r.Count(&n, 16, UINT32_MAX, "posted receives"));
  EXPECT_NE(r.error().find("cannot fit"), std::string::npos) << r.error();

  StateReader capped(w.bytes().data(), w.bytes().size());
  EXPECT_FALSE(capped.Count(&n, 0, 10, "endpoints"));
  EXPECT_NE(capped.error().find("exceeds 10"), std::string::npos);
}

TEST(StateCodec, SectionBodyCannotReadPastItsEndAndFailuresPropagate) {
  StateWriter w;
  const size_t s = w.BeginSection(1);
  w.U8(1);
  w.EndSection(s);
  w.U32(99);
  StateReader r(w.bytes().data(), w.bytes().size());
  StateReader body;
  ASSERT_TRUE(r.Section(1, &body, "jobs"));
  uint32_t v = 0;
  EXPECT_FALSE(body.U32(&v, "job count"));  // 1 byte in the section
  EXPECT_FALSE(r.Absorb(body));
  EXPECT_FALSE(r.ok());
  EXPECT_NE(r.error().find("job count"), std::string::npos);
}

TEST(StateCodec, WrongSectionTagAndForgedLengthAreRefused) {
  StateWriter w;
  const size_t s = w.BeginSection(3);
  w.EndSection(s);
  StateReader r(w.bytes().data(), w.bytes().size());
  StateReader body;
  EXPECT_FALSE(r.Section(4, &body, "engine"));
  EXPECT_NE(r.error().find("tag 3 where 4"), std::string::npos);

  std::string forged = w.bytes();
  forged[4] = 9;  // length 9, no body
  StateReader f(forged.data(), forged.size());
  EXPECT_FALSE(f.Section(3, &body, "engine"));
  EXPECT_NE(f.error().find("past the end"), std::string::npos);
}

TEST(StateCodec, BoolOtherThanZeroOrOneIsRefused) {
  StateWriter w;
  w.U8(2);
  StateReader r(w.bytes().data(), w.bytes().size());
  bool b = false;
  EXPECT_FALSE(r.Bool(&b, "faulted"));
}

}  // namespace
}  // namespace psmd::handover
