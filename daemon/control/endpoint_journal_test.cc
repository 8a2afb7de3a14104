#include "daemon/control/endpoint_journal.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <random>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace psmd {
namespace {

// A directory of the test's own, removed with what is in it.
class EndpointJournalTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* tmp = std::getenv("TEST_TMPDIR");
    std::string pattern = std::string(tmp ? tmp : "/tmp") + "/journal-XXXXXX";
    ASSERT_NE(mkdtemp(pattern.data()), nullptr);
    dir_ = pattern;
    path_ = dir_ + "/psmd.sock.journal";
  }
  void TearDown() override {
    unlink(path_.c_str());
    unlink((dir_ + "/elsewhere").c_str());
    rmdir(dir_.c_str());
  }

  static EndpointJournal::Entry EntryOf(uint32_t id) {
    EndpointJournal::Entry e;
    e.id = id;
    e.epid = 0x1000000 + id;
    e.uid = 1000 + id;
    e.pid = 4000 + id;
    e.job.fill(static_cast<uint8_t>(id));
    e.attached_unix_ns = 1700000000000000000ull + id;
    return e;
  }
  // Loads the journal into `j` and starts it as psmd pid `pid` would
  // (generation 3); what was there before.
  EndpointJournal::Previous LoadAndStart(EndpointJournal& j,
                                         uint64_t crash_restarts,
                                         uint32_t pid = 77) {
    EndpointJournal::Previous p;
    EXPECT_TRUE(j.Load(path_, &p).ok());
    EXPECT_TRUE(j.Start(pid, 1700000000000000000ull, 3, crash_restarts).ok());
    return p;
  }
  // A journal as a psmd that was then killed leaves it: `ids` attached,
  // `cleared` of them removed again.
  void LeaveJournal(const std::vector<uint32_t>& ids,
                    const std::vector<uint32_t>& cleared,
                    uint64_t crash_restarts = 0) {
    EndpointJournal j;
    LoadAndStart(j, crash_restarts);
    for (uint32_t id : ids) j.Record(EntryOf(id));
    for (uint32_t id : cleared) j.Clear(id);
  }  // (not Remove: killed)

  std::string dir_;
  std::string path_;
};

TEST_F(EndpointJournalTest, ANewJournalHasNothingBefore) {
  EndpointJournal j;
  EndpointJournal::Previous p;
  ASSERT_TRUE(j.Load(path_, &p).ok());
  EXPECT_FALSE(p.found);
  uint32_t lost = 9;
  EXPECT_EQ(ReportPrevious(path_, p, false, &lost), 0u);
  EXPECT_EQ(lost, 0u);
  struct stat st {};
  ASSERT_EQ(stat(path_.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u) << "root-only";
}

TEST_F(EndpointJournalTest, AKilledPsmdLeavesItsLiveEndpointsAndIsACrash) {
  // Slots are reused: 2 and 4 cleared, 5 takes a freed slot.
  LeaveJournal({1, 2, 3, 4}, {2, 4}, /*crash_restarts=*/2);
  {
    EndpointJournal j;
    LoadAndStart(j, 2, /*pid=*/78);
    j.Record(EntryOf(1));
    j.Record(EntryOf(5));
  }
  EndpointJournal j;
  EndpointJournal::Previous p;
  ASSERT_TRUE(j.Load(path_, &p).ok());
  ASSERT_TRUE(p.found);
  EXPECT_EQ(p.damage, "");
  EXPECT_EQ(p.ending, EndpointJournal::Ending::kServing);
  EXPECT_EQ(p.pid, 78u);
  EXPECT_EQ(p.generation, 3u);
  ASSERT_EQ(p.entries.size(), 2u);
  std::set<uint32_t> ids;
  for (const auto& e : p.entries) {
    ids.insert(e.id);
    const EndpointJournal::Entry want = EntryOf(e.id);
    EXPECT_EQ(e.epid, want.epid);
    EXPECT_EQ(e.uid, want.uid);
    EXPECT_EQ(e.pid, want.pid);
    EXPECT_EQ(e.job, want.job);
    EXPECT_EQ(e.attached_unix_ns, want.attached_unix_ns);
  }
  EXPECT_EQ(ids, (std::set<uint32_t>{1, 5}));
  uint32_t lost = 0;
  EXPECT_EQ(ReportPrevious(path_, p, false, &lost), 3u) << "the third crash";
  EXPECT_EQ(lost, 2u);
}

TEST_F(EndpointJournalTest, AStoppedPsmdLeavesNoJournal) {
  {
    EndpointJournal j;
    LoadAndStart(j, 0);
    j.Record(EntryOf(1));
    j.Clear(1);
    j.Remove();
  }
  EXPECT_NE(access(path_.c_str(), F_OK), 0);
}

TEST_F(EndpointJournalTest, EndpointsPutIntoSystemdsStoreAreNoCrash) {
  {
    EndpointJournal j;
    LoadAndStart(j, 1);
    j.Record(EntryOf(1));
    j.MarkInStore();
  }
  EndpointJournal j;
  EndpointJournal::Previous p;
  ASSERT_TRUE(j.Load(path_, &p).ok());
  EXPECT_EQ(p.ending, EndpointJournal::Ending::kInStore);
  EXPECT_EQ(p.entries.size(), 1u);
  uint32_t lost = 5;
  EXPECT_EQ(ReportPrevious(path_, p, false, &lost), 1u) << "the count goes on";
  EXPECT_EQ(lost, 1u);
}

TEST_F(EndpointJournalTest,
       EndpointsLeftInTheStoreByAKilledSuccessorAreACrash) {
  {
    EndpointJournal j;
    LoadAndStart(j, 1);
    j.Record(EntryOf(1));
    j.Record(EntryOf(2));
    j.MarkInStore();
  }
  EndpointJournal j;
  EndpointJournal::Previous p;
  ASSERT_TRUE(j.Load(path_, &p).ok());
  uint32_t lost = 0;
  EXPECT_EQ(ReportPrevious(path_, p, true, &lost), 2u) << "one more crash";
  EXPECT_EQ(lost, 2u);
}

TEST_F(EndpointJournalTest, StartEmptiesWhatWasThere) {
  LeaveJournal({1, 2, 3}, {});
  {
    EndpointJournal j;
    EXPECT_EQ(LoadAndStart(j, 1, /*pid=*/78).entries.size(), 3u);
  }
  EndpointJournal j;
  EndpointJournal::Previous p;
  ASSERT_TRUE(j.Load(path_, &p).ok());
  EXPECT_TRUE(p.found);
  EXPECT_TRUE(p.entries.empty());
  EXPECT_EQ(p.crash_restarts, 1u);
}

TEST_F(EndpointJournalTest, ASymbolicLinkIsRefused) {
  const std::string target = dir_ + "/elsewhere";
  ASSERT_EQ(symlink(target.c_str(), path_.c_str()), 0);
  EndpointJournal j;
  EndpointJournal::Previous p;
  const Status s = j.Load(path_, &p);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message.find(path_), std::string::npos) << s.message;
  EXPECT_NE(access(target.c_str(), F_OK), 0) << "nothing created through it";
}

