// The registry with a real progress worker and real segments, driven
// directly (no gRPC, no admission socket): quotas, who may attach, close
// and connect, and that jobs never meet.
#include "daemon/control/registry.h"

#include <gtest/gtest.h>
#include <psm2.h>
#include <unistd.h>

#include <string>
#include <vector>

namespace psmd {
namespace {

class RegistryTest : public ::testing::Test {
 protected:
  RegistryTest() : worker_(Cfg()), registry_(Cfg(), &worker_) {}
  ~RegistryTest() override { registry_.RemoveAll(); }

  static Config Cfg() {
    Config c;
    c.max_endpoints = 8;
    c.max_endpoints_per_uid = 3;
    c.max_endpoints_per_job = 4;
    return c;
  }

  // An unprivileged caller; the segments are still owned by our real uid
  // (memfd ownership is set with fchown, which needs no more than we have).
  static Credentials User(uid_t uid, pid_t pid = 4242) {
    Credentials c;
    c.pid = pid;
    c.uid = uid;
    c.gid = uid;
    return c;
  }

  OpenedEndpoint Open(const Credentials& who, uint8_t job) {
    OpenedEndpoint out;
    Uuid uuid{};
    uuid[0] = job;
    Status s = registry_.Open(who, uuid, "test", &out);
    EXPECT_TRUE(s.ok()) << s.message;
    return out;
  }

  ProgressWorker worker_;
  Registry registry_;
};

TEST_F(RegistryTest, PerUidQuotaRefusesOnlyThatUid) {
  Uuid uuid{};
  OpenedEndpoint out;
  for (int i = 0; i < 3; i++) {
    ASSERT_TRUE(registry_.Open(User(1000), uuid, "a", &out).ok());
  }
  Status refused = registry_.Open(User(1000), uuid, "a", &out);
  EXPECT_EQ(refused.code, PSM2_TOO_MANY_ENDPOINTS);
  EXPECT_NE(refused.message.find("--max-endpoints-per-uid"), std::string::npos);
  EXPECT_TRUE(registry_.Open(User(1001), uuid, "b", &out).ok());
  EXPECT_TRUE(registry_.Open(User(0), uuid, "root", &out).ok());  // exempt
  EXPECT_EQ(registry_.endpoint_count(), 5u);
}

TEST_F(RegistryTest, AnAttachTokenServesOnlyTheProcessItWasIssuedTo) {
  OpenedEndpoint ep = Open(User(1000, 10), 1);
  int fds[shm::kAttachFdCount];
  uint32_t id = 0;
  Status other = registry_.Attach(ep.token, User(1000, 11), -1, fds, &id);
  EXPECT_FALSE(other.ok());
  EXPECT_NE(other.message.find("issued to another process"), std::string::npos);
  ASSERT_TRUE(registry_.Attach(ep.token, User(1000, 10), -1, fds, &id).ok());
  EXPECT_EQ(id, ep.id);
  // Redeemed once: the token is spent.
  EXPECT_FALSE(registry_.Attach(ep.token, User(1000, 10), -1, fds, &id).ok());
}

TEST_F(RegistryTest, OnlyTheOwnerOrRootMayCloseOrConnect) {
  OpenedEndpoint mine = Open(User(1000), 1);
  OpenedEndpoint peer = Open(User(1000), 1);
  std::vector<ConnectOutcome> out;
  EXPECT_FALSE(registry_.Close(User(1001), mine.id).ok());
  EXPECT_FALSE(registry_.Connect(User(1001), mine.id, {peer.epid}, &out).ok());
  ASSERT_TRUE(registry_.Connect(User(1000), mine.id, {peer.epid}, &out).ok());
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].error, PSM2_OK);
  EXPECT_TRUE(registry_.Close(User(0), mine.id).ok());
  EXPECT_FALSE(registry_.Close(User(1000), mine.id).ok());  // already gone
}

// Refused for another uid exactly as for an id that names nothing: the
// answer tells a tenant neither that the endpoint exists nor whose it is.
TEST_F(RegistryTest, AnotherUidsEndpointAnswersLikeAMissingOne) {
  OpenedEndpoint root_ep = Open(User(0), 1);
  const uint32_t missing = root_ep.id + 100;
  Status theirs = registry_.Close(User(1001), root_ep.id);
  Status none = registry_.Close(User(1001), missing);
  ASSERT_FALSE(theirs.ok());
  EXPECT_EQ(theirs.code, none.code);
  auto without_id = [](std::string m, uint32_t id) {
    return m.replace(m.find(std::to_string(id)), std::to_string(id).size(),
                     "N");
  };
  EXPECT_EQ(without_id(theirs.message, root_ep.id),
            without_id(none.message, missing));
  EXPECT_EQ(theirs.message.find("uid 0"), std::string::npos);
  std::vector<ConnectOutcome> out;
  Status connect = registry_.Connect(User(1001), root_ep.id, {}, &out);
  EXPECT_EQ(without_id(connect.message, root_ep.id),
            without_id(none.message, missing));
}

