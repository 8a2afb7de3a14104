// The in-process backend keeps the interface's promises the engine relies
// on: nothing is read without a posted receive, header first then payload,
// truncation, and closing seen from both ends.
#include "hw/loopback_fabric.h"

#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

namespace psmd::hw {
namespace {

std::vector<Event> PollAll(LoopbackFabric& f) {
  Event events[16];
  int n = f.Poll(events, 16);
  return std::vector<Event>(events, events + n);
}

TEST(LoopbackFabric, ConnectsSendsHeaderFirstAndCloses) {
  LoopbackNetwork net;
  auto a = net.Create(1);
  auto b = net.Create(2);
  ConnId conn = 0;
  ASSERT_EQ(a->Connect(b->HostDescription(), 77, &conn), ErrorClass::kOk);
  ConnId again = 0;
  EXPECT_EQ(a->Connect(b->HostDescription(), 78, &again),
            ErrorClass::kAlreadyConnected);
  EXPECT_EQ(again, conn);
  auto ea = PollAll(*a);
  ASSERT_EQ(ea.size(), 1u);
  EXPECT_EQ(ea[0].type, EventType::kConnected);
  EXPECT_EQ(ea[0].cookie, 77u);
  auto eb = PollAll(*b);
  ASSERT_EQ(eb.size(), 1u);
  EXPECT_EQ(eb[0].type, EventType::kAccepted);
  EXPECT_EQ(eb[0].peer_node, 1u);

  FrameFields fields;
  fields.op = 5;
  fields.aux = 9;
  std::string text = "hello, node 2";
  iovec iov{text.data(), text.size()};
  ASSERT_EQ(a->PostSend(conn, fields, &iov, 1, 1), ErrorClass::kOk);
  ea = PollAll(*a);
  ASSERT_EQ(ea.size(), 1u);
  EXPECT_EQ(ea[0].type, EventType::kSendDone);
  EXPECT_TRUE(PollAll(*b).empty());  // no receive posted: nothing read
  EXPECT_EQ(b->frames_waiting(), 1u);

  ASSERT_EQ(b->PostRecvHeader(conn, 3), ErrorClass::kOk);
  eb = PollAll(*b);
  ASSERT_EQ(eb.size(), 1u);
  EXPECT_EQ(eb[0].type, EventType::kHeader);
  EXPECT_EQ(eb[0].length, text.size());
  EXPECT_EQ(eb[0].fields.op, 5);
  EXPECT_EQ(eb[0].fields.aux, 9u);
  char small[5];
  iovec into{small, sizeof(small)};
  ASSERT_EQ(b->PostPayload(conn, &into, 1, 4), ErrorClass::kOk);
  eb = PollAll(*b);
  ASSERT_EQ(eb.size(), 1u);
  EXPECT_EQ(eb[0].type, EventType::kRecvDone);
  EXPECT_EQ(eb[0].error, ErrorClass::kTruncated);
  EXPECT_EQ(eb[0].length, sizeof(small));
  EXPECT_EQ(std::string(small, sizeof(small)), "hello");
  EXPECT_EQ(b->PostPayload(conn, &into, 1, 4), ErrorClass::kBadArg);

  a->Close(conn);
  ea = PollAll(*a);
  ASSERT_EQ(ea.size(), 1u);
  EXPECT_EQ(ea[0].type, EventType::kClosed);
  EXPECT_EQ(ea[0].error, ErrorClass::kCanceled);
  eb = PollAll(*b);
  ASSERT_EQ(eb.size(), 1u);
  EXPECT_EQ(eb[0].type, EventType::kClosed);
  EXPECT_EQ(eb[0].error, ErrorClass::kPeerClosed);
  EXPECT_EQ(a->PostSend(conn, fields, &iov, 1, 2), ErrorClass::kBadConn);
}

TEST(LoopbackFabric, ANodeThatGoesIsSeenClosedByItsPeers) {
  LoopbackNetwork net;
  auto a = net.Create(1);
  auto b = net.Create(2);
  ConnId conn = 0;
  ASSERT_EQ(b->Connect(a->HostDescription(), 1, &conn), ErrorClass::kOk);
  EXPECT_EQ(b->Connect("3@127.0.0.1:3", 2, &conn), ErrorClass::kConnFailed);
  PollAll(*a);
  PollAll(*b);
  b.reset();
  auto ea = PollAll(*a);
  ASSERT_EQ(ea.size(), 1u);
  EXPECT_EQ(ea[0].type, EventType::kClosed);
  EXPECT_EQ(ea[0].error, ErrorClass::kPeerClosed);
}

}  // namespace
}  // namespace psmd::hw
