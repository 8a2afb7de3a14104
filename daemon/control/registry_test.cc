// The registry with a real progress worker and real segments, driven
// directly (no gRPC, no admission socket): quotas, who may attach, close
// and connect, and that jobs never meet.
#include "daemon/control/registry.h"

#include <gtest/gtest.h>
#include <psm2.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "shm/epid.h"

namespace psmd {
namespace {

class RegistryTest : public ::testing::Test {
 protected:
  RegistryTest() : worker_(Cfg(), 1), registry_(Cfg(), &worker_) {}
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

  Workers worker_;
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

// Ids start at 1 in every psmd, so a client of an earlier psmd on the same
// socket (SIGKILLed, restarted at once as systemd's Restart= does) names, by
// id alone, whichever endpoint has its id now: its close used to close a
// new job's endpoint (issue 33). With the epid it was told, whose boot
// nonce is the earlier psmd's, it reaches nothing here.
TEST_F(RegistryTest, AnEndpointOfAnEarlierPsmdReachesNothingHere) {
  OpenedEndpoint old_ep;
  {
    Workers earlier_worker(Cfg(), 1);
    Registry earlier(Cfg(), &earlier_worker);
    ASSERT_TRUE(earlier.Open(User(1000), Uuid{1}, "old", &old_ep).ok());
    earlier.RemoveAll();
  }
  OpenedEndpoint now = Open(User(1000), 1);
  ASSERT_EQ(now.id, old_ep.id);
  if (shm::BootNonceOf(now.epid) == shm::BootNonceOf(old_ep.epid))
    GTEST_SKIP() << "both registries drew the same 16-bit boot nonce";
  std::vector<ConnectOutcome> out;
  std::vector<int> errors;
  const EndpointName stale{old_ep.id, old_ep.epid};
  Status close = registry_.Close(User(1000), stale);
  EXPECT_EQ(close.code, PSM2_EP_WAS_CLOSED);
  EXPECT_NE(close.message.find("opened by a psmd that has ended"),
            std::string::npos)
      << close.message;
  EXPECT_EQ(registry_.Connect(User(1000), stale, {now.epid}, &out).code,
            PSM2_EP_WAS_CLOSED);
  EXPECT_EQ(registry_.Disconnect(User(1000), stale, {0}, &errors).code,
            PSM2_EP_WAS_CLOSED);
  // The endpoint that has the id now is untouched and answers its own epid.
  const EndpointName current{now.id, now.epid};
  ASSERT_TRUE(registry_.Connect(User(1000), current, {now.epid}, &out).ok());
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].error, PSM2_OK);
  EXPECT_TRUE(registry_.Close(User(1000), current).ok());
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

// ---- Slurm steps (RegisterSlurmStep, EndSlurmStep) ----

constexpr char kStep[] = "4:freezer:/slurm_n1/uid_1000/job_7/step_0";

// /proc/PID/cgroup of a process of the step (a task below the step's
// directory, other hierarchies elsewhere) and of one outside it.
constexpr char kInside[] =
    "5:memory:/slurm_n1/uid_1000/job_7/step_0/task_1\n"
    "4:freezer:/slurm_n1/uid_1000/job_7/step_0\n"
    "1:name=systemd:/user.slice\n";
constexpr char kOutside[] =
    "5:memory:/user.slice\n"
    "4:freezer:/\n"
    "1:name=systemd:/user.slice\n";

SlurmStep Step(uint32_t job = 7, uint32_t step = 0, uid_t uid = 1000) {
  SlurmStep s;
  s.job_id = job;
  s.step_id = step;
  s.uid = uid;
  s.cgroup = kStep;
  return s;
}

Credentials In(const Credentials& who, const char* cgroup) {
  Credentials c = who;
  c.cgroup = cgroup;
  return c;
}

Uuid Key(uint8_t job) {
  Uuid uuid{};
  uuid[0] = job;
  return uuid;
}

TEST(InCgroupTest, TheStepsDirectoryOrBelowInTheSameHierarchy) {
  EXPECT_TRUE(InCgroup(kInside, kStep));
  EXPECT_TRUE(InCgroup("4:freezer:/slurm_n1/uid_1000/job_7/step_0", kStep));
  EXPECT_FALSE(InCgroup(kOutside, kStep));
  // A sibling whose name starts with the step's is not inside it.
  EXPECT_FALSE(InCgroup("4:freezer:/slurm_n1/uid_1000/job_7/step_01", kStep));
  EXPECT_FALSE(InCgroup("4:freezer:/slurm_n1/uid_1000/job_7", kStep));
  // The same path in another hierarchy does not count.
  EXPECT_FALSE(InCgroup("5:memory:/slurm_n1/uid_1000/job_7/step_0", kStep));
  EXPECT_FALSE(InCgroup("", kStep));
  // cgroup v2: one line, "0::".
  EXPECT_TRUE(InCgroup("0::/system.slice/job_7/step_0/user/task_0",
                       "0::/system.slice/job_7/step_0"));
  // Not a cgroup line: nothing is inside it.
  EXPECT_FALSE(InCgroup(kInside, "step_0"));
  EXPECT_FALSE(InCgroup(kInside, ""));
}

TEST_F(RegistryTest, OnlyRootRegistersOrEndsASlurmStep) {
  Status reg = registry_.RegisterSlurmStep(User(1000), Key(1), Step());
  EXPECT_FALSE(reg.ok());
  EXPECT_NE(reg.message.find("only root"), std::string::npos) << reg.message;
  bool registered = true;
  Status end = registry_.EndSlurmStep(User(1000), 7, 0, &registered, nullptr);
  EXPECT_FALSE(end.ok());
  // Refused: the key stays free for anyone, as without Slurm.
  OpenedEndpoint out;
  EXPECT_TRUE(registry_.Open(In(User(1001), kOutside), Key(1), "x", &out).ok());
  ASSERT_TRUE(registry_.RegisterSlurmStep(User(0), Key(2), Step()).ok());
  EXPECT_FALSE(
      registry_.Open(In(User(1001), kOutside), Key(2), "x", &out).ok());
}

TEST_F(RegistryTest, ARegisteredKeyOpensOnlyInsideItsStep) {
  ASSERT_TRUE(registry_.RegisterSlurmStep(User(0), Key(1), Step()).ok());
  OpenedEndpoint out;
  // The same uid outside the step's cgroup: refused, saying why.
  Status outside =
      registry_.Open(In(User(1000, 50), kOutside), Key(1), "x", &out);
  EXPECT_EQ(outside.code, PSM2_EPID_INVALID_UUID_KEY);
  EXPECT_NE(outside.message.find("Slurm job 7 step 0"), std::string::npos)
      << outside.message;
  EXPECT_NE(outside.message.find("not inside the step's cgroup"),
            std::string::npos)
      << outside.message;
  // A cgroup psmd could not read is not inside.
  Status unknown = registry_.Open(User(1000, 51), Key(1), "x", &out);
  EXPECT_NE(unknown.message.find("could not read its cgroup"),
            std::string::npos)
      << unknown.message;
  // Inside, but another uid (or root): refused.
  EXPECT_FALSE(registry_.Open(In(User(1001), kInside), Key(1), "x", &out).ok());
  EXPECT_FALSE(registry_.Open(In(User(0), kInside), Key(1), "x", &out).ok());
  EXPECT_EQ(registry_.endpoint_count(), 0u);
  // The step's own task opens.
  EXPECT_TRUE(registry_.Open(In(User(1000), kInside), Key(1), "x", &out).ok());
  // Other keys behave as without Slurm.
  EXPECT_TRUE(registry_.Open(In(User(1000), kOutside), Key(2), "x", &out).ok());
  EXPECT_EQ(registry_.endpoint_count(), 2u);
}

TEST_F(RegistryTest, AKeyBelongsToOneStep) {
  ASSERT_TRUE(registry_.RegisterSlurmStep(User(0), Key(1), Step()).ok());
  // Every task of the step registers it: the same again is fine.
  EXPECT_TRUE(registry_.RegisterSlurmStep(User(0), Key(1), Step()).ok());
  Status other = registry_.RegisterSlurmStep(User(0), Key(1), Step(7, 1));
  EXPECT_FALSE(other.ok());
  EXPECT_NE(other.message.find("already Slurm job 7 step 0"), std::string::npos)
      << other.message;
  SlurmStep bad = Step(8);
  bad.cgroup = "/slurm/job_8/step_0";  // no hierarchy: not a cgroup line
  EXPECT_FALSE(registry_.RegisterSlurmStep(User(0), Key(3), bad).ok());
}

TEST_F(RegistryTest, AStepsEndClosesWhatItLeftAndFreesItsKey) {
  ASSERT_TRUE(registry_.RegisterSlurmStep(User(0), Key(1), Step()).ok());
  OpenedEndpoint a, b, other;
  ASSERT_TRUE(
      registry_.Open(In(User(1000, 60), kInside), Key(1), "a", &a).ok());
  ASSERT_TRUE(
      registry_.Open(In(User(1000, 61), kInside), Key(1), "b", &b).ok());
  ASSERT_TRUE(
      registry_.Open(In(User(1000, 62), kOutside), Key(2), "c", &other).ok());
  // The jobs list shows the step; the other job has none.
  std::vector<JobSnapshot> jobs = registry_.Jobs(User(0));
  ASSERT_EQ(jobs.size(), 2u);
  ASSERT_TRUE(jobs[0].slurm.has_value());
  EXPECT_EQ(jobs[0].slurm->job_id, 7u);
  EXPECT_FALSE(jobs[1].slurm.has_value());
  ASSERT_TRUE(registry_.Stats(User(1000)).jobs[0].slurm.has_value());

  bool registered = false;
  std::vector<EndpointSnapshot> closed;
  // Another step's end touches nothing.
  ASSERT_TRUE(registry_.EndSlurmStep(User(0), 7, 1, &registered, &closed).ok());
  EXPECT_FALSE(registered);
  EXPECT_TRUE(closed.empty());
  EXPECT_EQ(registry_.endpoint_count(), 3u);

  ASSERT_TRUE(registry_.EndSlurmStep(User(0), 7, 0, &registered, &closed).ok());
  EXPECT_TRUE(registered);
  ASSERT_EQ(closed.size(), 2u);
  EXPECT_EQ(closed[0].id, a.id);
  EXPECT_EQ(closed[0].pid, 60);
  EXPECT_EQ(closed[1].id, b.id);
  EXPECT_EQ(registry_.endpoint_count(), 1u);  // the other job's
  // The finished job's totals still name its step.
  StatsSnapshot stats = registry_.Stats(User(1000));
  ASSERT_EQ(stats.jobs.size(), 2u);
  EXPECT_EQ(stats.jobs[0].open_endpoints, 0u);
  ASSERT_TRUE(stats.jobs[0].slurm.has_value());
  EXPECT_EQ(stats.jobs[0].slurm->job_id, 7u);
  // The key is nobody's now: as without Slurm.
  OpenedEndpoint again;
  EXPECT_TRUE(
      registry_.Open(In(User(1000), kOutside), Key(1), "d", &again).ok());
}

TEST(SlurmBudgetsTest, FromTheStepsTasksAndMemory) {
  using Budgets = std::pair<uint32_t, uint64_t>;  // endpoints, bytes
  Config c;
  c.max_endpoints_per_job = 64;
  c.job_unexpected_budget_bytes = 4096ull << 20;
  c.slurm_endpoints_per_task = 1;
  c.slurm_unexpected_percent = 10;
  // (max_endpoints, unexpected_budget_bytes) of a step with `tasks` and
  // `mib` on the node.
  auto budgets = [&c](uint32_t tasks, uint64_t mib) {
    SlurmStep s = Step();
    s.tasks = tasks;
    s.memory_mib = mib;
    SlurmBudgets(c, &s);
    return Budgets{s.max_endpoints, s.unexpected_budget_bytes};
  };
  constexpr uint64_t kJobBudget = uint64_t{4096} << 20;
  // 512 MiB * 10 / 100, in bytes, rounded down.
  EXPECT_EQ(budgets(2, 512), Budgets(2, (uint64_t{512} << 20) * 10 / 100));
  c.slurm_endpoints_per_task = 3;
  EXPECT_EQ(budgets(2, 512).first, 6u);
  // Never above the budgets without Slurm (1 TiB: 10% is over
  // job_unexpected_mib).
  EXPECT_EQ(budgets(100, 1ull << 20), Budgets(64, kJobBudget));
  // Unknown (0) tasks or memory, or a factor of 0: the configuration's.
  EXPECT_EQ(budgets(0, 0), Budgets(64, kJobBudget));
  c.slurm_endpoints_per_task = 0;
  c.slurm_unexpected_percent = 0;
  EXPECT_EQ(budgets(2, 512), Budgets(64, kJobBudget));
  // Slurm's largest numbers do not overflow.
  c.slurm_unexpected_percent = 100;
  EXPECT_EQ(budgets(2, UINT64_MAX).second, kJobBudget);
}

TEST_F(RegistryTest, AStepsJobHoldsNoMoreEndpointsThanItsTasksAllow) {
  SlurmStep step = Step();
  step.tasks = 2;
  step.memory_mib = 100;
  ASSERT_TRUE(registry_.RegisterSlurmStep(User(0), Key(1), step).ok());
  OpenedEndpoint a, b, c;
  ASSERT_TRUE(
      registry_.Open(In(User(1000, 60), kInside), Key(1), "a", &a).ok());
  ASSERT_TRUE(
      registry_.Open(In(User(1000, 61), kInside), Key(1), "b", &b).ok());
  Status third = registry_.Open(In(User(1000, 62), kInside), Key(1), "c", &c);
  EXPECT_EQ(third.code, PSM2_TOO_MANY_ENDPOINTS);
  EXPECT_NE(third.message.find("Slurm job 7 step 0 holds its maximum of 2 "
                               "open endpoints on this node (2 tasks here"),
            std::string::npos)
      << third.message;
  // The jobs list shows the step's budgets, not the configuration's.
  std::vector<JobSnapshot> jobs = registry_.Jobs(User(0));
  ASSERT_EQ(jobs.size(), 1u);
  EXPECT_EQ(jobs[0].max_endpoints, 2u);
  EXPECT_EQ(jobs[0].job_unexpected_budget_bytes, (100ull << 20) * 10 / 100);
  ASSERT_TRUE(jobs[0].slurm.has_value());
  EXPECT_EQ(jobs[0].slurm->tasks, 2u);
  EXPECT_EQ(jobs[0].slurm->max_endpoints, 2u);
  // A bound on open endpoints: one closed, one more opens.
  ASSERT_TRUE(registry_.Close(User(1000), a.id).ok());
  EXPECT_TRUE(
      registry_.Open(In(User(1000, 62), kInside), Key(1), "c", &c).ok());
  // Another job (no Slurm) keeps max_endpoints_per_job.
  ASSERT_TRUE(registry_.Open(In(User(1001), kOutside), Key(2), "x", &a).ok());
  jobs = registry_.Jobs(User(0));
  ASSERT_EQ(jobs.size(), 2u);
  EXPECT_EQ(jobs[1].max_endpoints, Cfg().max_endpoints_per_job);
  EXPECT_EQ(jobs[1].job_unexpected_budget_bytes,
            Cfg().job_unexpected_budget_bytes);
}

}  // namespace
}  // namespace psmd

