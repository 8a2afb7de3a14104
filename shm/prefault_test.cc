#include "shm/prefault.h"

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cstdint>

namespace psmd::shm {
namespace {

constexpr uint64_t kPage = 4096;
constexpr uint64_t kWindow = Prefaulter::kWindow;

long MinorFaults() {
  rusage r{};
  getrusage(RUSAGE_SELF, &r);
  return r.ru_minflt;
}

// Writes one byte per page of [offset, offset + len); returns the page
// faults that took. (Under AddressSanitizer the shadow of the range faults
// too, one page per 8, hence the tests' margins: a prepared range must take
// at most a quarter of a fault per page, an unprepared one at least half.)
long TouchFaults(uint8_t* base, uint64_t offset, uint64_t len) {
  long before = MinorFaults();
  for (uint64_t o = offset; o < offset + len; o += kPage) {
    reinterpret_cast<volatile uint8_t*>(base)[o] = 1;
  }
  return MinorFaults() - before;
}

// A shared mapping of a memfd, as a job pool is: 3.5 windows.
class PrefaultTest : public ::testing::Test {
 protected:
  void SetUp() override {
    fd_ = memfd_create("prefault_test", 0);
    ASSERT_GE(fd_, 0);
    ASSERT_EQ(ftruncate(fd_, kBytes), 0);
    void* p = mmap(nullptr, kBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd_, 0);
    ASSERT_NE(p, MAP_FAILED);
    base_ = static_cast<uint8_t*>(p);
  }
  void TearDown() override {
    munmap(base_, kBytes);
    close(fd_);
  }
  static constexpr uint64_t kBytes = 3 * kWindow + kWindow / 2;
  int fd_ = -1;
  uint8_t* base_ = nullptr;
};

TEST_F(PrefaultTest,
       APreparedWindowTakesFewFaultsAnUnpreparedOneAFaultPerPage) {
  Prefaulter pages(base_, kBytes);
  pages.Prepare(kWindow + 100, 64);  // inside window 1: all of it
  EXPECT_LE(TouchFaults(base_, kWindow, kWindow), long(kWindow / kPage / 4));
  EXPECT_GE(TouchFaults(base_, 2 * kWindow, kWindow),
            long(kWindow / kPage / 2));
}

TEST_F(PrefaultTest, ARangeAcrossWindowsPreparesEachAndTheLastIsClamped) {
  Prefaulter pages(base_, kBytes);
  pages.Prepare(kWindow - 10, 2 * kWindow);  // windows 0, 1 and 2
  pages.Prepare(3 * kWindow, 10 * kWindow);  // the half window at the end
  pages.Prepare(kBytes, 100);                // past the end: nothing
  EXPECT_LE(TouchFaults(base_, 0, kBytes), long(kBytes / kPage / 4));
}

TEST_F(PrefaultTest, AnEmptyRangeIsNothingAndAnotherMappingPreparesItsOwn) {
  Prefaulter pages(base_, kBytes);
  pages.Prepare(0, 0);
  EXPECT_GE(TouchFaults(base_, 0, kWindow), long(kWindow / kPage / 2));
  // Unmapped and mapped again: the pages exist, this mapping has none.
  munmap(base_, kBytes);
  base_ = static_cast<uint8_t*>(
      mmap(nullptr, kBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd_, 0));
  ASSERT_NE(base_, MAP_FAILED);
  Prefaulter again(base_, kBytes);
  again.Prepare(5, 1);
  EXPECT_LE(TouchFaults(base_, 0, kWindow), long(kWindow / kPage / 4));
}

}  // namespace
}  // namespace psmd::shm
