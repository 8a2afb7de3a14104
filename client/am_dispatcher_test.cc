// The library's delivery of active messages: a completion as psmd publishes
// it (arguments and payload inline, or in a pool chunk) reaches the right
// handler with the right arguments, payload and token.
#include "client/am_dispatcher.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <vector>

#include "shm/mapping.h"
#include "shm/pool.h"

namespace psmd::client {
namespace {

// What the last handler call saw.
struct Seen {
  int calls = 0;
  std::vector<uint64_t> args;
  std::string payload;
  AmToken token{};
  void* hctx = nullptr;
};
Seen seen;

int Record(psm2_am_token_t token, psm2_amarg_t* args, int nargs, void* src,
           uint32_t len) {
  seen.calls++;
  seen.args.clear();
  for (int i = 0; i < nargs; i++) seen.args.push_back(args[i].u64);
  seen.payload.assign(static_cast<const char*>(src), len);
  seen.token = *static_cast<AmToken*>(token);
  return 0;
}

int Record2(psm2_am_token_t token, psm2_amarg_t* args, int nargs, void* src,
            uint32_t len, void* hctx) {
  seen.hctx = hctx;
  return Record(token, args, nargs, src, len);
}

// A request for `handler` from endpoint 7 (epid 0x77), arguments then
// payload in `blob` (inline when null).
shm::CompletionDesc Request(uint32_t handler, const std::vector<uint64_t>& args,
                            const std::string& payload,
                            uint8_t* blob = nullptr) {
  shm::CompletionDesc c{};
  c.op = shm::CompleteOp::kAmRequest;
  c.tag[0] = handler;
  c.tag[1] = static_cast<uint32_t>(args.size());
  c.tag[2] = 7;
  c.src_epid = 0x77;
  c.msg_len =
      static_cast<uint32_t>(args.size() * shm::kAmArgBytes + payload.size());
  if (blob == nullptr) blob = c.body.inline_data;
  // (memcpy from an empty vector's null data() is undefined: UBSan.)
  if (!args.empty())
    std::memcpy(blob, args.data(), args.size() * shm::kAmArgBytes);
  if (!payload.empty()) {
    std::memcpy(blob + args.size() * shm::kAmArgBytes, payload.data(),
                payload.size());
  }
  return c;
}

class AmDispatcherTest : public ::testing::Test {
 protected:
  void SetUp() override {
    seen = Seen{};
    int indices[2];
    ASSERT_TRUE(
        am_.Register({{Record, nullptr, nullptr}, {nullptr, Record2, &hctx_}},
                     indices)
            .ok());
    EXPECT_EQ(indices[0], 0);
    EXPECT_EQ(indices[1], 1);
  }

  AmDispatcher am_;
  int hctx_ = 0;
  psm2_ep_t ep_ = reinterpret_cast<psm2_ep_t>(0x1000);  // only passed through
};

TEST_F(AmDispatcherTest, InlineRequestReachesItsHandler) {
  shm::CompletionDesc c = Request(0, {11, 22}, "hello");
  c.flags = shm::kAmRequestNoReply;
  ASSERT_EQ(am_.Deliver(ep_, 1, c, shm::PoolPayload()), PSM2_OK);
  EXPECT_EQ(seen.calls, 1);
  EXPECT_EQ(seen.args, (std::vector<uint64_t>{11, 22}));
  EXPECT_EQ(seen.payload, "hello");
  EXPECT_EQ(seen.token.ep, ep_);
  EXPECT_EQ(seen.token.src_endpoint, 7u);
  EXPECT_EQ(seen.token.src_epid, 0x77u);
  EXPECT_TRUE(seen.token.is_request);
  EXPECT_TRUE(seen.token.no_reply);
  EXPECT_FALSE(seen.token.replied);
}

TEST_F(AmDispatcherTest, PoolPayloadReachesTheSecondSignatureWithItsContext) {
  shm::Mapping pool;
  std::string error;
  ASSERT_TRUE(shm::Mapping::Create("am-test-pool", 1 << 20, geteuid(),
                                   getegid(), &pool, &error))
      << error;
  shm::SendArena arena(pool.base(), 0, 1 << 20);
  const std::string payload(shm::kAmMaxPayload, 'x');
  auto off = arena.Allocate(8 + payload.size());
  ASSERT_TRUE(off.has_value());
  shm::CompletionDesc c = Request(1, {5}, payload, pool.base() + *off);
  c.op = shm::CompleteOp::kAmReply;
  {
    shm::PoolPayload chunk(pool.base(), *off);
    ASSERT_EQ(am_.Deliver(ep_, 1, c, chunk), PSM2_OK);
    // Delivering does not release the chunk; the caller's handle does.
    EXPECT_NE(shm::ChunkOf(pool.base(), *off)->state.load(),
              shm::kChunkReleased);
  }
  EXPECT_EQ(shm::ChunkOf(pool.base(), *off)->state.load(), shm::kChunkReleased);
  EXPECT_EQ(seen.calls, 1);
  EXPECT_EQ(seen.args, (std::vector<uint64_t>{5}));
  EXPECT_EQ(seen.payload, payload);
  EXPECT_EQ(seen.hctx, &hctx_);
  EXPECT_FALSE(seen.token.is_request);
}

TEST_F(AmDispatcherTest, UnknownOrClearedHandlerIsAnErrorAndRunsNothing) {
  shm::CompletionDesc c = Request(2, {}, "");
  EXPECT_EQ(am_.Deliver(ep_, 1, c, shm::PoolPayload()), PSM2_PARAM_ERR);
  am_.Clear();
  c = Request(0, {}, "");
  EXPECT_EQ(am_.Deliver(ep_, 1, c, shm::PoolPayload()), PSM2_PARAM_ERR);
  EXPECT_EQ(seen.calls, 0);
}

TEST_F(AmDispatcherTest, RegisteringPastTheLimitAddsNone) {
  std::vector<AmDispatcher::Handler> many(shm::kAmMaxHandlers - 1,
                                          {Record, nullptr, nullptr});
  std::vector<int> indices(many.size(), -1);
  Status s = am_.Register(many, indices.data());
  EXPECT_EQ(s.code, PSM2_EP_NO_RESOURCES);
  EXPECT_EQ(indices[0], -1);
  many.resize(shm::kAmMaxHandlers - 2);
  ASSERT_TRUE(am_.Register(many, indices.data()).ok());
  EXPECT_EQ(indices.front(), 2);
  EXPECT_EQ(indices[many.size() - 1],
            static_cast<int>(shm::kAmMaxHandlers) - 1);
}

}  // namespace
}  // namespace psmd::client