namespace psmd {
namespace {

// What a handover carries of the registry (issue 33): written by one
// registry, read by another over copies of the same descriptors (as
// systemd's store hands them back), it lists the same endpoints, jobs and
// connections; a forged field refuses the whole state and takes nothing.
class RegistryHandoverTest : public RegistryTest {
 protected:
  // Writes registry_'s state; *handed gets a copy of each descriptor.
  std::string Save(handover::FdTable* table, std::vector<int>* handed) {
    handover::StateWriter w;
    handover::FdTable fds;
    Status s = registry_.SaveState(w, fds);
    EXPECT_TRUE(s.ok()) << s.message;
    handover::StateWriter t;
    fds.Write(t);
    for (int fd : fds.fds()) handed->push_back(dup(fd));
    handover::StateReader r(t.bytes().data(), t.bytes().size());
    EXPECT_TRUE(table->Read(r, handed)) << r.error();
    return w.bytes();
  }
};

TEST_F(RegistryHandoverTest, TheNextRegistryListsWhatThisOneHad) {
  OpenedEndpoint a = Open(User(1000, 10), 1);
  OpenedEndpoint b = Open(User(1000, 11), 1);
  Open(User(1001, 12), 2);
  int pair[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, pair), 0);
  int fds[shm::kAttachFdCount];
  uint32_t id = 0;
  ASSERT_TRUE(
      registry_.Attach(a.token, User(1000, 10), pair[0], fds, &id).ok());
  std::vector<ConnectOutcome> out;
  ASSERT_TRUE(registry_.Connect(User(1000, 10), a.id, {b.epid}, &out).ok());

