// Tests for matcher.h: unit tests of every documented behaviour (run against
// both the real queues and the linear reference model, so the model itself is
// checked), plus a randomized differential test of the real queues against
// the model.

#include "daemon/engine/matcher.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <deque>
#include <functional>
#include <iostream>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "daemon/engine/matcher_reference.h"
#include "daemon/engine/tag.h"

namespace psmd {
namespace {

// ---------------------------------------------------------------------------
// Helpers

constexpr Tag96 T(uint32_t w0, uint32_t w1, uint32_t w2) {
  return Tag96{{w0, w1, w2}};
}

RecvPattern Exact(uint64_t source, Tag96 tag) {
  return RecvPattern{source, tag, kTagSelAll};
}
RecvPattern Wild(uint64_t source, Tag96 tag, Tag96 sel) {
  return RecvPattern{source, tag, sel};
}
MsgKey Msg(uint64_t source, Tag96 tag) { return MsgKey{source, tag}; }

// Value type of the queues under test: small, movable, identifiable.
struct Req {
  int id;
};

std::optional<int> Id(const std::optional<Req>& r) {
  if (!r) return std::nullopt;
  return r->id;
}
std::optional<int> Id(const Req* r) {
  if (r == nullptr) return std::nullopt;
  return r->id;
}

// The two implementations under test, selected by TYPED_TEST.
struct RealImpl {
  template <typename T>
  using Posted = PostedQueue<T>;
  template <typename T>
  using Unexpected = UnexpectedQueue<T>;
};
struct LinearImpl {
  template <typename T>
  using Posted = LinearPostedQueue<T>;
  template <typename T>
  using Unexpected = LinearUnexpectedQueue<T>;
};

template <typename Impl>
class MatcherTest : public ::testing::Test {
 protected:
  typename Impl::template Posted<Req> posted_;
  typename Impl::template Unexpected<Req> unexpected_;

