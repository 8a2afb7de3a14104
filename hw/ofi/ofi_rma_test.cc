// RMA over the ofi backend (Fabric::RegisterRegion, PostRead): a region
// registered by one node read by the other in pieces, byte for byte; ranges
// outside a region refused before they reach the provider; a forged key and
// a peer gone mid-read end the read with an error within timeout_ms. Runs
// over the provider PSMD_TEST_OFI_PROVIDER names (hw/ofi/BUILD.bazel).
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "hw/fabric.h"
#include "hw/socket/fabric_test_util.h"

namespace psmd::hw {
namespace {

using testing::Expect;
using testing::Link;
using testing::Node;
using testing::OpenNode;
using testing::PumpUntil;

constexpr uint32_t kTimeoutMs = 2000;

FabricOptions NoAuth() {
  FabricOptions o;
  o.rma = true;
  o.auth = AuthMode::kNone;
  o.timeout_ms = kTimeoutMs;
  return o;
}

std::vector<uint8_t> Pattern(size_t n, uint32_t seed) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; i++) v[i] = static_cast<uint8_t>(i * 131 + seed);
  return v;
}

struct Pair {
  std::unique_ptr<Node> a, b;  // b reads from a
  ConnId ab = 0, ba = 0;
};

Pair Open() {
  Pair p;
  p.a = OpenNode(1, {"127.0.0.2"}, NoAuth());
  p.b = OpenNode(2, {"127.0.0.3"}, NoAuth());
  Link(p.a.get(), p.b.get(), &p.ab, &p.ba);
  return p;
}

// src registered on a (the node read from), dst on b.
struct Regions {
  RegionId sid = 0, did = 0;
  RemoteRegion sr, dr;
};
void RegisterBoth(Pair& p, std::vector<uint8_t>* src, std::vector<uint8_t>* dst,
                  Regions* out) {
  ASSERT_EQ(p.a->fabric->RegisterRegion(src->data(), src->size(), &out->sid,
                                        &out->sr),
            ErrorClass::kOk);
  ASSERT_EQ(p.b->fabric->RegisterRegion(dst->data(), dst->size(), &out->did,
                                        &out->dr),
            ErrorClass::kOk);
}

// Reads all of `src` (a's) into `dst` (b's), at most `piece` bytes a read
// and as many outstanding as the fabric takes; true when every read ended
// kOk.
bool ReadAll(Pair& p, RegionId dst, const RemoteRegion& src, size_t length,
             size_t piece) {
  size_t posted = 0, done = 0;
  bool ok = true;
  while (done < length) {
    while (posted < length) {
      const size_t n = std::min(piece, length - posted);
      ErrorClass e =
          p.b->fabric->PostRead(p.ba, dst, posted, src, posted, n, posted);
      if (e == ErrorClass::kBusy) break;
      EXPECT_EQ(e, ErrorClass::kOk) << ErrorClassName(e);
      if (e != ErrorClass::kOk) return false;
      posted += n;
    }
    Event ev;
    if (!Expect({p.a.get(), p.b.get()}, p.b.get(), EventType::kReadDone, &ev)) {
      ADD_FAILURE() << "no kReadDone";
      return false;
    }
    EXPECT_EQ(ev.error, ErrorClass::kOk) << ErrorClassName(ev.error);
    ok = ok && ev.error == ErrorClass::kOk;
    done += ev.length == 0 ? length : ev.length;
  }
  return ok;
}

TEST(OfiRma, ReadsARegionByteForByteAroundPieceBoundaries) {
  Pair p = Open();
  ASSERT_TRUE(p.a->fabric->CanRead());
  ASSERT_TRUE(p.b->fabric->CanRead());
  const size_t max = p.b->fabric->MaxReadLength();
  ASSERT_GE(max, 4096u);
  const size_t total = (4u << 20) + 3;
  std::vector<uint8_t> src = Pattern(total, 7);
  RegionId sid, did;
  RemoteRegion sr, dr;
  ASSERT_EQ(p.a->fabric->RegisterRegion(src.data(), src.size(), &sid, &sr),
            ErrorClass::kOk);
  for (size_t piece : {size_t{1} << 16, (size_t{1} << 18) - 1, max}) {
    SCOPED_TRACE(piece);
    std::vector<uint8_t> dst(total, 0);
    ASSERT_EQ(p.b->fabric->RegisterRegion(dst.data(), dst.size(), &did, &dr),
              ErrorClass::kOk);
    ASSERT_TRUE(ReadAll(p, did, sr, total, piece));
    EXPECT_EQ(std::memcmp(dst.data(), src.data(), total), 0);
    EXPECT_EQ(p.b->fabric->DeregisterRegion(did), ErrorClass::kOk);
  }
  EXPECT_EQ(p.a->fabric->DeregisterRegion(sid), ErrorClass::kOk);
  EXPECT_EQ(p.a->fabric->DeregisterRegion(sid), ErrorClass::kBadArg);
}

// The key is all a reader needs over these providers (they take psmd's
// key, and without FI_MR_VIRT_ADDR the address is an offset), and anyone
// who reaches the endpoint may read: keys come from the kernel's random
// source, not a counter that names the next region (a key under 2^32
// fails this one time in 2^32 per region).
TEST(OfiRma, TheKeysOfRegionsCannotBeGuessed) {
  Pair p = Open();
  std::vector<uint8_t> buf(4 << 12);
  std::vector<uint64_t> keys;
  for (int i = 0; i < 4; i++) {
    RegionId id;
    RemoteRegion r;
    ASSERT_EQ(
        p.a->fabric->RegisterRegion(buf.data() + (i << 12), 4096, &id, &r),
        ErrorClass::kOk);
    EXPECT_GE(r.key, uint64_t{1} << 32) << "region " << i;
    for (uint64_t k : keys) EXPECT_NE(r.key, k);
    keys.push_back(r.key);
  }
}

