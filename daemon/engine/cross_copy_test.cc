#include "daemon/engine/cross_copy.h"

#include <gtest/gtest.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <mutex>

namespace psmd {
namespace {

// A child process holding a buffer at `addr` (the same address as in this
// process: mapped before the fork), which writes it back to a pipe when told
// to, so that the test sees what the copier left in the child's memory.
class Child {
 public:
  Child(uint8_t* addr, size_t len) : addr_(addr), len_(len) {
    int sv[2];
    EXPECT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    pid_ = fork();
    if (pid_ == 0) {
      close(sv[0]);
      char c;
      while (read(sv[1], &c, 1) == 1) {
        if (c == 'q') _exit(0);
        for (size_t off = 0; off < len_;) {
          ssize_t n = write(sv[1], addr_ + off, len_ - off);
          if (n <= 0) _exit(1);
          off += n;
        }
      }
      _exit(0);
    }
    close(sv[1]);
    sock_ = sv[0];
    pidfd_ = CrossCopier::PeerPidfd(sock_);
  }
  ~Child() {
    if (pid_ > 0) Quit();
    close(sock_);
    if (pidfd_ >= 0) close(pidfd_);
  }
  // What the child's buffer holds now.
  std::vector<uint8_t> Contents() {
    std::vector<uint8_t> out(len_);
    EXPECT_EQ(write(sock_, "d", 1), 1);
    for (size_t off = 0; off < len_;) {
      ssize_t n = read(sock_, out.data() + off, len_ - off);
      if (n <= 0) break;
      off += n;
    }
    return out;
  }
  void Quit() {
    (void)!write(sock_, "q", 1);
    waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }
  CopySide Side(uint32_t endpoint, uint64_t offset = 0) const {
    return CopySide{endpoint, pid_, pidfd_,
                    reinterpret_cast<uint64_t>(addr_) + offset};
  }
  int pidfd() const { return pidfd_; }