  // True if a receive with pattern p, alone in the posted queue, takes msg;
  // and, symmetrically, if p alone finds msg alone in the unexpected queue.
  // Checks both queues agree, and leaves both empty.
  bool Matches(const RecvPattern& p, const MsgKey& msg) {
    posted_.post(p, Req{1});
    const bool posted_hit = posted_.take_match(msg).has_value();
    if (!posted_hit) posted_.remove_first_if([](const Req&) { return true; });
    unexpected_.push(msg, Req{2});
    const bool unexpected_hit = unexpected_.take(p).has_value();
    if (!unexpected_hit)
      unexpected_.remove_first_if([](const Req&) { return true; });
    EXPECT_EQ(posted_hit, unexpected_hit);
    EXPECT_EQ(posted_.size(), 0u);
    EXPECT_EQ(unexpected_.size(), 0u);
    return posted_hit;
  }
};

using Impls = ::testing::Types<RealImpl, LinearImpl>;
class ImplNames {
 public:
  template <typename T>
  static std::string GetName(int) {
    return std::is_same_v<T, RealImpl> ? "Real" : "Linear";
  }
};
TYPED_TEST_SUITE(MatcherTest, Impls, ImplNames);

// ---------------------------------------------------------------------------
// Matching rule (both queues)

TYPED_TEST(MatcherTest, ExactTagMatchesOnlyThatTag) {
  const Tag96 tag = T(0x11, 0x22, 0x33);
  EXPECT_TRUE(this->Matches(Exact(5, tag), Msg(5, tag)));
  EXPECT_FALSE(this->Matches(Exact(5, tag), Msg(5, T(0x10, 0x22, 0x33))));
  EXPECT_FALSE(this->Matches(Exact(5, tag), Msg(5, T(0x11, 0x23, 0x33))));
  EXPECT_FALSE(this->Matches(Exact(5, tag), Msg(5, T(0x11, 0x22, 0x32))));
  EXPECT_FALSE(this->Matches(Exact(5, tag), Msg(5, T(0x11, 0x22, 0x80000033))));
}

TYPED_TEST(MatcherTest, SourceFilter) {
  const Tag96 tag = T(1, 2, 3);
  EXPECT_TRUE(this->Matches(Exact(5, tag), Msg(5, tag)));
  EXPECT_FALSE(this->Matches(Exact(5, tag), Msg(6, tag)));
  EXPECT_TRUE(this->Matches(Exact(kAnySource, tag), Msg(6, tag)));
  EXPECT_TRUE(this->Matches(Exact(kAnySource, tag), Msg(0, tag)));
  // Source filters apply to wildcard receives too.
  EXPECT_FALSE(this->Matches(Wild(5, tag, kTagSelNone), Msg(6, T(9, 9, 9))));
  EXPECT_TRUE(this->Matches(Wild(5, tag, kTagSelNone), Msg(5, T(9, 9, 9))));
  EXPECT_TRUE(
      this->Matches(Wild(kAnySource, tag, kTagSelNone), Msg(7, T(9, 9, 9))));
}

TYPED_TEST(MatcherTest, SelectorWildcardsAnyBitOfAnyWord) {
  const Tag96 tag = T(0xA5A5A5A5, 0x5A5A5A5A, 0x0F0F0F0F);
  for (int word = 0; word < 3; ++word) {
    for (int bit : {0, 1, 15, 16, 30, 31}) {
      SCOPED_TRACE("word " + std::to_string(word) + " bit " +
                   std::to_string(bit));
      Tag96 sel = kTagSelAll;
      sel.w[word] &= ~(1u << bit);
      Tag96 flipped = tag;
      flipped.w[word] ^= 1u << bit;
      // The wildcarded bit may differ...
      EXPECT_TRUE(this->Matches(Wild(3, tag, sel), Msg(3, tag)));
      EXPECT_TRUE(this->Matches(Wild(3, tag, sel), Msg(3, flipped)));
      // ...but every other bit, in every word, still has to agree.
      for (int other_word = 0; other_word < 3; ++other_word) {
        const int other_bit = other_word == word ? (bit + 1) % 32 : bit;
        Tag96 wrong = flipped;
        wrong.w[other_word] ^= 1u << other_bit;
        EXPECT_FALSE(this->Matches(Wild(3, tag, sel), Msg(3, wrong)));
      }
      // A tag bit under a 0 selector bit is ignored on the receive side too.
      Tag96 rtag = tag;
      rtag.w[word] ^= 1u << bit;
      EXPECT_TRUE(this->Matches(Wild(3, rtag, sel), Msg(3, tag)));
    }
  }
  // All-zero selector matches any tag.
  EXPECT_TRUE(
      this->Matches(Wild(kAnySource, tag, kTagSelNone), Msg(1, T(0, 0, 0))));
  EXPECT_TRUE(this->Matches(Wild(kAnySource, tag, kTagSelNone),
                            Msg(1, T(~0u, ~0u, ~0u))));
}

TYPED_TEST(MatcherTest, SixtyFourBitTagsHaveZeroTag2) {
  constexpr Tag96 t = Tag64(0x3333000300000007ULL);
  static_assert(t.w[0] == 0x00000007 && t.w[1] == 0x33330003 && t.w[2] == 0);
  // 64-bit receives as PSM2's psm2_mq_irecv builds them: tag2 selector 0.
  auto recv64 = [](uint64_t tag, uint64_t sel) {
    return Wild(kAnySource, Tag64(tag), Tag64(sel));
  };
  // The MPI packing example from psm2_mq.h: (context | rank | tag).
  EXPECT_TRUE(
      this->Matches(recv64(0x3333000000000007ULL, 0xffff0000ffffffffULL),
                    Msg(3, Tag64(0x3333000300000007ULL))));  // any source rank
  EXPECT_FALSE(
      this->Matches(recv64(0x3333000000000007ULL, 0xffff0000ffffffffULL),
                    Msg(3, Tag64(0x3333000300000008ULL))));  // other tag
  EXPECT_FALSE(
      this->Matches(recv64(0x3333000000000007ULL, 0xffff0000ffffffffULL),
                    Msg(3, Tag64(0x4444000300000007ULL))));  // other context
  EXPECT_TRUE(this->Matches(
      recv64(0x3333000300000000ULL, 0xffffffff80000000ULL),
      Msg(3, Tag64(0x3333000300001234ULL))));  // any tag from rank 3
  EXPECT_FALSE(
      this->Matches(recv64(0x3333000300000000ULL, 0xffffffff80000000ULL),
                    Msg(3, Tag64(0x3333000400001234ULL))));  // rank 4
  // A full 64-bit selector is exact on the 64 bits it has.
  EXPECT_TRUE(this->Matches(recv64(42, ~0ULL), Msg(1, Tag64(42))));
  EXPECT_FALSE(this->Matches(recv64(42, ~0ULL), Msg(1, Tag64(43))));
  EXPECT_FALSE(
      this->Matches(recv64(42, ~0ULL), Msg(1, Tag64(42ULL | (1ULL << 63)))));
  // An exact 96-bit receive of a 64-bit tag matches the 64-bit message only.
  EXPECT_TRUE(this->Matches(Exact(1, Tag64(42)), Msg(1, Tag64(42))));
  EXPECT_FALSE(this->Matches(Exact(1, Tag64(42)), Msg(1, T(42, 0, 1))));
}

// ---------------------------------------------------------------------------
// Posted queue ordering

TYPED_TEST(MatcherTest, PostedEarliestWinsExactBeforeWildcard) {
  const Tag96 tag = T(7, 0, 0);
  this->posted_.post(Exact(1, tag), Req{1});
  this->posted_.post(Wild(kAnySource, tag, T(0, ~0u, ~0u)), Req{2});
  this->posted_.post(Exact(1, tag), Req{3});
  EXPECT_EQ(this->posted_.size(), 3u);
  EXPECT_EQ(Id(this->posted_.take_match(Msg(1, tag))), 1);
  EXPECT_EQ(Id(this->posted_.take_match(Msg(1, tag))), 2);
  EXPECT_EQ(Id(this->posted_.take_match(Msg(1, tag))), 3);
  EXPECT_EQ(Id(this->posted_.take_match(Msg(1, tag))), std::nullopt);
  EXPECT_EQ(this->posted_.size(), 0u);
}

TYPED_TEST(MatcherTest, PostedEarliestWinsWildcardBeforeExact) {
  const Tag96 tag = T(7, 0, 0);
  this->posted_.post(Wild(kAnySource, tag, T(0, ~0u, ~0u)), Req{1});
  this->posted_.post(Exact(1, tag), Req{2});
  this->posted_.post(Wild(1, T(0, 0, 0), kTagSelNone), Req{3});
  this->posted_.post(Exact(kAnySource, tag), Req{4});
  EXPECT_EQ(Id(this->posted_.take_match(Msg(1, tag))), 1);
  EXPECT_EQ(Id(this->posted_.take_match(Msg(1, tag))), 2);
  EXPECT_EQ(Id(this->posted_.take_match(Msg(1, tag))), 3);
  EXPECT_EQ(Id(this->posted_.take_match(Msg(1, tag))), 4);
  EXPECT_EQ(this->posted_.size(), 0u);
}

TYPED_TEST(MatcherTest, PostedSkipsNonMatchingEntries) {
  const Tag96 a = T(1, 0, 0);
  const Tag96 b = T(2, 0, 0);
  this->posted_.post(Exact(1, a), Req{1});
  this->posted_.post(Wild(2, a, T(~0u, 0, 0)), Req{2});  // wrong source for msg
  this->posted_.post(Exact(kAnySource, b), Req{3});      // wrong tag
  this->posted_.post(Exact(kAnySource, a), Req{4});
  this->posted_.post(Exact(3, a), Req{5});
  // Receives of `a` from sources 1, any, 3, posted in that order.
  EXPECT_EQ(Id(this->posted_.take_match(Msg(3, a))), 4);
  EXPECT_EQ(Id(this->posted_.take_match(Msg(3, a))), 5);
  EXPECT_EQ(Id(this->posted_.take_match(Msg(3, a))), std::nullopt);
  EXPECT_EQ(Id(this->posted_.take_match(Msg(2, a))), 2);
  EXPECT_EQ(Id(this->posted_.take_match(Msg(1, a))), 1);
  EXPECT_EQ(Id(this->posted_.take_match(Msg(1, b))), 3);
  EXPECT_EQ(this->posted_.size(), 0u);
}

TYPED_TEST(MatcherTest, PostedFifoPerTagInterleaved) {
  // Round-robin over tags, alternating exact and wildcard receives: each
  // message must take the earliest receive for its tag.
  for (int i = 0; i < 40; ++i) {
    const Tag96 tag = T(static_cast<uint32_t>(i % 4), 0, 0);
    if (i % 3 == 0) {
      this->posted_.post(Wild(kAnySource, tag, T(~0u, ~0u, 0)), Req{i});
    } else {
      this->posted_.post(Exact(kAnySource, tag), Req{i});
    }
  }
  for (int i = 0; i < 40; ++i) {
    const Tag96 tag = T(static_cast<uint32_t>(i % 4), 0, 0);
    EXPECT_EQ(Id(this->posted_.take_match(Msg(9, tag))), i);
  }
  EXPECT_EQ(this->posted_.size(), 0u);
}

TYPED_TEST(MatcherTest, PostedRemoveFirstIf) {
  const Tag96 tag = T(5, 5, 5);
  this->posted_.post(Wild(kAnySource, tag, kTagSelNone), Req{10});
  this->posted_.post(Exact(1, tag), Req{11});
  this->posted_.post(Exact(2, T(6, 6, 6)), Req{12});
  this->posted_.post(Exact(1, tag), Req{13});
  auto odd = [](const Req& r) { return r.id % 2 == 1; };
  EXPECT_EQ(Id(this->posted_.remove_first_if(odd)), 11);
  EXPECT_EQ(this->posted_.size(), 3u);
  EXPECT_EQ(Id(this->posted_.remove_first_if(odd)), 13);
  EXPECT_EQ(Id(this->posted_.remove_first_if(odd)), std::nullopt);
  EXPECT_EQ(Id(this->posted_.remove_first_if(
                [](const Req& r) { return r.id == 12; })),
            12);
  EXPECT_EQ(this->posted_.size(), 1u);
  // Remaining entry still matchable.
  EXPECT_EQ(Id(this->posted_.take_match(Msg(1, tag))), 10);
  EXPECT_EQ(Id(this->posted_.remove_first_if(odd)), std::nullopt);
}

TYPED_TEST(MatcherTest, PostedRemoveAllIfLeavesTheRestInOrder) {
  // Receives from sources 1 and 2, exact and wildcard, interleaved; removing
  // every one naming source 1 leaves source 2's matching in posting order.
  for (int i = 0; i < 30; ++i) {
    const uint64_t source = 1 + static_cast<uint64_t>(i % 2);
    const Tag96 tag = T(static_cast<uint32_t>(i % 3), 0, 0);
    if (i % 5 == 0) {
      this->posted_.post(Wild(source, tag, T(~0u, 0, 0)), Req{i});
    } else {
      this->posted_.post(Exact(source, tag), Req{i});
    }
  }
  std::vector<int> removed;
  this->posted_.remove_all_if([](const Req& r) { return r.id % 2 == 0; },
                              [&](Req&& r) { removed.push_back(r.id); });
  std::sort(removed.begin(), removed.end());
  std::vector<int> evens;
  for (int i = 0; i < 30; i += 2) evens.push_back(i);
  EXPECT_EQ(removed, evens);
  EXPECT_EQ(this->posted_.size(), 15u);
  for (int i = 1; i < 30; i += 2) {
    const Tag96 tag = T(static_cast<uint32_t>(i % 3), 0, 0);
    EXPECT_EQ(Id(this->posted_.take_match(Msg(2, tag))), i);
  }
  EXPECT_EQ(this->posted_.size(), 0u);
}

TYPED_TEST(MatcherTest, PostedDrainInPostingOrderAndReusable) {
  for (int i = 0; i < 20; ++i) {
    const Tag96 tag = T(static_cast<uint32_t>(i % 3), 0, 0);
    if (i % 4 == 0) {
      this->posted_.post(Wild(kAnySource, tag, T(0, ~0u, 0)), Req{i});
    } else {
      this->posted_.post(Exact(static_cast<uint64_t>(i % 2), tag), Req{i});
    }
  }
  EXPECT_EQ(this->posted_.size(), 20u);
  std::vector<int> got;
  this->posted_.drain([&](Req&& r) { got.push_back(r.id); });
  std::vector<int> want(20);
  for (int i = 0; i < 20; ++i) want[i] = i;
  EXPECT_EQ(got, want);
  EXPECT_EQ(this->posted_.size(), 0u);
  EXPECT_EQ(Id(this->posted_.take_match(Msg(0, T(0, 0, 0)))), std::nullopt);
  this->posted_.post(Exact(0, T(0, 0, 0)), Req{99});
  EXPECT_EQ(Id(this->posted_.take_match(Msg(0, T(0, 0, 0)))), 99);
}

// Removing the head, middle or tail of a bucket keeps the rest in order (and
// later appends go after the new tail).
TYPED_TEST(MatcherTest, BucketOrderSurvivesRemovalAnywhere) {
  const Tag96 tag = T(4, 4, 4);
  for (int victim = 0; victim < 3; ++victim) {
    SCOPED_TRACE("victim " + std::to_string(victim));
    for (int i = 0; i < 3; ++i) {
      this->posted_.post(Exact(kAnySource, tag), Req{i});
      this->unexpected_.push(Msg(1, tag), Req{i});
    }
    auto is_victim = [victim](const Req& r) { return r.id == victim; };
    EXPECT_EQ(Id(this->posted_.remove_first_if(is_victim)), victim);
    EXPECT_EQ(Id(this->unexpected_.remove_first_if(is_victim)), victim);
    this->posted_.post(Exact(kAnySource, tag), Req{3});
    this->unexpected_.push(Msg(1, tag), Req{3});
    for (int i = 0; i <= 3; ++i) {
      if (i == victim) continue;
      EXPECT_EQ(Id(this->posted_.take_match(Msg(1, tag))), i);
      EXPECT_EQ(Id(this->unexpected_.take(Exact(1, tag))), i);
    }
    EXPECT_EQ(this->posted_.size(), 0u);
    EXPECT_EQ(this->unexpected_.size(), 0u);
  }
}

// drain() empties the queue before calling f, so f may put entries back.
TYPED_TEST(MatcherTest, DrainCallbackMayRefillQueue) {
  for (int i = 0; i < 4; ++i) {
    this->posted_.post(Exact(1, T(1, 0, 0)), Req{i});
    this->unexpected_.push(Msg(1, T(1, 0, 0)), Req{i});
  }
  int calls = 0;
  this->posted_.drain([&](Req&& r) {
    ++calls;
    if (r.id % 2 == 0) this->posted_.post(Exact(1, T(1, 0, 0)), Req{r.id + 10});
  });
  this->unexpected_.drain([&](const MsgKey& k, Req&& r) {
    ++calls;
    if (r.id % 2 == 0) this->unexpected_.push(k, Req{r.id + 10});
  });
  EXPECT_EQ(calls, 8);
  EXPECT_EQ(this->posted_.size(), 2u);
  EXPECT_EQ(this->unexpected_.size(), 2u);
  EXPECT_EQ(Id(this->posted_.take_match(Msg(1, T(1, 0, 0)))), 10);
  EXPECT_EQ(Id(this->posted_.take_match(Msg(1, T(1, 0, 0)))), 12);
  EXPECT_EQ(Id(this->unexpected_.take(Exact(1, T(1, 0, 0)))), 10);
  EXPECT_EQ(Id(this->unexpected_.take(Exact(1, T(1, 0, 0)))), 12);
}

TYPED_TEST(MatcherTest, PostedSize) {
  EXPECT_EQ(this->posted_.size(), 0u);
  EXPECT_TRUE(this->posted_.empty());
  this->posted_.post(Exact(1, T(1, 1, 1)), Req{1});
  this->posted_.post(Wild(1, T(1, 1, 1), kTagSelNone), Req{2});
  EXPECT_EQ(this->posted_.size(), 2u);
  EXPECT_FALSE(this->posted_.take_match(Msg(2, T(1, 1, 1))).has_value());
  EXPECT_EQ(this->posted_.size(), 2u);
  EXPECT_TRUE(this->posted_.take_match(Msg(1, T(1, 1, 1))).has_value());
  EXPECT_EQ(this->posted_.size(), 1u);
}

// ---------------------------------------------------------------------------
// Unexpected queue ordering

TYPED_TEST(MatcherTest, UnexpectedEarliestArrivedWins) {
  const Tag96 a = T(1, 0, 0);
  const Tag96 b = T(2, 0, 0);
  this->unexpected_.push(Msg(1, b), Req{1});
  this->unexpected_.push(Msg(2, a), Req{2});
  this->unexpected_.push(Msg(1, a), Req{3});
  this->unexpected_.push(Msg(2, b), Req{4});
  this->unexpected_.push(Msg(1, a), Req{5});
  // Exact tag, specific source: earliest from that source with that tag.
  EXPECT_EQ(Id(this->unexpected_.take(Exact(1, a))), 3);
  // Exact tag, any source.
  EXPECT_EQ(Id(this->unexpected_.take(Exact(kAnySource, a))), 2);
  // Wildcard tag: earliest overall, across tags.
  EXPECT_EQ(Id(this->unexpected_.take(Wild(kAnySource, a, kTagSelNone))), 1);
  // Wildcard tag with a source filter.
  EXPECT_EQ(Id(this->unexpected_.take(Wild(1, a, kTagSelNone))), 5);
  EXPECT_EQ(Id(this->unexpected_.take(Wild(1, a, kTagSelNone))), std::nullopt);
  EXPECT_EQ(Id(this->unexpected_.take(Exact(2, b))), 4);
  EXPECT_EQ(this->unexpected_.size(), 0u);
}

TYPED_TEST(MatcherTest, UnexpectedFindLeavesMessageQueued) {
  const Tag96 a = T(1, 2, 3);
  this->unexpected_.push(Msg(4, T(9, 9, 9)), Req{1});
  this->unexpected_.push(Msg(5, a), Req{2});
  this->unexpected_.push(Msg(6, a), Req{3});
  MsgKey key{};
  EXPECT_EQ(Id(this->unexpected_.find(Exact(kAnySource, a), &key)), 2);
  EXPECT_EQ(key, Msg(5, a));
  EXPECT_EQ(this->unexpected_.size(), 3u);
  // Same answer again: nothing was consumed.
  EXPECT_EQ(Id(this->unexpected_.find(Exact(kAnySource, a))), 2);
  EXPECT_EQ(Id(this->unexpected_.find(Wild(kAnySource, a, T(~0u, 0, 0)), &key)),
            2);
  EXPECT_EQ(Id(this->unexpected_.find(Exact(7, a))), std::nullopt);
  // The returned pointer refers to the queued value.
  this->unexpected_.find(Exact(6, a))->id = 33;
  EXPECT_EQ(Id(this->unexpected_.take(Exact(6, a), &key)), 33);
  EXPECT_EQ(key, Msg(6, a));
  EXPECT_EQ(this->unexpected_.size(), 2u);
}

TYPED_TEST(MatcherTest, UnexpectedTakeRemoves) {
  const Tag96 a = T(1, 2, 3);
  this->unexpected_.push(Msg(5, a), Req{1});
  this->unexpected_.push(Msg(5, a), Req{2});
  MsgKey key{};
  EXPECT_EQ(Id(this->unexpected_.take(Exact(5, a), &key)), 1);
  EXPECT_EQ(key, Msg(5, a));
  EXPECT_EQ(this->unexpected_.size(), 1u);
  EXPECT_EQ(Id(this->unexpected_.find(Exact(5, a))), 2);
  EXPECT_EQ(Id(this->unexpected_.take(Wild(kAnySource, a, kTagSelNone))), 2);
  EXPECT_EQ(Id(this->unexpected_.take(Exact(5, a))), std::nullopt);
  EXPECT_EQ(Id(this->unexpected_.find(Exact(5, a))), std::nullopt);
  EXPECT_EQ(this->unexpected_.size(), 0u);
  EXPECT_TRUE(this->unexpected_.empty());
}

TYPED_TEST(MatcherTest, UnexpectedRemoveFirstIf) {
  this->unexpected_.push(Msg(1, T(1, 0, 0)), Req{10});
  this->unexpected_.push(Msg(2, T(2, 0, 0)), Req{11});
  this->unexpected_.push(Msg(1, T(1, 0, 0)), Req{13});
  std::vector<int> seen;
  auto odd = [&](const Req& r) {
    seen.push_back(r.id);
    return r.id % 2 == 1;
  };
  EXPECT_EQ(Id(this->unexpected_.remove_first_if(odd)), 11);
  EXPECT_EQ(seen, (std::vector<int>{10, 11}));  // arrival order, stops at hit
  EXPECT_EQ(Id(this->unexpected_.remove_first_if(odd)), 13);
  EXPECT_EQ(Id(this->unexpected_.remove_first_if(odd)), std::nullopt);
  EXPECT_EQ(this->unexpected_.size(), 1u);
  EXPECT_EQ(Id(this->unexpected_.take(Exact(1, T(1, 0, 0)))), 10);
}

TYPED_TEST(MatcherTest, UnexpectedDrainInArrivalOrderAndReusable) {
  std::vector<MsgKey> keys;
  for (int i = 0; i < 20; ++i) {
    keys.push_back(Msg(static_cast<uint64_t>(i % 3),
                       T(static_cast<uint32_t>(i % 4), 0, 0)));
    this->unexpected_.push(keys.back(), Req{i});
  }
  std::vector<MsgKey> got_keys;
  std::vector<int> got;
  this->unexpected_.drain([&](const MsgKey& k, Req&& r) {
    got_keys.push_back(k);
    got.push_back(r.id);
  });
  std::vector<int> want(20);
  for (int i = 0; i < 20; ++i) want[i] = i;
  EXPECT_EQ(got, want);
  EXPECT_EQ(got_keys, keys);
  EXPECT_EQ(this->unexpected_.size(), 0u);
  EXPECT_EQ(
      Id(this->unexpected_.find(Wild(kAnySource, T(0, 0, 0), kTagSelNone))),
      std::nullopt);
  this->unexpected_.push(keys[0], Req{99});
  EXPECT_EQ(Id(this->unexpected_.take(Exact(keys[0].source, keys[0].tag))), 99);
}

// ---------------------------------------------------------------------------
// Real-implementation specifics

TEST(MatcherRealTest, MoveOnlyValues) {
  PostedQueue<std::unique_ptr<int>> posted;
  posted.post(Exact(1, T(1, 1, 1)), std::make_unique<int>(7));
  auto r = posted.take_match(Msg(1, T(1, 1, 1)));
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(**r, 7);

  UnexpectedQueue<std::unique_ptr<int>> unexpected;
  unexpected.push(Msg(1, T(1, 1, 1)), std::make_unique<int>(8));
  EXPECT_EQ(**unexpected.find(Exact(1, T(1, 1, 1))), 8);
  auto m = unexpected.take(Exact(1, T(1, 1, 1)));
  ASSERT_TRUE(m.has_value());
  EXPECT_EQ(**m, 8);
}

// Counts live instances, to check nodes destroy values exactly once.
struct Counted {
  static inline int live = 0;
  int id;
  explicit Counted(int i) : id(i) { ++live; }
  Counted(Counted&& o) noexcept : id(o.id) { ++live; }
  Counted& operator=(Counted&&) = default;
  ~Counted() { --live; }
};

TEST(MatcherRealTest, ValuesAreDestroyedExactlyOnce) {
  Counted::live = 0;
  {
    PostedQueue<Counted> posted;
    UnexpectedQueue<Counted> unexpected;
    for (int i = 0; i < 1000; ++i) {
      posted.post(Exact(1, T(static_cast<uint32_t>(i % 10), 0, 0)), Counted(i));
      unexpected.push(Msg(1, T(static_cast<uint32_t>(i % 10), 0, 0)),
                      Counted(i));
    }
    EXPECT_EQ(Counted::live, 2000);
    for (int i = 0; i < 300; ++i) {
      EXPECT_TRUE(
          posted.take_match(Msg(1, T(static_cast<uint32_t>(i % 10), 0, 0)))
              .has_value());
      EXPECT_TRUE(
          unexpected.take(Exact(1, T(static_cast<uint32_t>(i % 10), 0, 0)))
              .has_value());
    }
    EXPECT_EQ(Counted::live, 1400);
    posted.drain([](Counted&&) {});
    EXPECT_EQ(Counted::live, 700);
    // Leave the unexpected queue populated: its destructor must clean up.
  }
  EXPECT_EQ(Counted::live, 0);
}

TEST(MatcherRealTest, MoveTransfersEntriesAndEmptiesSource) {
  Counted::live = 0;
  {
    PostedQueue<Counted> p1;
    UnexpectedQueue<Counted> u1;
    for (int i = 0; i < 3; ++i) {
      p1.post(Exact(1, T(static_cast<uint32_t>(i), 0, 0)), Counted(i));
      u1.push(Msg(1, T(static_cast<uint32_t>(i), 0, 0)), Counted(i));
    }
    PostedQueue<Counted> p2(std::move(p1));
    UnexpectedQueue<Counted> u2(std::move(u1));
    EXPECT_EQ(p1.size(), 0u);  // NOLINT(bugprone-use-after-move): documented
    EXPECT_EQ(u1.size(), 0u);  // NOLINT(bugprone-use-after-move)
    EXPECT_EQ(p2.size(), 3u);
    EXPECT_EQ(u2.size(), 3u);
    EXPECT_EQ(Counted::live, 6);
    // Moved-from queues are usable.
    p1.post(Exact(1, T(9, 0, 0)), Counted(9));
    u1.push(Msg(1, T(9, 0, 0)), Counted(9));
    // Move-assign over a non-empty queue destroys its old entries.
    p1 = std::move(p2);
    u1 = std::move(u2);
    EXPECT_EQ(Counted::live, 6);
    ASSERT_EQ(p1.size(), 3u);
    EXPECT_EQ(p1.take_match(Msg(1, T(1, 0, 0)))->id, 1);
    EXPECT_EQ(u1.take(Exact(1, T(2, 0, 0)))->id, 2);
    EXPECT_FALSE(p1.take_match(Msg(1, T(9, 0, 0))).has_value());
  }
  EXPECT_EQ(Counted::live, 0);
}

// A drain() callback that throws: the entries it was given stay handed out,
// the rest are destroyed (not leaked, not destroyed twice), and the queue is
// empty and usable afterwards.
TEST(MatcherRealTest, DrainCallbackThrows) {
  struct Boom {};
  Counted::live = 0;
  {
    PostedQueue<Counted> posted;
    UnexpectedQueue<Counted> unexpected;
    for (int i = 0; i < 40; ++i) {
      const Tag96 tag = T(static_cast<uint32_t>(i % 5), 0, 0);
      if (i % 3 == 0) {
        posted.post(Wild(kAnySource, tag, T(~0u, 0, 0)), Counted(i));
      } else {
        posted.post(Exact(1, tag), Counted(i));
      }
      unexpected.push(Msg(1, tag), Counted(i));
    }
    std::vector<int> got;
    auto throw_at_10 = [&](Counted&& c) {
      if (c.id == 10) throw Boom{};
      got.push_back(c.id);
    };
    EXPECT_THROW(posted.drain(throw_at_10), Boom);
    EXPECT_THROW(unexpected.drain([&](const MsgKey&, Counted&& c) {
      throw_at_10(std::move(c));
    }),
                 Boom);
    const std::vector<int> first_ten = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9};
    EXPECT_EQ(std::vector<int>(got.begin(), got.begin() + 10), first_ten);
    EXPECT_EQ(std::vector<int>(got.begin() + 10, got.end()), first_ten);
    EXPECT_EQ(Counted::live, 0);
    EXPECT_EQ(posted.size(), 0u);
    EXPECT_EQ(unexpected.size(), 0u);
    posted.post(Wild(kAnySource, T(0, 0, 0), kTagSelNone), Counted(100));
    unexpected.push(Msg(1, T(0, 0, 0)), Counted(101));
    EXPECT_EQ(posted.take_match(Msg(1, T(3, 3, 3)))->id, 100);
    EXPECT_EQ(unexpected.take(Wild(kAnySource, T(0, 0, 0), kTagSelNone))->id,
              101);
  }
  EXPECT_EQ(Counted::live, 0);
}

// Thousands of wildcard receives (and unexpected messages taken by wildcard
// receives) removed in random order: the posted queue's buckets and tables,
// and the unexpected queue's arrival log (which fills with stale entries,
// grows and compacts many times), must keep posting order and every value
// exactly once throughout.
TEST(MatcherRealTest, WildcardArrayCompaction) {
  constexpr int kN = 3000;
  std::mt19937_64 rng(11);
  Counted::live = 0;
  {
    PostedQueue<Counted> posted;
    UnexpectedQueue<Counted> unexpected;
    // Receive i matches only messages with tag word 0 == i (word 1 is
    // ignored) and is posted between two exact receives of other tags.
    auto wild = [](int i) {
      return Wild(kAnySource, T(static_cast<uint32_t>(i), 0, 0),
                  T(~0u, 0, ~0u));
    };
    auto msg = [](int i) { return Msg(3, T(static_cast<uint32_t>(i), 7, 0)); };
    for (int round = 0; round < 3; ++round) {
      for (int i = 0; i < kN; ++i) {
        posted.post(Exact(3, T(static_cast<uint32_t>(i), 1, 0)), Counted(-1));
        posted.post(wild(i), Counted(i));
        unexpected.push(msg(i), Counted(i));
      }
      std::vector<int> order(kN);
      for (int i = 0; i < kN; ++i) order[i] = i;
      std::shuffle(order.begin(), order.end(), rng);
      for (int k = 0; k < kN; ++k) {
        const int i = order[k];
        ASSERT_EQ(posted.take_match(msg(i))->id, i);
        // Wildcard take: the earliest-arrived message still queued.
        ASSERT_EQ(unexpected.take(wild(i))->id, i);
        if (k % 97 == 0) {
          // Earliest survivors, found by scanning past the tombstones.
          std::vector<int> left(order.begin() + k + 1, order.end());
          if (left.empty()) continue;
          const int first = *std::min_element(left.begin(), left.end());
          ASSERT_EQ(
              unexpected.find(Wild(kAnySource, T(0, 0, 0), kTagSelNone))->id,
              first);
        }
      }
      EXPECT_EQ(posted.size(), static_cast<size_t>(kN));  // the exact ones
      EXPECT_EQ(unexpected.size(), 0u);
      int cancelled = 0;
      while (
          posted.remove_first_if([](const Counted& c) { return c.id == -1; }))
        ++cancelled;
      EXPECT_EQ(cancelled, kN);
      EXPECT_EQ(Counted::live, 0);
    }
  }
  EXPECT_EQ(Counted::live, 0);
}

// The unexpected queue's arrival log keeps an entry for every message taken
// since its last compaction. A message that stays queued at the front (a
// receive the application never posts) must not let the log grow with the
// traffic behind it: memory stays that of the peak depth.
TEST(MatcherRealTest, ArrivalLogStaysBoundedBehindAnOldMessage) {
  UnexpectedQueue<Req> q;
  q.push(Msg(1, T(0xdead, 0, 0)), Req{-1});
  auto tag_of = [](int i) { return T(static_cast<uint32_t>(i % 64), 1, 0); };
  for (int i = 0; i < 64; ++i) q.push(Msg(2, tag_of(i)), Req{i});
  const size_t settled = q.memory_bytes();
  for (int i = 64; i < 1'000'000; ++i) {
    // Take the oldest message of one tag, push a newer one: depth stays 65.
    ASSERT_EQ(Id(q.take(Exact(2, tag_of(i)))), i - 64);
    q.push(Msg(2, tag_of(i)), Req{i});
    if (i % 1000 == 0) {
      ASSERT_LE(q.memory_bytes(), 2 * settled + 4096)
          << "after " << i << " messages";
    }
  }
  // The first message is still the earliest arrival, found by a wildcard.
  EXPECT_EQ(Id(q.take(Wild(kAnySource, T(0, 0, 0), kTagSelNone))), -1);
  EXPECT_EQ(q.size(), 64u);
}

// Many distinct exact tags taken in random order: exercises the tag index's
// growth and backward-shift deletion at a size the differential test does not
// reach.
TEST(MatcherRealTest, ManyDistinctExactTags) {
  constexpr int kN = 50000;
  std::mt19937_64 rng(7);
  std::vector<int> order(kN);
  for (int i = 0; i < kN; ++i) order[i] = i;
  auto tag_of = [](int i) {
    return T(static_cast<uint32_t>(i) * 2654435761u, 0x77, 0);
  };

  PostedQueue<Req> posted;
  UnexpectedQueue<Req> unexpected;
  for (int round = 0; round < 2; ++round) {
    for (int i = 0; i < kN; ++i) {
      posted.post(Exact(kAnySource, tag_of(i)), Req{i});
      unexpected.push(Msg(3, tag_of(i)), Req{i});
    }
    std::shuffle(order.begin(), order.end(), rng);
    for (int i : order) {
      ASSERT_EQ(Id(posted.take_match(Msg(3, tag_of(i)))), i);
      ASSERT_EQ(Id(unexpected.take(Exact(3, tag_of(i)))), i);
      ASSERT_EQ(Id(unexpected.find(Exact(3, tag_of(i)))), std::nullopt);
    }
    EXPECT_EQ(posted.size(), 0u);
    EXPECT_EQ(unexpected.size(), 0u);
  }
}

// A queue copied entry by entry in order (for_each_in_order, as a handover
// does: issue 33) into a fresh one matches every later message, receive,
// cancel and probe exactly as the original: exact, wildcard and partial
// selectors, more classes than are hashed (the overflow list), entries
// already matched and cancelled before the copy.
TEST(MatcherRealTest, QueuesCopiedInOrderMatchAsTheOriginals) {
  std::mt19937_64 rng(11);
  auto pattern = [&](int i) {
    const uint64_t source = rng() % 4 == 0 ? kAnySource : 1 + rng() % 3;
    Tag96 sel = kTagSelAll;
    if (rng() % 3 == 0) sel = T(0, 0, 0);
    if (rng() % 3 == 0) sel = T(~0u << (i % 24), ~0u, 0);  // many classes
    return RecvPattern{source, T(rng() % 4, rng() % 2, 0), sel};
  };
  auto key = [&] { return Msg(1 + rng() % 3, T(rng() % 4, rng() % 2, 0)); };
  PostedQueue<Req> posted;
  UnexpectedQueue<Req> unexpected;
  for (int i = 0; i < 600; ++i) {
    posted.post(pattern(i), Req{i}, static_cast<uint64_t>(i % 50));
    unexpected.push(key(), Req{i});
    if (i % 5 == 0) posted.take_match(key());
    if (i % 7 == 0) posted.remove_id(rng() % 50);
    if (i % 3 == 0) unexpected.take(pattern(i));
  }
  PostedQueue<Req> posted_copy;
  posted.for_each_in_order([&](const RecvPattern& p, uint64_t id,
                               const Req& r) { posted_copy.post(p, r, id); });
  UnexpectedQueue<Req> unexpected_copy;
  unexpected.for_each_in_order(
      [&](const MsgKey& k, const Req& r) { unexpected_copy.push(k, r); });
  ASSERT_EQ(posted_copy.size(), posted.size());
  ASSERT_EQ(unexpected_copy.size(), unexpected.size());
  for (int i = 0; i < 2000; ++i) {
    const MsgKey k = key();
    ASSERT_EQ(Id(posted.take_match(k)), Id(posted_copy.take_match(k))) << i;
    const uint64_t id = rng() % 50;
    ASSERT_EQ(Id(posted.remove_id(id)), Id(posted_copy.remove_id(id))) << i;
    const RecvPattern p = pattern(i);
    MsgKey got{}, got_copy{};
    ASSERT_EQ(Id(unexpected.find(p)), Id(unexpected_copy.find(p))) << i;
    ASSERT_EQ(Id(unexpected.take(p, &got)),
              Id(unexpected_copy.take(p, &got_copy)))
        << i;
    ASSERT_EQ(got, got_copy);
  }
}

// ---------------------------------------------------------------------------
// Work bounds (issue 12: one tenant's posted receives must not make the
// shared worker slow for everyone). Work is counted by the queue's test hook
// (hash slots probed plus overflow entries scanned), not timed.

constexpr int kDeep = 1'000'000;

// Posts kDeep never-matching receives with pattern pat(i) and id i, then
// checks that matching a message and cancelling a receive cost a few probes
// each, and that nothing was lost or reordered.
template <typename PatternOf>
void CheckDeepQueueIsO1(PatternOf pat, MsgKey (*msg)(int)) {
  PostedQueue<Req> q;
  for (int i = 0; i < kDeep; ++i)
    q.post(pat(i), Req{i}, static_cast<uint64_t>(i));
  ASSERT_EQ(q.size(), static_cast<size_t>(kDeep));
  std::mt19937_64 rng(3);
  uint64_t worst_match = 0;
  uint64_t worst_cancel = 0;
  uint64_t total = 0;
  constexpr int kOps = 2000;
  for (int k = 0; k < kOps; ++k) {
    // A message nobody waits for (the bystander's case: it must not scan).
    uint64_t before = q.work();
    ASSERT_EQ(Id(q.take_match(msg(kDeep + k))), std::nullopt);
    worst_match = std::max(worst_match, q.work() - before);
    total += q.work() - before;
    // A message for receive i, and a cancel of receive j.
    const int i = static_cast<int>(rng() % kDeep);
    before = q.work();
    const auto got = Id(q.take_match(msg(i)));
    worst_match = std::max(worst_match, q.work() - before);
    ASSERT_TRUE(got == i || got == std::nullopt) << i;  // nullopt: cancelled
    const int j = static_cast<int>(rng() % kDeep);
    before = q.work();
    const auto cancelled = Id(q.remove_id(static_cast<uint64_t>(j)));
    worst_cancel = std::max(worst_cancel, q.work() - before);
    total += q.work() - before;
    ASSERT_TRUE(cancelled == j || cancelled == std::nullopt) << j;
  }
  // Load <= 1/4 keeps probe runs short; a scan would be ~10^6.
  EXPECT_LE(worst_match, 64u);
  EXPECT_LE(worst_cancel, 64u);
  EXPECT_LE(total / (2 * kOps), 8u);
  EXPECT_LE(q.largest_growth_step(),
            2 * matcher_internal::HashIndex::kMigrateSlots);
}

MsgKey Msg96(int i) { return Msg(5, T(static_cast<uint32_t>(i), 9, 9)); }
MsgKey Msg64(int i) {
  return Msg(5, Tag64(0x100000000ULL * 3 + static_cast<uint64_t>(i)));
}

TEST(MatcherWorkTest, ExactReceivesAndTheirCancelsAreO1) {
  CheckDeepQueueIsO1(
      [](int i) { return Exact(5, T(static_cast<uint32_t>(i), 9, 9)); }, Msg96);
}

// psm2_mq_irecv receives: the tag2 selector is 0, so they are not "exact"
// 96-bit receives; they used to be scanned as wildcards.
TEST(MatcherWorkTest, SixtyFourBitReceivesAreHashed) {
  CheckDeepQueueIsO1(
      [](int i) {
        return Wild(kAnySource,
                    Tag64(0x100000000ULL * 3 + static_cast<uint64_t>(i)),
                    Tag64(~0ULL));
      },
      Msg64);
}

// MPI-style selectors (ANY_TAG from one rank) are hashed on the bits they
// compare.
TEST(MatcherWorkTest, PartialSelectorReceivesAreHashed) {
  CheckDeepQueueIsO1(
      [](int i) {
        return Wild(5, T(0, static_cast<uint32_t>(i), 9), T(0, ~0u, ~0u));
      },
      [](int i) { return Msg(5, T(12345, static_cast<uint32_t>(i), 9)); });
}

// Cancel takes the earliest-posted receive with the id, whatever its class,
// and leaves the others matchable in order.
TEST(MatcherWorkTest, RemoveIdTakesEarliestWithId) {
  PostedQueue<Req> q;
  const Tag96 tag = T(1, 2, 3);
  q.post(Exact(1, tag), Req{0}, 7);
  q.post(Wild(kAnySource, tag, T(~0u, 0, 0)), Req{1}, 8);
  q.post(Wild(kAnySource, tag, kTagSelNone), Req{2}, 7);
  q.post(Exact(1, tag), Req{3}, 8);
  EXPECT_EQ(Id(q.remove_id(8)), 1);
  EXPECT_EQ(Id(q.remove_id(7)), 0);
  EXPECT_EQ(Id(q.remove_id(9)), std::nullopt);
  EXPECT_EQ(Id(q.take_match(Msg(1, tag))), 2);
  EXPECT_EQ(Id(q.take_match(Msg(1, tag))), 3);
  EXPECT_EQ(q.size(), 0u);
  EXPECT_EQ(Id(q.remove_id(7)), std::nullopt);
}

// More classes than are hashed at once: the rest go to the overflow list,
// and posting order still decides across hashed buckets and the overflow.
TEST(MatcherWorkTest, OrderAcrossClassesAndOverflow) {
  constexpr int kClasses = 3 * PostedQueue<Req>::kMaxClasses;
  PostedQueue<Req> q;
  const Tag96 tag = T(0xff, 0xff, 0xff);
  for (int round = 0; round < 3; ++round) {
    for (int c = 0; c < kClasses; ++c) {
      // Distinct selectors, all matching `tag` from source 1.
      const Tag96 sel = T(1u << (c % 32), c < 32 ? ~0u : 0u, c % 2 ? ~0u : 0u);
      const uint64_t src = c % 3 == 0 ? kAnySource : 1;
      q.post(Wild(src, tag, sel), Req{round * kClasses + c});
    }
  }
  for (int i = 0; i < 3 * kClasses; ++i) {
    ASSERT_EQ(Id(q.take_match(Msg(1, tag))), i);
  }
  EXPECT_EQ(q.size(), 0u);
  // Classes are freed: a new one is hashed again, and still in order.
  q.post(Exact(2, tag), Req{100});
  q.post(Exact(2, tag), Req{101});
  EXPECT_EQ(Id(q.take_match(Msg(2, tag))), 100);
  EXPECT_EQ(Id(q.take_match(Msg(2, tag))), 101);
}

// Receives posted while the hash tables migrate (in several generations of
// growth) are matched in posting order per tag, whether they sit in the old
// table or the new one; and no single post moves more than a bounded number
// of slots.
TEST(MatcherWorkTest, OrderAcrossIncrementalGrowth) {
  constexpr int kTagsPerGeneration = 5000;
  constexpr int kN = 400'000;
  PostedQueue<Req> q;
  // want[t][front[t]..]: the receives of tag t still posted, oldest first.
  std::vector<std::vector<int>> want;
  std::vector<size_t> front;
  std::mt19937_64 rng(5);
  auto msg = [](int t) { return Msg(9, T(static_cast<uint32_t>(t), 1, 0)); };
  for (int i = 0; i < kN; ++i) {
    // New tags keep appearing (the tables keep growing) while old ones
    // keep several receives each; exact and 64-bit-style classes mixed.
    const int t = static_cast<int>(rng() % kTagsPerGeneration) +
                  (i / 20000) * kTagsPerGeneration;
    const uint32_t w0 = static_cast<uint32_t>(t);
    const RecvPattern p = i % 2 ? Exact(kAnySource, T(w0, 1, 0))
                                : Wild(kAnySource, T(w0, 1, 7), T(~0u, ~0u, 0));
    q.post(p, Req{i}, static_cast<uint64_t>(i));
    if (want.size() <= static_cast<size_t>(t)) {
      want.resize(t + 1);
      front.resize(t + 1);
    }
    want[t].push_back(i);
    if (i % 3 == 0) {
      // Match the oldest receive of a random tag seen so far.
      const int u = static_cast<int>(rng() % want.size());
      const auto got = Id(q.take_match(msg(u)));
      if (front[u] == want[u].size()) {
        ASSERT_EQ(got, std::nullopt);
      } else {
        ASSERT_EQ(got, want[u][front[u]]) << "tag " << u << " after " << i;
        ++front[u];
      }
    }
  }
  for (size_t u = 0; u < want.size(); ++u) {
    for (size_t k = front[u]; k < want[u].size(); ++k) {
      ASSERT_EQ(Id(q.take_match(msg(static_cast<int>(u)))), want[u][k]);
    }
  }
  EXPECT_EQ(q.size(), 0u);
  EXPECT_LE(q.largest_growth_step(),
            2 * matcher_internal::HashIndex::kMigrateSlots);
}

// clear() drops everything (values destroyed once) and leaves a usable queue.
TEST(MatcherWorkTest, ClearDropsEverything) {
  Counted::live = 0;
  {
    PostedQueue<Counted> q;
    for (int i = 0; i < 5000; ++i) {
      q.post(i % 2 ? Exact(1, T(static_cast<uint32_t>(i), 0, 0))
                   : Wild(kAnySource, T(0, 0, 0),
                          T(0, 0, static_cast<uint32_t>(i % 40))),
             Counted(i), static_cast<uint64_t>(i));
    }
    q.clear();
    EXPECT_EQ(Counted::live, 0);
    EXPECT_EQ(q.size(), 0u);
    EXPECT_FALSE(q.remove_id(3).has_value());
    q.post(Exact(1, T(1, 0, 0)), Counted(1), 1);
    EXPECT_EQ(q.take_match(Msg(1, T(1, 0, 0)))->id, 1);
  }
  EXPECT_EQ(Counted::live, 0);
}

// A queue a tenant filled and cancelled gives its memory back, a bounded
// step per shed_memory() call, and works meanwhile and after (issue 38).
TEST(MatcherWorkTest, AnEmptiedQueueShedsItsMemoryInBoundedSteps) {
  constexpr int kN = 300'000;  // tables of 16 MiB: mapped, freed in steps
  PostedQueue<Req> q;
  auto exact = [](int i) {
    return Exact(5, T(static_cast<uint32_t>(i), 9, 9));
  };
  for (int i = 0; i < kN; ++i)
    q.post(exact(i), Req{i}, static_cast<uint64_t>(i));
  const size_t peak = q.memory_bytes();
  EXPECT_FALSE(q.shed_memory()) << "a queue in use keeps its memory";
  EXPECT_EQ(q.memory_bytes(), peak);
  for (int i = 0; i < kN; ++i)
    ASSERT_EQ(Id(q.remove_id(static_cast<uint64_t>(i))), i);
  size_t calls = 0, largest_step = 0, before = q.memory_bytes();
  for (bool more = true; more; ++calls) {
    more = q.shed_memory();
    const size_t now = q.memory_bytes();
    if (now < before) largest_step = std::max(largest_step, before - now);
    // The queue is usable while it sheds.
    if (calls % 97 == 0) {
      q.post(exact(kN + 1), Req{kN + 1}, 1);
      ASSERT_EQ(Id(q.take_match(Msg96(kN + 1))), kN + 1);
    }
    before = q.memory_bytes();
    ASSERT_LT(calls, size_t{1} << 20);
  }
  EXPECT_LT(q.memory_bytes(), peak / 100) << "peak " << peak;
  EXPECT_LE(largest_step, size_t{1} << 20);  // a chunk, 64 KiB of a table
  EXPECT_GE(calls, peak / (size_t{1} << 20));
  q.post(exact(3), Req{3}, 3);
  q.post(exact(4), Req{4}, 4);
  EXPECT_EQ(Id(q.remove_id(3)), 3);
  EXPECT_EQ(Id(q.take_match(Msg96(4))), 4);
  EXPECT_TRUE(q.empty());
}

// ---------------------------------------------------------------------------
// Randomized differential test against the linear model.

struct DiffConfig {
  uint64_t seed;
  int ops;
  bool wide_tags;  // many distinct tags (deep queues, big tag index)
};

class Differential {
 public:
  explicit Differential(const DiffConfig& c) : cfg_(c), rng_(c.seed) {
    if (cfg_.wide_tags) {
      for (int i = 0; i < 600; ++i) {
        wide_pool_.push_back(T(static_cast<uint32_t>(rng_()), Pick({0u, 1u}),
                               Pick({0u, 0x80000000u})));
      }
    }
  }