TEST_F(EndpointJournalTest, AJournalOthersMayReadIsRefused) {
  const int fd = open(path_.c_str(), O_CREAT | O_WRONLY, 0644);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(fchmod(fd, 0644), 0);  // (whatever the umask)
  close(fd);
  EndpointJournal j;
  EndpointJournal::Previous p;
  const Status s = j.Load(path_, &p);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message.find("is one others may read"), std::string::npos)
      << s.message;
}

// Damage of every kind is reported as damage, never read as records: a
// header cut short, another format, a flipped byte in the header, a record
// with a bad checksum, and bytes flipped at random (none crashes the
// reader, none yields a record that was never written).
TEST_F(EndpointJournalTest, DamageIsReportedNeverRead) {
  auto load = [&] {
    EndpointJournal j;
    EndpointJournal::Previous p;
    EXPECT_TRUE(j.Load(path_, &p).ok());
    return p;
  };
  auto patch = [&](off_t at, uint8_t value) {
    int fd = open(path_.c_str(), O_WRONLY);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(pwrite(fd, &value, 1, at), 1);
    close(fd);
  };
  LeaveJournal({1, 2}, {});
  ASSERT_EQ(truncate(path_.c_str(), 40), 0);
  EXPECT_EQ(load().damage, "shorter than its header");

  LeaveJournal({1, 2}, {});
  patch(8, 9);  // the version
  EXPECT_NE(load().damage.find("format 9"), std::string::npos);

  LeaveJournal({1, 2}, {});
  patch(20, 0xee);  // inside the header, under its checksum
  EXPECT_EQ(load().damage, "header damaged (checksum)");

  LeaveJournal({1, 2}, {});
  patch(64 + 8, 0xee);  // the first record's epid
  EndpointJournal::Previous p = load();
  EXPECT_EQ(p.damage, "1 of 2 records damaged");
  ASSERT_EQ(p.entries.size(), 1u);
  EXPECT_EQ(p.entries[0].id, 2u);
  uint32_t lost = 0;
  EXPECT_EQ(ReportPrevious(path_, p, false, &lost), 1u)
      << "a crash all the same";
  EXPECT_EQ(lost, 0u) << "what ended is not known";

  std::mt19937 rng(42);
  for (int round = 0; round < 500; round++) {
    LeaveJournal({1, 2, 3}, {2});
    const int flips = 1 + static_cast<int>(rng() % 4);
    for (int f = 0; f < flips; f++) {
      patch(static_cast<off_t>(rng() % (64 * 4)), static_cast<uint8_t>(rng()));
    }
    p = load();
    for (const auto& e : p.entries) {
      ASSERT_TRUE(e.id == 1 || e.id == 3) << "round " << round;
      const EndpointJournal::Entry want = EntryOf(e.id);
      ASSERT_EQ(e.epid, want.epid) << "round " << round;
      ASSERT_EQ(e.job, want.job) << "round " << round;
    }
  }
}

}  // namespace
}  // namespace psmd
