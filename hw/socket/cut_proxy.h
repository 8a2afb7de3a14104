// A TCP relay that a test puts between a fabric's dialler and the node it
// dials, and whose relayed connections the test cuts while the relay keeps
// listening: what a middlebox's reset, a flushed conntrack table or a
// brief outage does to a connection between two live daemons. Each cut
// closes both sockets of every pair, alternately with a reset (SO_LINGER
// 0: the fabric sees ECONNRESET) and an orderly close (end of file), so
// both ways a connection can break are driven.
//
// Thread-safety: the relay runs on a thread of its own; Cut and cuts may be
// called from any thread.
#ifndef PSMD_HW_SOCKET_CUT_PROXY_H_
#define PSMD_HW_SOCKET_CUT_PROXY_H_

#include <atomic>
#include <cstdint>
#include <string>
#include <thread>

namespace psmd::hw::testing {

class CutProxy {
 public:
  // Listens on listen_host at a free port; relays to upstream_host:port.
  CutProxy(const std::string& listen_host, const std::string& upstream_host,
           uint16_t upstream_port);
  ~CutProxy();
  CutProxy(const CutProxy&) = delete;
  CutProxy& operator=(const CutProxy&) = delete;

  bool ok() const { return listen_fd_ >= 0; }
  uint16_t port() const { return port_; }
  // Asks the relay to cut every pair it relays now; returns at once.
  void Cut();
  // Pairs cut so far (a cut with nothing relayed counts none).
  int cuts() const { return cuts_.load(); }

 private:
  void Run();

  std::string upstream_host_;
  uint16_t upstream_port_ = 0;
  int listen_fd_ = -1;
  int wake_fd_ = -1;  // an eventfd: Cut and the destructor
  uint16_t port_ = 0;
  std::atomic<int> cut_requests_{0};
  std::atomic<int> cuts_{0};
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace psmd::hw::testing

#endif  // PSMD_HW_SOCKET_CUT_PROXY_H_