  void Run() {
    for (op_ = 0; op_ < cfg_.ops; ++op_) {
      // Alternate filling and emptying phases so queue depths swing between
      // empty and deep.
      filling_ = (op_ / 3000) % 2 == 0;
      Step();
      if (::testing::Test::HasFatalFailure()) return;
      ASSERT_EQ(posted_.size(), ref_posted_.size()) << Where();
      ASSERT_EQ(unexpected_.size(), ref_unexpected_.size()) << Where();
      stats_.max_posted = std::max(stats_.max_posted, posted_.size());
      stats_.max_unexpected =
          std::max(stats_.max_unexpected, unexpected_.size());
    }
    std::cout << Where() << ": max depth posted " << stats_.max_posted
              << " unexpected " << stats_.max_unexpected
              << "; hits: take_match " << stats_.take_match_hits << ", find "
              << stats_.find_hits << ", take " << stats_.take_hits
              << ", remove_first_if " << stats_.remove_hits << ", remove_id "
              << stats_.remove_id_hits << "; drains " << stats_.drains << "\n";
    // Guard against the generator silently degenerating (e.g. nothing ever
    // matching): every kind of hit must happen many times.
    EXPECT_GT(stats_.max_posted, 50u);
    EXPECT_GT(stats_.max_unexpected, 50u);
    EXPECT_GT(stats_.take_match_hits, 1000);
    EXPECT_GT(stats_.find_hits, 1000);
    EXPECT_GT(stats_.take_hits, 1000);
    EXPECT_GT(stats_.remove_hits, 100);
    EXPECT_GT(stats_.remove_id_hits, 100);
    EXPECT_GT(stats_.drains, 5);
  }

