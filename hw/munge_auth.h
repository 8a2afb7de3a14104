// MUNGE credentials for the fabric backends' handshakes, off the progress
// thread: encoding and decoding talk to munged over a Unix socket and may
// take milliseconds, so a helper thread does them and the fabric collects
// the results without blocking (TakeResults), woken by `notify_fd`.
//
// Thread-safety: Encode, Decode and TakeResults may be called from any one
// thread (the fabric's); the helper thread is private.
#ifndef PSMD_HW_MUNGE_AUTH_H_
#define PSMD_HW_MUNGE_AUTH_H_

#include <sys/types.h>

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace psmd::hw {

class MungeAuth {
 public:
  struct Result {
    uint64_t token = 0;
    bool ok = false;
    std::string data;   // encode: the credential; decode: its payload
    uid_t uid = 0;      // decode: the uid the credential vouches for
    std::string error;  // !ok: munge's message
  };

  // `socket_path` empty: libmunge's default socket. `notify_fd` (an
  // eventfd) is written once per finished request.
  MungeAuth(std::string socket_path, int notify_fd);
  ~MungeAuth();  // finishes nothing further; joins the helper
  MungeAuth(const MungeAuth&) = delete;
  MungeAuth& operator=(const MungeAuth&) = delete;

  void Encode(uint64_t token, std::string payload);
  void Decode(uint64_t token, std::string credential);
  // Moves finished results into *out; never blocks on munged.
  void TakeResults(std::vector<Result>* out);

 private:
  struct Request {
    uint64_t token;
    bool encode;
    std::string data;
  };
  void Run();

  const std::string socket_path_;
  const int notify_fd_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Request> requests_;  // guarded by mu_
  std::vector<Result> results_;   // guarded by mu_
  bool stop_ = false;             // guarded by mu_
  std::thread thread_;
};

}  // namespace psmd::hw

#endif  // PSMD_HW_MUNGE_AUTH_H_