 private:
  uint8_t* addr_;
  size_t len_;
  pid_t pid_ = -1;
  int sock_ = -1;
  int pidfd_ = -1;
};

class CrossCopyTest : public ::testing::Test {
 protected:
  static constexpr size_t kLen = 3 << 20;  // three bounce buffers and a bit
  void SetUp() override {
    src_ =
        static_cast<uint8_t*>(mmap(nullptr, kLen + 4096, PROT_READ | PROT_WRITE,
                                   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
    dst_ =
        static_cast<uint8_t*>(mmap(nullptr, kLen + 4096, PROT_READ | PROT_WRITE,
                                   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
    for (size_t i = 0; i < kLen; i++) src_[i] = static_cast<uint8_t>(i * 7 + 1);
    memset(dst_, 0, kLen);
    // The page past each buffer is not mapped: a range running into it fails.
    munmap(src_ + kLen, 4096);
    munmap(dst_ + kLen, 4096);
  }
  void TearDown() override {
    munmap(src_, kLen);
    munmap(dst_, kLen);
  }
  std::vector<CrossCopier::Done> WaitDone(CrossCopier& copier, size_t n) {
    std::vector<CrossCopier::Done> all;
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (all.size() < n && std::chrono::steady_clock::now() < deadline) {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait_for(lock, std::chrono::milliseconds(10),
                   [&] { return copier.done_pending(); });
      lock.unlock();
      for (auto& d : copier.TakeDone()) all.push_back(d);
    }
    return all;
  }
  // Runs one copy on a copier of its own (1 MiB chunks) to its end.
  CrossCopier::Done CopyAlone(const CopySide& from, const CopySide& to,
                              uint64_t len) {
    CrossCopier copier(Wake(), 1 << 20);
    int group = 0;
    copier.Submit({7, &group, from, to, len});
    auto done = WaitDone(copier, 1);
    EXPECT_EQ(done.size(), 1u);
    return done.empty() ? CrossCopier::Done{0, 0, -1, false} : done[0];
  }
  std::function<void()> Wake() {
    return [this] {
      std::lock_guard<std::mutex> lock(mu_);
      cv_.notify_all();
    };
  }
  uint8_t* src_ = nullptr;
  uint8_t* dst_ = nullptr;
  std::mutex mu_;
  std::condition_variable cv_;
};

TEST_F(CrossCopyTest, CopiesFromOneProcessIntoAnother) {
  Child from(src_, kLen), to(dst_, kLen);
  ASSERT_GE(from.pidfd(), 0) << "SO_PEERPIDFD: Linux 6.5 or later";
  CrossCopier copier(Wake(), 1 << 20);
  int kept = 0;
  copier.Submit({1, &kept, from.Side(1), to.Side(2), kLen});
  auto done = WaitDone(copier, 1);
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0].id, 1u);
  EXPECT_EQ(done[0].error, 0);
  EXPECT_EQ(done[0].copied, kLen);
  std::vector<uint8_t> got = to.Contents();
  EXPECT_EQ(memcmp(got.data(), src_, kLen), 0);
}

TEST_F(CrossCopyTest, ARangeOutsideTheSendersMemoryFailsWhileReading) {
  Child from(src_, kLen), to(dst_, kLen);
  // Starts in the last MiB and runs into the unmapped page.
  CrossCopier::Done done =
      CopyAlone(from.Side(1, kLen - (1 << 20) + 8), to.Side(2), 1 << 20);
  EXPECT_EQ(done.error, EFAULT);
  EXPECT_TRUE(done.failed_reading);
  EXPECT_EQ(done.copied, 0u);
}

TEST_F(CrossCopyTest, ARangeOutsideTheReceiversMemoryFailsWhileWriting) {
  Child from(src_, kLen), to(dst_, kLen);
  CrossCopier::Done done = CopyAlone(from.Side(1), to.Side(2, 4096), kLen);
  EXPECT_EQ(done.error, EFAULT);
  EXPECT_FALSE(done.failed_reading);
  EXPECT_EQ(done.copied, 2u << 20);  // the chunks before the bad one
}

TEST_F(CrossCopyTest, AProcessThatEndedIsNeverReadNorWritten) {
  Child from(src_, kLen), to(dst_, kLen);
  to.Quit();
  CrossCopier::Done done = CopyAlone(from.Side(1), to.Side(2), kLen);
  EXPECT_EQ(done.error, ESRCH);
  EXPECT_FALSE(done.failed_reading);
  EXPECT_EQ(done.copied, 0u);
}

// Invariant 4: a sender whose endpoint was removed (by another engine
// shard, which cannot Cancel this copier's copies) is read no more, though
// its process runs; the receiver gets nothing.
TEST_F(CrossCopyTest, ASideWhoseEndpointWasRemovedIsNeverReadNorWritten) {
  Child from(src_, kLen), to(dst_, kLen);
  ASSERT_GE(from.pidfd(), 0) << "SO_PEERPIDFD: Linux 6.5 or later";
  std::atomic<bool> removed{true};
  CopySide side = from.Side(1);
  side.removed = &removed;
  CrossCopier::Done done = CopyAlone(side, to.Side(2), kLen);
  EXPECT_EQ(done.error, ESRCH);
  EXPECT_TRUE(done.failed_reading);
  EXPECT_EQ(done.copied, 0u);
  EXPECT_EQ(to.Contents(), std::vector<uint8_t>(kLen, 0));
  // The same side, not removed, is copied.
  removed.store(false);
  done = CopyAlone(side, to.Side(2), kLen);
  EXPECT_EQ(done.error, 0);
  EXPECT_EQ(done.copied, kLen);
}

TEST_F(CrossCopyTest, CancelDropsTheEndpointsCopiesAndNothingMovesAfter) {
  // 64 MiB in 4 KiB chunks: 16384 turns each (tens of milliseconds), so
  // both copies are still queued when Cancel runs. Copy 1 fills the first
  // half of the receiver's buffer, copy 2 the second.
  constexpr size_t kBig = 64 << 20, kHalf = kBig / 2;
  auto* from_buf =
      static_cast<uint8_t*>(mmap(nullptr, kBig, PROT_READ | PROT_WRITE,
                                 MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  auto* to_buf =
      static_cast<uint8_t*>(mmap(nullptr, kBig, PROT_READ | PROT_WRITE,
                                 MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  memset(from_buf, 0x3c, kBig);
  memset(to_buf, 0, kBig);
  {
    Child from(from_buf, kBig), to(to_buf, kBig);
    CrossCopier copier(Wake(), 4096);
    int job_a = 0, job_b = 0;
    copier.Submit({1, &job_a, from.Side(1), to.Side(2), kHalf});
    copier.Submit({2, &job_b, from.Side(1), to.Side(3, kHalf), kHalf});
    std::vector<uint64_t> dropped = copier.Cancel(2);
    std::vector<uint8_t> after = to.Contents();
    ASSERT_EQ(dropped.size(), 1u);
    EXPECT_EQ(dropped[0], 1u);
    EXPECT_NE(after[kHalf - 1], 0x3c) << "copy 1 had ended";
    // Copy 2 goes on alone and ends; copy 1's half never changes again.
    auto done = WaitDone(copier, 1);
    ASSERT_EQ(done.size(), 1u);
    EXPECT_EQ(done[0].id, 2u);
    std::vector<uint8_t> last = to.Contents();
    EXPECT_EQ(memcmp(after.data(), last.data(), kHalf), 0);
    EXPECT_EQ(memcmp(last.data() + kHalf, from_buf, kHalf), 0);
  }
  munmap(from_buf, kBig);
  munmap(to_buf, kBig);
}

TEST_F(CrossCopyTest, JobsTakeTurnsChunkByChunk) {
  Child from(src_, kLen), to(dst_, kLen);
  // 4 KiB chunks: job A's copy takes 768 turns (milliseconds), so job B's
  // arrives while it runs, and its 32 chunks end long before A's.
  CrossCopier copier(Wake(), 4096);
  int job_a = 0, job_b = 0;
  copier.Submit({1, &job_a, from.Side(1), to.Side(2), kLen});
  copier.Submit({2, &job_b, from.Side(1), to.Side(2), 128 << 10});
  auto done = WaitDone(copier, 2);
  ASSERT_EQ(done.size(), 2u);
  EXPECT_EQ(done[0].id, 2u);
  EXPECT_EQ(done[1].id, 1u);
}

TEST(CrossCopyIdentity, PeerPidfdNamesTheProcessAtTheOtherEnd) {
  int sv[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
  int pidfd = CrossCopier::PeerPidfd(sv[0]);
  ASSERT_GE(pidfd, 0);
  // It is this process: pidfd_send_signal with signal 0 reaches us, and
  // /proc/self/fdinfo names our pid.
  EXPECT_EQ(syscall(SYS_pidfd_send_signal, pidfd, 0, nullptr, 0), 0);
  char path[64];
  snprintf(path, sizeof(path), "/proc/self/fdinfo/%d", pidfd);
  FILE* f = fopen(path, "r");
  ASSERT_NE(f, nullptr);
  char line[256];
  int pid = -1;
  while (fgets(line, sizeof(line), f)) sscanf(line, "Pid: %d", &pid);
  fclose(f);
  EXPECT_EQ(pid, getpid());
  close(pidfd);
  close(sv[0]);
  close(sv[1]);
}

}  // namespace
}  // namespace psmd