 private:
  std::string Where() const {
    return "seed " + std::to_string(cfg_.seed) + " op " + std::to_string(op_);
  }

  uint32_t Pick(std::initializer_list<uint32_t> v) {
    return *(v.begin() + rng_() % v.size());
  }
  bool Chance(int percent) { return static_cast<int>(rng_() % 100) < percent; }

  uint64_t Source() { return 1 + rng_() % 4; }
  uint64_t SourceFilter() { return Chance(30) ? kAnySource : Source(); }

  Tag96 RandomTag() {
    if (cfg_.wide_tags) return wide_pool_[rng_() % wide_pool_.size()];
    return T(Pick({0u, 1u, 0x80000001u}), Pick({0u, 7u}),
             Pick({0u, 0xFFFFFFFFu}));
  }

  uint32_t SelWord() {
    switch (rng_() % 5) {
      case 0:
        return ~0u;
      case 1:
        return 0u;
      case 2:
        return ~(1u << (rng_() % 32));
      case 3:
        return 1u << (rng_() % 32);
      default:
        return static_cast<uint32_t>(rng_());
    }
  }

  Tag96 Selector() {
    const int r = static_cast<int>(rng_() % 100);
    if (r < 45) return kTagSelAll;
    if (r < 55) return kTagSelNone;
    return T(SelWord(), SelWord(), SelWord());
  }