TEST(OfiRma, RangesOutsideTheirRegionAreRefused) {
  Pair p = Open();
  std::vector<uint8_t> src(8192), dst(8192);
  Regions g;
  ASSERT_NO_FATAL_FAILURE(RegisterBoth(p, &src, &dst, &g));
  const RegionId did = g.did;
  const RemoteRegion sr = g.sr;
  Fabric& f = *p.b->fabric;
  EXPECT_EQ(f.PostRead(p.ba, did, 0, sr, 4096, 4097, 0), ErrorClass::kBadArg);
  EXPECT_EQ(f.PostRead(p.ba, did, 4097, sr, 0, 4096, 0), ErrorClass::kBadArg);
  EXPECT_EQ(f.PostRead(p.ba, did, 0, sr, UINT64_MAX, 2, 0),
            ErrorClass::kBadArg);
  EXPECT_EQ(f.PostRead(p.ba, did, 0, sr, 0, 0, 0), ErrorClass::kBadArg);
  EXPECT_EQ(f.PostRead(p.ba, did + 100, 0, sr, 0, 1, 0), ErrorClass::kBadArg);
  RemoteRegion wraps = sr;
  wraps.addr = UINT64_MAX - 10;
  EXPECT_EQ(f.PostRead(p.ba, did, 0, wraps, 0, 1, 0), ErrorClass::kBadArg);
  EXPECT_EQ(f.PostRead(p.ba + 100, did, 0, sr, 0, 1, 0), ErrorClass::kBadConn);
  EXPECT_EQ(f.PostRead(p.ba, did, 0, sr, 0, 8192, 9), ErrorClass::kOk);
  Event ev;
  ASSERT_TRUE(
      Expect({p.a.get(), p.b.get()}, p.b.get(), EventType::kReadDone, &ev));
  EXPECT_EQ(ev.error, ErrorClass::kOk);
  EXPECT_EQ(ev.cookie, 9u);
  EXPECT_EQ(ev.length, 8192u);
}

// A key the peer never handed out: the read fails (the provider refuses
// it, or it never completes and the deadline ends it), within the bound.
// Nothing is written. (ofi_rxd's peer then falls silent and the connection
// is closed: the key was the reader's peer's to get right.)
TEST(OfiRma, AForgedKeyEndsTheReadWithAnError) {
  Pair p = Open();
  std::vector<uint8_t> src(4096, 1), dst(4096);
  Regions g;
  ASSERT_NO_FATAL_FAILURE(RegisterBoth(p, &src, &dst, &g));
  const RegionId did = g.did;
  const RemoteRegion sr = g.sr;
  RemoteRegion forged = sr;
  forged.key ^= 0x5a5a5a5a;
  const auto start = std::chrono::steady_clock::now();
  ASSERT_EQ(p.b->fabric->PostRead(p.ba, did, 0, forged, 0, 4096, 1),
            ErrorClass::kOk);
  Event ev;
  ASSERT_TRUE(Expect({p.a.get(), p.b.get()}, p.b.get(), EventType::kReadDone,
                     &ev, 3 * kTimeoutMs));
  EXPECT_NE(ev.error, ErrorClass::kOk);
  EXPECT_LT(std::chrono::steady_clock::now() - start,
            std::chrono::milliseconds(2 * kTimeoutMs));
  EXPECT_EQ(dst, std::vector<uint8_t>(4096, 0));
}

// The node read from goes away with reads outstanding: every read ends
// (kOk if it was served first, an error otherwise) within the bound.
TEST(OfiRma, APeerGoneMidReadEndsEveryReadWithinTheBound) {
  Pair p = Open();
  const size_t total = 16u << 20;
  std::vector<uint8_t> src(total, 3), dst(total);
  Regions g;
  ASSERT_NO_FATAL_FAILURE(RegisterBoth(p, &src, &dst, &g));
  const RegionId did = g.did;
  const RemoteRegion sr = g.sr;
  const size_t piece = 256u << 10;
  size_t posted = 0;
  while (posted < total && p.b->fabric->PostRead(p.ba, did, posted, sr, posted,
                                                 piece, 0) == ErrorClass::kOk) {
    posted += piece;
  }
  ASSERT_GT(posted, 0u);
  p.a.reset();
  const auto start = std::chrono::steady_clock::now();
  size_t ended = 0;
  EXPECT_TRUE(PumpUntil(
      {p.b.get()},
      [&] {
        Event ev;
        while (p.b->Take(EventType::kReadDone, &ev)) ended++;
        return ended == posted / piece;
      },
      3 * kTimeoutMs));
  EXPECT_LT(std::chrono::steady_clock::now() - start,
            std::chrono::milliseconds(2 * kTimeoutMs + 1000));
  // Reads the provider has not given back yet (ofi_rxd keeps those to a
  // dead peer) hold the region; tcp;ofi_rxm gave every one back.
  const ErrorClass dereg = p.b->fabric->DeregisterRegion(did);
  if (testing::OfiProvider() == "tcp;ofi_rxm") {
    EXPECT_EQ(dereg, ErrorClass::kOk);
  } else {
    EXPECT_TRUE(dereg == ErrorClass::kOk || dereg == ErrorClass::kBusy)
        << ErrorClassName(dereg);
  }
}

}  // namespace
}  // namespace psmd::hw
