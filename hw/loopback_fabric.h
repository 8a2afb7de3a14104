// An in-process backend of hw::Fabric: the fabrics made by one
// LoopbackNetwork reach each other by node id and move frames between
// their in-memory queues (a frame's bytes are copied at PostSend, so its
// buffers are free at once; kSendDone still comes at the next Poll, as the
// interface promises). It honours the interface's receive model (nothing is
// delivered without a posted receive; header first, then PostPayload), so
// an engine above it sees the same event sequences as over sockets, with no
// kernel, port or credential involved. For tests of the inter-node engine
// (daemon/remote/remote_test.cc).
//
// Host descriptions are "NODE@127.0.0.1:NODE": only the node id matters.
// Destroying a fabric closes its connections: each peer sees kClosed with
// kPeerClosed (a node that died); Sever(node) makes both ends see kConnReset.
//
// Thread-safety: not thread-safe. A LoopbackNetwork and every fabric it made
// are used by one thread; the network must outlive its fabrics.
#ifndef PSMD_HW_LOOPBACK_FABRIC_H_
#define PSMD_HW_LOOPBACK_FABRIC_H_

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "hw/fabric.h"

namespace psmd::hw {

class LoopbackFabric;

class LoopbackNetwork {
 public:
  // A fabric for `node_id` (non-zero, unique in this network).
  std::unique_ptr<LoopbackFabric> Create(uint64_t node_id);

 private:
  friend class LoopbackFabric;
  std::map<uint64_t, LoopbackFabric*> nodes_;
  ConnId next_conn_ = 1;
};

class LoopbackFabric : public Fabric {
 public:
  ~LoopbackFabric() override;

  std::string HostDescription() const override;
  int event_fd() const override { return event_fd_; }
  ErrorClass Connect(const std::string& host_description, uint64_t cookie,
                     ConnId* conn) override;
  ErrorClass PostSend(ConnId conn, const FrameFields& fields, const iovec* iov,
                      int iovcnt, uint64_t cookie) override;
  ErrorClass PostRecv(ConnId conn, const iovec* iov, int iovcnt,
                      uint64_t cookie) override;
  ErrorClass PostRecvHeader(ConnId conn, uint64_t cookie) override;
  ErrorClass PostPayload(ConnId conn, const iovec* iov, int iovcnt,
                         uint64_t cookie) override;
  ErrorClass Close(ConnId conn) override;
  int Poll(Event* events, int max) override;
  int Wait(Event* events, int max, int timeout_ms) override;
  std::vector<PeerStats> Stats() const override;

  // Breaks the connection to `node` as a reset would: both ends get
  // kClosed with kConnReset.
  void Sever(uint64_t node);
  // Frames sent to this fabric and not yet received, on every connection.
  size_t frames_waiting() const;

 private:
  friend class LoopbackNetwork;
  LoopbackFabric(LoopbackNetwork* net, uint64_t node_id);

  struct Frame {
    FrameFields fields;
    std::vector<uint8_t> payload;
  };
  enum class Rx { kNone, kWhole, kHeader, kPayloadDue };
  struct Conn {
    uint64_t peer_node = 0;
    std::deque<Frame> inbound;  // sent by the peer, not yet received
    Rx rx = Rx::kNone;
    uint64_t rx_cookie = 0;
    std::vector<iovec> rx_iov;  // kWhole
  };

  // Delivers what posted receives can take, then signals event_fd.
  void Pump();
  void Push(const Event& e);
  // Ends `conn` here with kClosed(error); the peer's end is not touched.
  void Drop(ConnId conn, ErrorClass error);
  static uint32_t CopyOut(const std::vector<uint8_t>& from, const iovec* iov,
                          int iovcnt);

  LoopbackNetwork* const net_;
  const uint64_t node_id_;
  int event_fd_ = -1;
  std::map<ConnId, Conn> conns_;
  std::deque<Event> events_;
  std::map<uint64_t, PeerStats> stats_;
};

}  // namespace psmd::hw

#endif  // PSMD_HW_LOOPBACK_FABRIC_H_