  RecvPattern Pattern() {
    RecvPattern p{SourceFilter(), RandomTag(), Selector()};
    // Random bits under wildcarded selector bits must not matter.
    if (Chance(20)) {
      const size_t w = rng_() % 3;
      p.tag.w[w] ^= static_cast<uint32_t>(rng_()) & ~p.sel.w[w];
    }
    return p;
  }

  MsgKey Key() { return MsgKey{Source(), RandomTag()}; }

  // A value predicate for remove_first_if: a specific id (cancel) or a class.
  std::function<bool(const int&)> Pred() {
    if (Chance(60)) {
      const int id = next_id_ == 0 ? 0 : static_cast<int>(rng_() % next_id_);
      return [id](const int& v) { return v == id; };
    }
    const int m = 2 + static_cast<int>(rng_() % 5);
    const int r = static_cast<int>(rng_() % m);
    return [m, r](const int& v) { return v % m == r; };
  }

  // Cancel ids repeat (a client may reuse one): remove_id must take the
  // earliest-posted receive with the id.
  uint64_t CancelId(int v) { return static_cast<uint64_t>(v % 97); }

  void Post() {
    const RecvPattern p = Pattern();
    posted_.post(p, next_id_, CancelId(next_id_));
    ref_posted_.post(p, next_id_, CancelId(next_id_));
    ++next_id_;
  }

