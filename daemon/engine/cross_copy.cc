#include "daemon/engine/cross_copy.h"

#include <linux/capability.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

namespace psmd {

namespace {

// Linux 6.5 and later; older headers lack the name.
#ifndef SO_PEERPIDFD
constexpr int SO_PEERPIDFD = 77;
#endif

// A pidfd turns readable when its process has exited. While it has not,
// its pid cannot have been given to another process, so a call that started
// after an "alive" answer and ended before another reached that process.
bool Alive(int pidfd) {
  pollfd p{pidfd, POLLIN, 0};
  return poll(&p, 1, 0) == 0;
}

// Its process has not exited and its endpoint is not removed (invariant 4).
bool Alive(const CopySide& side) {
  if (side.removed != nullptr &&
      side.removed->load(std::memory_order_acquire)) {
    return false;
  }
  return Alive(side.pidfd);
}

}  // namespace

bool CrossCopier::Permitted() {
  __user_cap_header_struct header{_LINUX_CAPABILITY_VERSION_3, 0};
  __user_cap_data_struct data[2]{};
  if (syscall(SYS_capget, &header, data) != 0) return false;
  return (data[CAP_SYS_PTRACE / 32].effective &
          (1u << (CAP_SYS_PTRACE % 32))) != 0;
}

int CrossCopier::PeerPidfd(int fd) {
  int pidfd = -1;
  socklen_t len = sizeof(pidfd);
  if (getsockopt(fd, SOL_SOCKET, SO_PEERPIDFD, &pidfd, &len) == 0) {
    return pidfd;
  }
  return -1;  // an older kernel: no copying for this process
}

CrossCopier::CrossCopier(std::function<void()> wake, size_t chunk_bytes)
    : wake_(std::move(wake)),
      bounce_bytes_(chunk_bytes),
      bounce_(new uint8_t[chunk_bytes]) {}

CrossCopier::~CrossCopier() {
  {
    MutexLock lock(&mu_);
    stop_ = true;
  }
  cv_.NotifyAll();
  if (thread_.joinable()) thread_.join();
}

std::deque<CrossCopier::Active>& CrossCopier::QueueOf(const void* group) {
  for (auto& g : groups_) {
    if (!g.empty() && g.front().copy.group == group) return g;
  }
  return groups_.emplace_back();
}

void CrossCopier::Submit(const Copy& copy) {
  {
    MutexLock lock(&mu_);
    QueueOf(copy.group).push_back(Active{copy});
  }
  // The thread starts with the first copy: a shard that never copies has
  // none to start and join (the engine fuzz harness makes thousands of
  // copiers, whose threads' starts and joins cost its CI run most of its
  // time on a loaded machine).
  std::call_once(started_, [this] {
    thread_ = std::thread([this] { Loop(); });
    pthread_setname_np(thread_.native_handle(), "psmd-copy");
  });
  cv_.NotifyAll();
}

std::vector<uint64_t> CrossCopier::Cancel(uint32_t endpoint_id) {
  auto involves = [&](const Active& a) {
    return a.copy.from.endpoint_id == endpoint_id ||
           a.copy.to.endpoint_id == endpoint_id;
  };
  MutexLock lock(&mu_);
  // The chunk in flight stays in its queue until it returns (Loop).
  while (busy_ && involves(flight_)) cv_.Wait(&mu_);
  std::vector<uint64_t> dropped;
  for (auto& g : groups_) {
    for (auto it = g.begin(); it != g.end();) {
      if (involves(*it)) {
        dropped.push_back(it->copy.id);
        it = g.erase(it);
      } else {
        ++it;
      }
    }
  }
  groups_.erase(std::remove_if(groups_.begin(), groups_.end(),
                               [](auto& g) { return g.empty(); }),
                groups_.end());
  return dropped;
}

std::vector<CrossCopier::Done> CrossCopier::TakeDone() {
  MutexLock lock(&mu_);
  done_pending_.store(false, std::memory_order_relaxed);
  return std::move(done_);
}

namespace {

// Moves `len` bytes at `offset` of both sides through `bounce`.
int Move(const CopySide& from_side, const CopySide& to_side, uint64_t offset,
         uint8_t* bounce, size_t len, bool* reading) {
  iovec local{bounce, len};
  iovec from{reinterpret_cast<void*>(from_side.addr + offset), len};
  iovec to{reinterpret_cast<void*>(to_side.addr + offset), len};
  *reading = true;
  if (!Alive(from_side)) return ESRCH;
  ssize_t n = process_vm_readv(from_side.pid, &local, 1, &from, 1, 0);
  if (n < 0) return errno;
  // Read from the attached process only if it is still that process.
  if (!Alive(from_side)) return ESRCH;
  if (static_cast<size_t>(n) != len) return EFAULT;  // a range partly mapped
  *reading = false;
  if (!Alive(to_side)) return ESRCH;
  n = process_vm_writev(to_side.pid, &local, 1, &to, 1, 0);
  if (n < 0) return errno;
  if (static_cast<size_t>(n) != len) return EFAULT;
  return 0;
}

}  // namespace

int CrossCopier::CopyOneByte(const CopySide& from, const CopySide& to,
                             uint64_t offset, bool* reading) {
  uint8_t byte;
  return Move(from, to, offset, &byte, 1, reading);
}

int CrossCopier::CopyChunk(Active& a, bool* reading) {
  const size_t len = std::min<uint64_t>(bounce_bytes_, a.copy.len - a.done);
  const int error =
      Move(a.copy.from, a.copy.to, a.done, bounce_.get(), len, reading);
  if (error == 0) a.done += len;
  return error;
}

void CrossCopier::Loop() {
  mu_.Lock();
  for (;;) {
    while (!stop_ && groups_.empty()) cv_.Wait(&mu_);
    if (stop_) break;
    // The front group's first copy moves one chunk while its group waits at
    // the back (invariant 1).
    std::deque<Active> turn = std::move(groups_.front());
    groups_.pop_front();
    flight_ = turn.front();
    turn.pop_front();
    if (!turn.empty()) groups_.push_back(std::move(turn));
    busy_ = true;
    // The chunk moves on a copy, outside the lock: Cancel reads only
    // flight_'s identity meanwhile, and its progress is written back below.
    Active moving = flight_;
    mu_.Unlock();
    bool reading = false;
    const int error = CopyChunk(moving, &reading);
    mu_.Lock();
    flight_.done = moving.done;
    busy_ = false;
    const bool ended = error != 0 || flight_.done == flight_.copy.len;
    if (ended) {
      done_.push_back(
          Done{flight_.copy.id, flight_.done, error, error != 0 && reading});
      done_pending_.store(true, std::memory_order_release);
    } else {
      QueueOf(flight_.copy.group).push_front(flight_);
    }
    cv_.NotifyAll();  // a Cancel may wait for this chunk
    if (ended) {
      mu_.Unlock();
      wake_();
      mu_.Lock();
    }
  }
  mu_.Unlock();
}

}  // namespace psmd