TEST_F(RegistryTest, EndpointsOfDifferentJobsOrUidsNeverConnect) {
  OpenedEndpoint a = Open(User(1000), 1);
  OpenedEndpoint other_job = Open(User(1000), 2);
  OpenedEndpoint other_uid = Open(User(1001), 1);  // same uuid, other uid
  std::vector<ConnectOutcome> out;
  ASSERT_TRUE(registry_
                  .Connect(User(1000), a.id,
                           {other_job.epid, other_uid.epid, 0xdead}, &out)
                  .ok());
  ASSERT_EQ(out.size(), 3u);
  EXPECT_EQ(out[0].error, PSM2_EPID_INVALID_UUID_KEY);  // our own other job
  // Another uid's endpoint is answered exactly as a missing one: no tenant
  // learns which epids exist.
  EXPECT_EQ(out[1].error, PSM2_EPID_UNREACHABLE);
  EXPECT_EQ(out[2].error, PSM2_EPID_UNREACHABLE);
  auto without_epid = [](std::string m) {
    return m.substr(m.find(" of this uid"));
  };
  EXPECT_EQ(without_epid(out[1].message), without_epid(out[2].message));
}

TEST_F(RegistryTest, ClosedEndpointsLeaveTheirCountersInTheTotals) {
  OpenedEndpoint a = Open(User(1000), 1);
  EXPECT_EQ(registry_.Snapshot(User(1000)).size(), 1u);
  EXPECT_TRUE(registry_.Snapshot(User(1001)).empty());  // not theirs
  ASSERT_TRUE(registry_.Close(User(1000), a.id).ok());
  EXPECT_TRUE(registry_.Snapshot(User(1000)).empty());
  EXPECT_TRUE(registry_.Jobs(User(1000)).empty());  // the job ended
}

// The uuids of the jobs Stats reports to `who`, by their first byte.
std::vector<int> JobsIn(const StatsSnapshot& stats) {
  std::vector<int> out;
  for (const JobTotals& j : stats.jobs) out.push_back(j.key.uuid[0]);
  return out;
}

TEST_F(RegistryTest, AFinishedJobIsReportedForTheRetentionOnly) {
  OpenedEndpoint a = Open(User(1000), 1);
  OpenedEndpoint b = Open(User(1000), 1);
  ASSERT_TRUE(registry_.Close(User(1000), a.id).ok());
  StatsSnapshot half = registry_.Stats(User(1000));
  ASSERT_EQ(JobsIn(half), std::vector<int>{1});
  EXPECT_EQ(half.jobs[0].open_endpoints, 1u);
  ASSERT_TRUE(registry_.Close(User(1000), b.id).ok());
  StatsSnapshot ended = registry_.Stats(User(1000));
  ASSERT_EQ(JobsIn(ended), std::vector<int>{1});  // finished, still there
  EXPECT_EQ(ended.jobs[0].open_endpoints, 0u);
  EXPECT_TRUE(registry_.Stats(User(1001)).jobs.empty());  // not theirs
  EXPECT_EQ(JobsIn(registry_.Stats(User(0))), std::vector<int>{1});
  // Past the retention it is forgotten.
  auto later = std::chrono::steady_clock::now() +
               Registry::kFinishedJobRetention + std::chrono::seconds(1);
  EXPECT_TRUE(registry_.Stats(User(1000), later).jobs.empty());
}

TEST_F(RegistryTest, AUidKeepsAtMostItsBoundOfFinishedJobsNewestFirst) {
  // A tenant cycling through jobs: each opened and closed at once.
  const int jobs = static_cast<int>(Registry::kMaxFinishedJobsPerUid) + 3;
  OpenedEndpoint other = Open(User(1001), 0);
  ASSERT_TRUE(registry_.Close(User(1001), other.id).ok());
  for (int i = 1; i <= jobs; i++) {
    ASSERT_TRUE(registry_.Close(User(1000), Open(User(1000), i).id).ok());
  }
  std::vector<int> kept = JobsIn(registry_.Stats(User(1000)));
  ASSERT_EQ(kept.size(), Registry::kMaxFinishedJobsPerUid);
  EXPECT_EQ(kept.front(), 4);  // 1, 2 and 3, the oldest, were forgotten
  EXPECT_EQ(kept.back(), jobs);
  // Another uid's finished job is not pushed out by this one's.
  EXPECT_EQ(JobsIn(registry_.Stats(User(1001))), std::vector<int>{0});
}

}  // namespace
}  // namespace psmd