  void RemoveId() {
    const uint64_t id = rng_() % 97;
    const std::optional<int> a = posted_.remove_id(id);
    ASSERT_EQ(a, ref_posted_.remove_id(id)) << Where();
    stats_.remove_id_hits += a.has_value();
  }

  void Push() {
    const MsgKey k = Key();
    unexpected_.push(k, next_id_);
    ref_unexpected_.push(k, next_id_);
    ++next_id_;
  }

  void TakeMatch() {
    const MsgKey k = Key();
    // A prefetch is only a hint: the match below must agree with the model
    // whether or not one came first.
    if (Chance(50)) posted_.prefetch_slot(k);
    if (Chance(50)) posted_.prefetch_entry(k);
    const std::optional<int> a = posted_.take_match(k);
    ASSERT_EQ(a, ref_posted_.take_match(k)) << Where();
    stats_.take_match_hits += a.has_value();
  }

  void Find() {
    const RecvPattern p = Pattern();
    MsgKey k1{}, k2{};
    const int* a = unexpected_.find(p, &k1);
    const int* b = ref_unexpected_.find(p, &k2);
    ASSERT_EQ(a == nullptr, b == nullptr) << Where();
    if (a != nullptr) {
      ++stats_.find_hits;
      ASSERT_EQ(*a, *b) << Where();
      ASSERT_EQ(k1, k2) << Where();
    }
  }

