// libFuzzer target for the inter-node wire decoders (wire.h): arbitrary
// bytes as the header fields and body of a frame from some node go through
// CheckHeader and DecodeEnvelope. Besides crashes and sanitizer reports, it
// checks that whatever decodes is what the encoder writes (the same bytes
// again) and what the op's builder makes from the decoded fields (so every
// envelope the decoder accepts is one a daemon could have sent, and the
// decoder accepts what the builders make). Built and run for a bounded
// time by daemon/remote/wire_fuzz.sh, from the seed corpus
// daemon/remote/wire_fuzz_corpus/ (WIRE_FUZZ_WRITE_SEEDS=DIR writes it).
//
// Input (little-endian): 0 from-node u16, 2 op u16, 4 uid u32, 8 src u64,
// 16 dst u64, 24 job[16], 40 offset u64, 48 aux u64; then the frame's body
// (its length is what is left). At exit the target prints how many inputs
// each op accepted and how many each refusal reason refused ("wire_fuzz:
// reached ..."), so that its script can fail a run that did not reach every
// op's decode path and every way of refusing.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "daemon/remote/wire.h"
#include "shm/epid.h"
#include "tests/fuzz_seeds.h"

namespace {

using namespace psmd;
using namespace psmd::wire;

constexpr size_t kFieldsSize = 56;
constexpr int kErrors = static_cast<int>(Error::kRange) + 1;

void Check(bool ok) {
  if (!ok) std::abort();
}

struct Reached {
  uint64_t accepted[kOpCount] = {};  // per op: header (data) or envelope
  uint64_t refused[kErrors] = {};    // per Error
  ~Reached() {
    std::string line = "wire_fuzz: reached ops=";
    for (uint16_t op = 1; op < kOpCount; op++) {
      line += (op > 1 ? "," : "") + std::to_string(accepted[op]);
    }
    line += " refused=";
    for (int e = 1; e < kErrors; e++) {
      line += (e > 1 ? "," : "") + std::to_string(refused[e]);
    }
    printf("%s\n", line.c_str());
  }
} reached;

template <typename T>
T Read(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

template <typename T>
void Write(std::string* out, T v) {
  out->append(reinterpret_cast<const char*>(&v), sizeof(v));
}

// What the op's builder makes of a decoded envelope's fields.
Envelope Rebuild(const Envelope& e) {
  const Sender from = SenderOf(e.f);
  const hw::FrameFields& f = e.f;
  const Record& r = e.r;
  switch (e.op()) {
    case Op::kQuery:
      return PrepQuery(from, f.dst, f.aux);
    case Op::kAnswer:
      return PrepAnswer(from, f.dst, f.aux, r.error);
    case Op::kEnvelope:
      return PrepMessage(from, f.dst, f.aux, r.tag, r.len, r.flags & ~kFlagRndv,
                         (r.flags & kFlagRndv) != 0, e.inline_data);
    case Op::kSyncAck:
      return PrepSyncAck(from, f.dst, f.aux);
    case Op::kRndvGo:
      return PrepRndvGo(from, f.dst, f.aux, r.len, r.x);
    case Op::kAmRequest:
    case Op::kAmReply:
      return PrepActiveMessage(e.op() == Op::kAmReply, from, f.dst, f.aux,
                               r.tag[0], r.tag[1], r.len, r.flags,
                               e.inline_data);
    case Op::kAmAck:
      return PrepAmAck(from, f.dst, f.aux, r.tag[0], r.error);
    case Op::kError:
      return PrepError(from, f.dst, f.aux, r.error);
    case Op::kAbort:
      return PrepAbort(from, f.dst, f.aux, r.error);
    case Op::kPing:
      return PrepPing();
    case Op::kGone:
      return PrepGone(from, r.error);
    // One case each (not one for the four): distinct code keeps each op's
    // seed in the corpus, which libFuzzer keeps by coverage.
    case Op::kXoff:
      return PrepFlow(Op::kXoff, from);
    case Op::kXon:
      return PrepFlow(Op::kXon, from, r.x);
    case Op::kEagerOff:
      return PrepFlow(Op::kEagerOff, from);
    case Op::kEagerOn:
      return PrepFlow(Op::kEagerOn, from);
    case Op::kRndvRead:
      return PrepRndvRead(from, f.dst, f.aux, f.offset, PieceOf(e), r.len, r.x,
                          RegionOf(e));
    case Op::kRndvReadDone:
      return PrepRndvReadDone(from, f.dst, f.aux, r.len, r.error);
    default:  // the data ops: no envelope
      std::abort();
  }
}

bool SameFields(const hw::FrameFields& a, const hw::FrameFields& b) {
  return a.op == b.op && a.uid == b.uid && a.src == b.src && a.dst == b.dst &&
         std::memcmp(a.job, b.job, sizeof(a.job)) == 0 &&
         a.offset == b.offset && a.aux == b.aux;
}

// One seed: the fields of `f` from node `from`, then `body`.
std::string Seed(uint16_t from, const hw::FrameFields& f,
                 const std::string& body) {
  std::string s;
  Write(&s, from);
  Write(&s, f.op);
  Write(&s, f.uid);
  Write(&s, f.src);
  Write(&s, f.dst);
  s.append(reinterpret_cast<const char*>(f.job), sizeof(f.job));
  Write(&s, f.offset);
  Write(&s, f.aux);
  return s + body;
}

std::string Seed(uint16_t from, const Envelope& e) {
  uint8_t body[kEnvelopeMax];
  const uint32_t n = Encode(e, body);
  return Seed(from, e.f, std::string(reinterpret_cast<char*>(body), n));
}

// A valid frame of every op, from node 2 to node 1.
std::vector<std::string> Seeds() {
  Sender a;
  a.epid = shm::MakeEpid(2, 7, 3);
  a.uid = 1000;
  a.job[0] = 0x42;
  const uint64_t b = shm::MakeEpid(1, 7, 5);
  const uint32_t tag[3] = {1, 2, 3};
  const uint8_t bytes[shm::kInlineMax] = {'x', 'y', 'z'};
  std::vector<std::string> seeds;
  auto add = [&](const Envelope& e) { seeds.push_back(Seed(2, e)); };
  add(PrepQuery(a, b, 1));
  add(PrepAnswer(a, b, 1, 0));
  add(PrepMessage(a, b, 9, tag, 3, shm::kSendSync, false, bytes));
  add(PrepMessage(a, b, 9, tag, 1 << 20, 0, true, nullptr));
  add(PrepMessage(a, b, 9, tag, 4096, 0, false, nullptr));
  seeds.push_back(Seed(2, PrepPayload(a, b, 9), std::string(64, 'p')));
  add(PrepSyncAck(a, b, 9));
  add(PrepRndvGo(a, b, 9, 1 << 20, 4));
  seeds.push_back(Seed(2, PrepRndvData(a, b, 4, 8192), std::string(64, 'c')));
  add(PrepActiveMessage(false, a, b, 9, 3, 2, 20, shm::kAmRequestWantsAck,
                        bytes));
  add(PrepActiveMessage(true, a, b, 9, 3, 1, 1000, 0, nullptr));
  add(PrepAmAck(a, b, 9, 3, 0));
  add(PrepError(a, b, 9, 1));
  add(PrepAbort(a, b, 4, 1));
  add(PrepPing());
  add(PrepGone(a, 1));
  for (Op op : {Op::kXoff, Op::kXon, Op::kEagerOff, Op::kEagerOn}) {
    add(PrepFlow(op, a));
  }
  Region region;
  region.addr = 0x7f0000000000;
  region.key = 0x1234;
  region.length = 64 << 20;
  add(PrepRndvRead(a, b, kRmaOfferBit | 4, 1 << 18, 77, 1 << 18, 3 << 20,
                   region));
  add(PrepRndvReadDone(a, b, 77, 1 << 18, 0));
  return seeds;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  fuzz::WriteSeedsIfAsked("WIRE_FUZZ_WRITE_SEEDS", "wire_fuzz", Seeds);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < kFieldsSize) return 0;
  const auto from = Read<uint16_t>(data);
  hw::FrameFields f;
  f.op = Read<uint16_t>(data + 2);
  f.uid = Read<uint32_t>(data + 4);
  f.src = Read<uint64_t>(data + 8);
  f.dst = Read<uint64_t>(data + 16);
  std::memcpy(f.job, data + 24, sizeof(f.job));
  f.offset = Read<uint64_t>(data + 40);
  f.aux = Read<uint64_t>(data + 48);
  const uint8_t* body = data + kFieldsSize;
  const auto length = static_cast<uint32_t>(size - kFieldsSize);
  const OpTraits& t = TraitsOf(f.op);
  const Error header = CheckHeader(from, f, length);
  if (t.shape != Shape::kEnvelope) {
    if (header == Error::kOk) {
      Check(t.shape == Shape::kData);
      Check(length >= t.min_length && length <= t.max_length);
      Check(shm::NodeIdOf(f.src) == from);
      ++reached.accepted[f.op];
    } else {
      ++reached.refused[static_cast<int>(header)];
    }
    return 0;
  }
  Envelope e;
  const Error error = DecodeEnvelope(from, f, body, length, &e);
  if (error != Error::kOk) {
    ++reached.refused[static_cast<int>(error)];
    return 0;
  }
  ++reached.accepted[f.op];
  Check(header == Error::kOk);
  Check(e.inline_len <= shm::kInlineMax);
  Check(e.inline_len == 0 ||
        (t.payload == Payload::kInlineOrFrame && !PayloadFollows(e)) ||
        (t.payload == Payload::kRegion && e.inline_len == kRegionBytes));
  if (e.op() == Op::kRndvRead) {  // the piece lies within its region
    const Region r = RegionOf(e);
    Check(e.r.len > 0 && r.addr <= UINT64_MAX - r.length &&
          uint64_t{e.r.x} + e.r.len <= r.length);
  }
  uint8_t again[kEnvelopeMax];
  Check(Encode(e, again) == length);
  Check(std::memcmp(again, body, length) == 0);
  const Envelope built = Rebuild(e);
  Check(SameFields(built.f, e.f));
  Check(Encode(built, again) == length);
  Check(std::memcmp(again, body, length) == 0);
  return 0;
}
