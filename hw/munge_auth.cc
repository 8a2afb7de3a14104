#include "hw/munge_auth.h"

#include <munge.h>
#include <unistd.h>

#include <cstdlib>

namespace psmd::hw {

MungeAuth::MungeAuth(std::string socket_path, int notify_fd)
    : socket_path_(std::move(socket_path)), notify_fd_(notify_fd) {
  thread_ = std::thread([this] { Run(); });
}

MungeAuth::~MungeAuth() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_one();
  thread_.join();
}

void MungeAuth::Encode(uint64_t token, std::string payload) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    requests_.push_back({token, true, std::move(payload)});
  }
  cv_.notify_one();
}

void MungeAuth::Decode(uint64_t token, std::string credential) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    requests_.push_back({token, false, std::move(credential)});
  }
  cv_.notify_one();
}

void MungeAuth::TakeResults(std::vector<Result>* out) {
  std::lock_guard<std::mutex> lock(mu_);
  for (Result& r : results_) out->push_back(std::move(r));
  results_.clear();
}

void MungeAuth::Run() {
  munge_ctx_t ctx = munge_ctx_create();
  if (ctx != nullptr && !socket_path_.empty()) {
    munge_ctx_set(ctx, MUNGE_OPT_SOCKET, socket_path_.c_str());
  }
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    cv_.wait(lock, [this] { return stop_ || !requests_.empty(); });
    if (stop_) break;
    Request req = std::move(requests_.front());
    requests_.pop_front();
    lock.unlock();

    Result r;
    r.token = req.token;
    if (ctx == nullptr) {
      r.error = "cannot create a MUNGE context (out of memory)";
    } else if (req.encode) {
      char* cred = nullptr;
      munge_err_t e = munge_encode(&cred, ctx, req.data.data(),
                                   static_cast<int>(req.data.size()));
      r.ok = e == EMUNGE_SUCCESS;
      if (r.ok) {
        r.data = cred;
      } else {
        r.error = munge_ctx_strerror(ctx) ? munge_ctx_strerror(ctx)
                                          : munge_strerror(e);
      }
      std::free(cred);
    } else {
      void* buf = nullptr;
      int len = 0;
      uid_t uid = 0;
      gid_t gid = 0;
      munge_err_t e =
          munge_decode(req.data.c_str(), ctx, &buf, &len, &uid, &gid);
      r.ok = e == EMUNGE_SUCCESS;
      if (r.ok) {
        r.data.assign(static_cast<const char*>(buf), len);
        r.uid = uid;
      } else {
        r.error = munge_ctx_strerror(ctx) ? munge_ctx_strerror(ctx)
                                          : munge_strerror(e);
      }
      std::free(buf);
    }

    lock.lock();
    results_.push_back(std::move(r));
    uint64_t one = 1;
    ssize_t n = write(notify_fd_, &one, sizeof one);
    (void)n;  // an eventfd write only fails when the counter would overflow
  }
  if (ctx != nullptr) munge_ctx_destroy(ctx);
}

}  // namespace psmd::hw
