#include "shm/spin.h"

#include <gtest/gtest.h>
#include <sys/sysinfo.h>

#include <vector>

namespace psmd::shm {
namespace {

// CPU n as a client_cpu word.
constexpr uint32_t Cpu(uint32_t n) { return n + 1; }

class CoreCensusTest : public ::testing::Test {
 protected:
  // Endpoints whose clients poll on the given words (0: not polling).
  void Clients(std::vector<uint32_t> words) {
    hints_ = std::vector<SpinHints>(words.size());
    for (size_t i = 0; i < words.size(); i++) {
      hints_[i].client_cpu.store(words[i]);
      hints_[i].core_shared.store(0);
    }
  }
  bool Refresh(uint32_t own) {
    return census_.Refresh(
        hints_.size(), [&](size_t i) { return &hints_[i]; }, own);
  }
  uint32_t Shared(size_t i) const { return hints_[i].core_shared.load(); }

  CoreCensus census_{4};  // CPUs 0-3
  std::vector<SpinHints> hints_;
};

TEST_F(CoreCensusTest, PollersOnTheirOwnCoresPause) {
  Clients({Cpu(0), Cpu(2)});
  EXPECT_FALSE(Refresh(Cpu(1)));
  EXPECT_EQ(Shared(0), 0u);
  EXPECT_EQ(Shared(1), 0u);
}

TEST_F(CoreCensusTest, AClientOnTheWorkersCoreMakesBothYield) {
  Clients({Cpu(0), Cpu(1)});
  EXPECT_TRUE(Refresh(Cpu(1)));
  EXPECT_EQ(Shared(0), 0u);
  EXPECT_EQ(Shared(1), 1u);
}

TEST_F(CoreCensusTest, ListsTheClientsOnTheWorkersCore) {
  Clients({Cpu(1), Cpu(0), Cpu(1), 0});
  EXPECT_TRUE(Refresh(Cpu(1)));
  EXPECT_EQ(census_.colocated(), (std::vector<size_t>{0, 2}));
  Clients({Cpu(0)});
  EXPECT_FALSE(Refresh(Cpu(1)));
  EXPECT_TRUE(census_.colocated().empty());
  Clients({Cpu(1)});
  EXPECT_FALSE(Refresh(0));  // a worker going to sleep shares no core
  EXPECT_TRUE(census_.colocated().empty());
}

TEST_F(CoreCensusTest, TwoClientsOnOneCoreYieldToEachOther) {
  Clients({Cpu(0), Cpu(0), Cpu(3)});
  EXPECT_FALSE(Refresh(Cpu(1)));
  EXPECT_EQ(Shared(0), 1u);
  EXPECT_EQ(Shared(1), 1u);
  EXPECT_EQ(Shared(2), 0u);
}

TEST_F(CoreCensusTest, ASleepingClientIsNoPoller) {
  Clients({0, Cpu(1)});
  EXPECT_TRUE(Refresh(Cpu(1)));
  Clients({0, 0});
  EXPECT_FALSE(Refresh(Cpu(1)));
  EXPECT_EQ(Shared(0), 0u);
}

TEST_F(CoreCensusTest, AHintIsClearedWhenTheCoreEmpties) {
  Clients({Cpu(2), Cpu(2)});
  Refresh(Cpu(1));
  ASSERT_EQ(Shared(0), 1u);
  hints_[1].client_cpu.store(Cpu(3));
  EXPECT_FALSE(Refresh(Cpu(1)));
  EXPECT_EQ(Shared(0), 0u);
  EXPECT_EQ(Shared(1), 0u);
}

// A client writes what it likes: CPUs that do not exist count for nothing
// and cannot reach past the census's table.
TEST_F(CoreCensusTest, CpusBeyondTheMachineAreIgnored) {
  Clients({Cpu(4), 0xffffffffu, Cpu(4)});
  EXPECT_FALSE(Refresh(Cpu(1)));
  EXPECT_EQ(Shared(0), 0u);
  EXPECT_EQ(Shared(1), 0u);
  EXPECT_EQ(Shared(2), 0u);
}

TEST_F(CoreCensusTest, AnUnknownWorkerCpuSharesWithNobody) {
  Clients({Cpu(0)});
  EXPECT_FALSE(Refresh(0));
  EXPECT_EQ(Shared(0), 0u);
}

class ClientSpinTest : public ::testing::Test {
 protected:
  void SetUp() override { spin.Attach(&hints); }
  SpinHints hints{};
  ClientSpin spin;
};

TEST_F(ClientSpinTest, PublishesItsCpuWhilePollingAndClearsItToSleep) {
  spin.Idle(1, false);
  // 1 + a CPU of this machine (which one: we may have moved since).
  EXPECT_GE(hints.client_cpu.load(), 1u);
  EXPECT_LE(hints.client_cpu.load(), static_cast<uint32_t>(get_nprocs_conf()));
  spin.Sleeping();
  EXPECT_EQ(hints.client_cpu.load(), 0u);
}

TEST_F(ClientSpinTest, SaysWhetherSubmissionsWaitForRoom) {
  spin.Idle(1, true);
  EXPECT_EQ(hints.client_blocked.load(), 1u);
  spin.Idle(2, true);
  EXPECT_EQ(hints.client_blocked.load(), 1u);
  spin.Idle(3, false);
  EXPECT_EQ(hints.client_blocked.load(), 0u);
}

TEST_F(ClientSpinTest, LooksAtItsCpuOnTheFirstIdleTurnAndEverySixteenth) {
  for (uint32_t turn = 2; turn <= 16; turn++) spin.Idle(turn, false);
  EXPECT_EQ(hints.client_cpu.load(), 0u);
  spin.Idle(17, false);
  EXPECT_GE(hints.client_cpu.load(), 1u);
  spin.Sleeping();
  spin.Idle(1, false);
  EXPECT_GE(hints.client_cpu.load(), 1u);
}

}  // namespace
}  // namespace psmd::shm