  void Take() {
    const RecvPattern p = Pattern();
    if (Chance(50)) unexpected_.prefetch_slot(p);
    if (Chance(50)) unexpected_.prefetch_entry(p);
    MsgKey k1{}, k2{};
    const std::optional<int> a = unexpected_.take(p, &k1);
    ASSERT_EQ(a, ref_unexpected_.take(p, &k2)) << Where();
    if (a) {
      ++stats_.take_hits;
      ASSERT_EQ(k1, k2) << Where();
    }
  }

  // The daemon's flow: an arriving message takes a posted receive or becomes
  // unexpected; a new receive takes an unexpected message or gets posted.
  void Arrive() {
    const MsgKey k = Key();
    const std::optional<int> a = posted_.take_match(k);
    ASSERT_EQ(a, ref_posted_.take_match(k)) << Where();
    stats_.take_match_hits += a.has_value();
    if (!a) {
      unexpected_.push(k, next_id_);
      ref_unexpected_.push(k, next_id_);
      ++next_id_;
    }
  }

  void Receive() {
    const RecvPattern p = Pattern();
    const std::optional<int> a = unexpected_.take(p);
    ASSERT_EQ(a, ref_unexpected_.take(p)) << Where();
    stats_.take_hits += a.has_value();
    if (!a) {
      posted_.post(p, next_id_, CancelId(next_id_));
      ref_posted_.post(p, next_id_, CancelId(next_id_));
      ++next_id_;
    }
  }