  handover::FdTable table;
  std::vector<int> handed;
  const std::string state = Save(&table, &handed);
  Workers next_worker(Cfg(), 1);
  Registry next(Cfg(), &next_worker);
  handover::StateReader r(state.data(), state.size());
  std::vector<std::pair<int, uint32_t>> liveness;
  Status s = next.LoadState(r, table, registry_.boot_nonce(), &liveness);
  ASSERT_TRUE(s.ok()) << s.message;
  EXPECT_TRUE(table.TakeRest().empty());  // every descriptor adopted
  Credentials root = User(0);
  std::vector<EndpointSnapshot> before = registry_.Snapshot(root);
  std::vector<EndpointSnapshot> after = next.Snapshot(root);
  ASSERT_EQ(before.size(), after.size());
  for (size_t i = 0; i < before.size(); i++) {
    EXPECT_EQ(before[i].id, after[i].id);
    EXPECT_EQ(before[i].epid, after[i].epid);
    EXPECT_EQ(before[i].uid, after[i].uid);
    EXPECT_EQ(before[i].label, after[i].label);
    EXPECT_EQ(before[i].connections, after[i].connections);
  }
  EXPECT_EQ(next.Jobs(root).size(), 2u);
  ASSERT_EQ(liveness.size(), 1u);  // a is attached, b and c not yet
  EXPECT_EQ(liveness[0].second, a.id);
  // A new endpoint gets a fresh id, never one handed over.
  OpenedEndpoint fresh;
  Uuid uuid{};
  ASSERT_TRUE(next.Open(User(1002), uuid, "new", &fresh).ok());
  EXPECT_GT(fresh.id, std::max(a.id, b.id));
  next.RemoveAll();
  // Attach connections are Admission's to close.
  close(liveness[0].first);
  close(pair[0]);
  close(pair[1]);
}

TEST_F(RegistryHandoverTest, AForgedEpidRefusesTheWholeStateAndTakesNothing) {
  OpenedEndpoint a = Open(User(1000, 10), 1);
  handover::FdTable table;
  std::vector<int> handed;
  std::string state = Save(&table, &handed);
  // The epid sits after the budget (8), next id (4), the job count (4) and
  // the job, the endpoint count (4) and the id (4): find it by value.
  const uint64_t epid = a.epid;
  const std::string bytes(reinterpret_cast<const char*>(&epid), 8);
  const size_t at = state.find(bytes);
  ASSERT_NE(at, std::string::npos);
  state[at] ^= 1;
  Workers next_worker(Cfg(), 1);
  Registry next(Cfg(), &next_worker);
  handover::StateReader r(state.data(), state.size());
  std::vector<std::pair<int, uint32_t>> liveness;
  Status s = next.LoadState(r, table, registry_.boot_nonce(), &liveness);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message.find("epid does not name this node"), std::string::npos)
      << s.message;
  EXPECT_EQ(next.endpoint_count(), 0u);
  std::vector<int> rest = table.TakeRest();
  EXPECT_EQ(rest.size(), handed.size());  // nothing taken: the caller ends them
  for (int fd : rest) close(fd);
}

}  // namespace
}  // namespace psmd
