// Admission: the daemon's control socket. One Unix stream socket carries two
// kinds of connection, told apart by their first bytes:
//   - gRPC (HTTP/2 preface "PRI * HTTP/2.0"): handed to the gRPC server with
//     AddInsecureChannelFromFd, after recording the peer's SO_PEERCRED so
//     handlers know who is calling (gRPC itself cannot tell them);
//   - attach ("PSMDATT1" + token, shm/attach.h): answered with the segment
//     fds over SCM_RIGHTS, then kept open as the endpoint's liveness line.
//
// Thread-safety: one admission thread does all socket work. CredentialsOf is
// called from gRPC handler threads and takes a mutex.
//
// gRPC names a connection made from an fd "fd:N". So that N identifies one
// connection for as long as a handler might still run for it, accepted gRPC
// sockets are moved to fd numbers taken round-robin from a high range: a
// number comes back only after the whole range has cycled.
#ifndef PSMD_DAEMON_CONTROL_ADMISSION_H_
#define PSMD_DAEMON_CONTROL_ADMISSION_H_

#include <sys/un.h>

#include <chrono>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "base/mutex.h"
#include "daemon/config.h"
#include "daemon/control/registry.h"

namespace grpc {
class Server;
}

namespace psmd {

class Admission {
 public:
  Admission(const Config& config, Registry* registry);
  ~Admission();

  // Takes the listening socket systemd passed (socket activation, psmd.socket)
  // or creates one. An existing file at the path is removed only when it is a
  // socket nothing listens on; anything else is an error naming the fix.
  // `activated`: the sockets systemd passed (handover::TakeServiceManagerFds),
  // `activation_error` its error (a negative errno), if any.
  bool Bind(const std::vector<int>& activated, int activation_error,
            std::string* error);
  // Instead of Bind, in a psmd handed over to (daemon/handover/handover.h):
  // the old one's listening socket (`bound`: its file is psmd's to remove
  // at stop) and its endpoints' attach connections, watched from Start on.
  // A client that hung up meanwhile is found at once.
  // `pending`: connections accepted but not yet classified, classified
  // from Start on as if just accepted.
  void Adopt(int listen_fd, bool activated, bool bound,
             const std::vector<std::pair<int, uint32_t>>& liveness,
             const std::vector<int>& pending);
  // Hands over: stops the thread, but keeps the listening socket, every
  // attach connection and every connection not yet classified open (their
  // descriptors in *pending, for the successor), and the socket file where
  // it is. Connections that come meanwhile wait in the backlog. Start
  // resumes (a handover that failed before the exec).
  void Freeze(std::vector<int>* pending);
  int listen_fd() const { return listen_fd_; }
  bool bound() const { return bound_; }

  // Starts accepting; gRPC connections go to `server`.
  void Start(grpc::Server* server);
  // Stops accepting, closes every connection it owns, removes the socket file.
  void Stop();

  // True when the listening socket came from systemd (psmd.socket).
  bool activated() const { return activated_; }

  // Credentials of the gRPC peer named `peer` (ServerContext::peer()).
  bool CredentialsOf(const std::string& peer, Credentials* out);

 private:
  struct Pending {
    Credentials creds;
    std::chrono::steady_clock::time_point since;
  };
  bool TakeActivatedSocket(int fd, std::string* error);
  // Raises the descriptor limit and places the gRPC fd numbers above it.
  void PrepareFdNumbers();
  bool CreateSocket(std::string* error);
  bool RemoveStaleSocket(const sockaddr_un& addr, std::string* error);
  void Loop();
  void Accept();
  void Classify(int fd);
  void HandOverToGrpc(int fd, const Credentials& creds);
  void HandleAttach(int fd, const Credentials& creds);
  void DropPending(int fd);
  void SweepPending();
  // Takes the listening socket out of epoll for a while (fds exhausted), and
  // puts it back once that while is over.
  void PauseAccepting();
  void ResumeAcceptingIfDue();
  int MoveToHighFd(int fd);

  const Config config_;
  Registry* const registry_;
  grpc::Server* server_ = nullptr;
  int listen_fd_ = -1;
  int epoll_fd_ = -1;
  int stop_fd_ = -1;
  std::thread thread_;
  bool bound_ = false;      // we created the socket file (and remove it)
  bool activated_ = false;  // the socket came from systemd

  // Admission-thread state.
  std::unordered_map<int, Pending> pending_;
  std::unordered_map<int, uint32_t> liveness_;  // fd -> endpoint id
  int next_high_fd_ = 0;
  int high_fd_floor_ = 0;
  // Out of file descriptors: the listening socket is left out of epoll until
  // then (it would stay readable, and the loop would spin), and the failure
  // is logged once per pause.
  std::optional<std::chrono::steady_clock::time_point> accept_paused_until_;
  uint64_t refused_while_full_ = 0;

  // Whether this uid may hold one more control connection (gRPC or still
  // being classified); forgets the connections gRPC has closed since (their
  // fd is gone or is another file).
  bool UnderConnectionLimit(uid_t uid);
  // Closes a connection over the uid's limit; logs and counts it.
  void RefuseConnection(int fd, const Credentials& creds);

  // A connection handed to gRPC: who is calling, and the socket's inode, so
  // that a reused fd number is not taken for it.
  struct GrpcPeer {
    Credentials creds;
    ino_t inode;
  };
  Mutex creds_mu_;
  std::unordered_map<int, GrpcPeer> grpc_peers_ PSMD_GUARDED_BY(creds_mu_);
};

}  // namespace psmd

#endif  // PSMD_DAEMON_CONTROL_ADMISSION_H_
