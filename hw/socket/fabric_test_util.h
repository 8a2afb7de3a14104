// Test helpers for the fabric backends: a fabric with its collected events,
// a pump that drives several fabrics until a condition holds, and a raw
// TCP peer that speaks (or abuses) the socket backend's wire format by hand.
// The backend is the socket one, or the ofi one (hw/ofi/) with the provider
// named by the environment variable PSMD_TEST_OFI_PROVIDER: the same test
// bodies run over both (hw/ofi/BUILD.bazel).
//
// Thread-safety: single-threaded test code.
#ifndef PSMD_HW_SOCKET_FABRIC_TEST_UTIL_H_
#define PSMD_HW_SOCKET_FABRIC_TEST_UTIL_H_

#include <chrono>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "hw/fabric.h"
#include "hw/frame.h"

namespace psmd::hw::testing {

struct Node {
  std::unique_ptr<Fabric> fabric;
  std::deque<Event> events;

  // Moves what the fabric has into `events` (how many); sleeps up to
  // wait_ms for the first (0: Poll, never sleeps).
  int Pump(int wait_ms);
  // The first collected event of `type` (removed), if any.
  bool Take(EventType type, Event* out);
  size_t Count(EventType type) const;
};

// The ofi provider the tests run over, empty for the socket backend.
std::string OfiProvider();
// Opens a fabric of the backend under test (null with *error).
std::unique_ptr<Fabric> OpenFabric(FabricOptions options, std::string* error);

// Opens a node listening on each of `listen`; fails the test on error.
std::unique_ptr<Node> OpenNode(uint64_t node_id,
                               std::vector<std::string> listen,
                               FabricOptions options = {});

// Pumps every node until done() holds or timeout_ms passes; returns done().
bool PumpUntil(const std::vector<Node*>& nodes,
               const std::function<bool()>& done, int timeout_ms = 5000);

// Waits for an event of `type` on `node` (pumping all of `nodes`).
bool Expect(const std::vector<Node*>& nodes, Node* node, EventType type,
            Event* out, int timeout_ms = 5000);

// Connects a to b (cookie 42); their connection ids in *at_a, *at_b.
void Link(Node* a, Node* b, ConnId* at_a, ConnId* at_b);

// Runs fn on a thread of its own (it may block, e.g. on a RawPeer) while
// pumping `nodes`; returns when fn has returned.
void WhilePumping(const std::vector<Node*>& nodes,
                  const std::function<void()>& fn);

// A blocking TCP client with 5 s timeouts, speaking frames by hand.
class RawPeer {
 public:
  ~RawPeer();
  bool Connect(const std::string& host, uint16_t port);
  bool Send(const void* data, size_t n);
  bool SendFrame(FrameType type, const std::string& payload,
                 const FrameFields& fields = {});
  // Reads one frame (header checked against default limits).
  bool ReadFrame(FrameHeader* header, std::string* payload);
  // True when the peer closed the connection (EOF or reset) within 5 s.
  bool ClosedByPeer();
  int fd() const { return fd_; }

 private:
  bool ReadAll(void* data, size_t n);
  int fd_ = -1;
};

// The first address (host, port) of a fabric's host description.
HostAddress FirstAddress(const Fabric& f);

}  // namespace psmd::hw::testing

#endif  // PSMD_HW_SOCKET_FABRIC_TEST_UTIL_H_