  void DrainPosted() {
    ++stats_.drains;
    std::vector<int> a, b;
    posted_.drain([&](int&& v) { a.push_back(v); });
    ref_posted_.drain([&](int&& v) { b.push_back(v); });
    ASSERT_EQ(a, b) << Where();
  }

  void DrainUnexpected() {
    ++stats_.drains;
    std::vector<std::pair<int, MsgKey>> a, b;
    unexpected_.drain([&](const MsgKey& k, int&& v) { a.emplace_back(v, k); });
    ref_unexpected_.drain(
        [&](const MsgKey& k, int&& v) { b.emplace_back(v, k); });
    ASSERT_EQ(a.size(), b.size()) << Where();
    for (size_t i = 0; i < a.size(); ++i) {
      ASSERT_EQ(a[i].first, b[i].first) << Where();
      ASSERT_EQ(a[i].second, b[i].second) << Where();
    }
  }

  void Step() {
    // Per-mille weights; inserts dominate while filling. Drains are rare so
    // that deep queues build up between them.
    const int insert = filling_ ? 200 : 60;
    const int total = 2 * insert + 610 + 1;
    const int r = static_cast<int>(rng_() % total);
    int acc = 0;
    auto in = [&](int weight) { return r < (acc += weight); };
    if (in(insert)) return Post();
    if (in(insert)) return Push();
    if (in(120)) return TakeMatch();
    if (in(80)) return Find();
    if (in(120)) return Take();
    if (in(100)) return Arrive();
    if (in(100)) return Receive();
    if (in(30)) return RemoveId();
    if (in(30)) {
      auto pred = Pred();
      const std::optional<int> a = posted_.remove_first_if(pred);
      ASSERT_EQ(a, ref_posted_.remove_first_if(pred)) << Where();
      stats_.remove_hits += a.has_value();
      return;
    }
    if (in(30)) {
      auto pred = Pred();
      const std::optional<int> a = unexpected_.remove_first_if(pred);
      ASSERT_EQ(a, ref_unexpected_.remove_first_if(pred)) << Where();
      stats_.remove_hits += a.has_value();
      return;
    }
    if (Chance(50)) return DrainPosted();
    return DrainUnexpected();
  }

  struct Stats {
    size_t max_posted = 0;
    size_t max_unexpected = 0;
    int take_match_hits = 0;
    int find_hits = 0;
    int take_hits = 0;
    int remove_hits = 0;
    int remove_id_hits = 0;
    int drains = 0;
  };

  DiffConfig cfg_;
  Stats stats_;
  std::mt19937_64 rng_;
  std::vector<Tag96> wide_pool_;
  int op_ = 0;
  bool filling_ = true;
  int next_id_ = 0;

  PostedQueue<int> posted_;
  LinearPostedQueue<int> ref_posted_;
  UnexpectedQueue<int> unexpected_;
  LinearUnexpectedQueue<int> ref_unexpected_;
};

void PrintTo(const DiffConfig& c, std::ostream* os) {
  *os << "{seed " << c.seed << ", " << c.ops << " ops, "
      << (c.wide_tags ? "wide" : "narrow") << " tags}";
}

class MatcherDifferentialTest : public ::testing::TestWithParam<DiffConfig> {};

TEST_P(MatcherDifferentialTest, AgreesWithLinearModel) {
  Differential d(GetParam());
  d.Run();
}

INSTANTIATE_TEST_SUITE_P(
    Seeds, MatcherDifferentialTest,
    ::testing::Values(DiffConfig{1, 100000, false},
                      DiffConfig{2, 100000, false},
                      DiffConfig{3, 100000, false},
                      DiffConfig{4, 100000, false}, DiffConfig{5, 100000, true},
                      DiffConfig{6, 100000, true}, DiffConfig{7, 100000, true},
                      DiffConfig{8, 100000, true}),
    [](const ::testing::TestParamInfo<DiffConfig>& param_info) {
      return "seed" + std::to_string(param_info.param.seed) +
             (param_info.param.wide_tags ? "_wide" : "_narrow");
    });

}  // namespace
}  // namespace psmd
