// psmctl upgrade (issue 33; docs/design.md, "Handover"): a real psmd handed
// over to a new process under running exchanges, which must finish with
// every message delivered once, in order, byte for byte (the exchange
// program checks); and the handovers that must not happen, or must fail
// cleanly: a binary of another state format, a program that is no psmd, a
// damaged state (tests/tenant_test.cc: a caller who is not root).
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "tests/harness.h"

namespace psmd::testing {
namespace {

const char kJobA[] = "5053d0d0aaaaaaaaaaaaaaaaaaaaaaaa";
const char kJobB[] = "5053d0d0bbbbbbbbbbbbbbbbbbbbbbbb";
const char kJobC[] = "5053d0d0cccccccccccccccccccccccc";

std::string WriteScript(const TempDir& dir, const std::string& name,
                        const std::string& body) {
  const std::string path = dir.path() + "/" + name;
  std::ofstream(path) << "#!/bin/bash\n" << body;
  chmod(path.c_str(), 0755);
  return path;
}

// A pair of exchange ranks of job `uuid`, running.
struct Pair {
  std::string rv;
  Process r0, r1;
  void Start(const TempDir& dir, const Daemon& d, const std::string& name,
             const std::string& uuid, int messages, int max_size) {
    rv = Subdir(dir, name);
    r1 = Process::Start(ExchangeArgs(dir, rv, 1, uuid, messages, max_size),
                        d.ClientEnv(), rv + "/r1.out", rv + "/r1.err");
    r0 = Process::Start(ExchangeArgs(dir, rv, 0, uuid, messages, max_size),
                        d.ClientEnv(), rv + "/r0.out", rv + "/r0.err");
  }
  std::string Errors() const {
    return ReadFile(rv + "/r0.err") + ReadFile(rv + "/r1.err");
  }
  // Both ranks published their epids: each endpoint is attached, not only
  // opened (psmctl counts an endpoint from its OpenEndpoint call, before
  // the client attaches its segment).
  bool Attached() const {
    return access((rv + "/rank0.epid").c_str(), F_OK) == 0 &&
           access((rv + "/rank1.epid").c_str(), F_OK) == 0;
  }
};

int EndpointCount(const TempDir& dir, const Daemon& d) {
  const std::string out = Psmctl(dir, d, {"health", "--json"}).out;
  const size_t at = out.find("\"endpoint_count\": ");
  return at == std::string::npos ? -1 : atoi(out.c_str() + at + 18);
}

class HandoverTest : public ::testing::Test {
 protected:
  void TearDown() override {
    EXPECT_TRUE(ShmLeftovers().empty())
        << "something of ours was left in /dev/shm";
  }
  TempDir dir_;
};

// Three jobs exchange, one with small messages (posted and unexpected
// queues deep), one with messages up to 192 KiB (rendezvous transfers in
// flight), one with messages of 0 B to 64 MiB (transfers of many chunks,
// copies in place); psmd is upgraded ten times under them, to itself. Every
// pair finishes, every byte checked, and psmd's pid, generation and
// endpoints say what happened.
TEST_F(HandoverTest, UpgradeUnderRunningExchangesLosesNothing) {
  Daemon d(dir_);
  Pair small, large, huge;
  small.Start(dir_, d, "small", kJobA, 1000000, 64);
  large.Start(dir_, d, "large", kJobB, 60000, 192 * 1024);
  huge.Start(dir_, d, "huge", kJobC, 150, 64 << 20);
  ASSERT_TRUE(WaitUntil(20, [&] { return EndpointCount(dir_, d) == 6; }));
  for (int generation = 1; generation <= 10; generation++) {
    RunResult up = Psmctl(dir_, d, {"upgrade"});
    ASSERT_EQ(up.exit_code, 0) << up.err << d.Log();
    EXPECT_NE(up.out.find("generation " + std::to_string(generation) +
                          "): 6 endpoints carried over"),
              std::string::npos)
        << up.out;
    EXPECT_NE(up.out.find("pid " + std::to_string(d.pid())), std::string::npos)
        << up.out;
  }
  // The upgrades happened while both pairs were still at work, else this
  // test proves nothing.
  EXPECT_TRUE(small.r0.Wait(0) == -1 || small.r1.Wait(0) == -1)
      << "the small pair finished before the upgrades; raise its messages";
  EXPECT_TRUE(large.r0.Wait(0) == -1 || large.r1.Wait(0) == -1)
      << "the large pair finished before the upgrades; raise its messages";
  EXPECT_TRUE(huge.r0.Wait(0) == -1 || huge.r1.Wait(0) == -1)
      << "the huge pair finished before the upgrades; raise its messages";
  EXPECT_EQ(small.r0.Wait(120 * TimeScale()), 0) << small.Errors();
  EXPECT_EQ(small.r1.Wait(30), 0) << small.Errors();
  EXPECT_EQ(large.r0.Wait(120 * TimeScale()), 0) << large.Errors();
  EXPECT_EQ(large.r1.Wait(30), 0) << large.Errors();
  EXPECT_EQ(huge.r0.Wait(120 * TimeScale()), 0) << huge.Errors();
  EXPECT_EQ(huge.r1.Wait(30), 0) << huge.Errors();
  EXPECT_EQ(small.Errors().find("lost psmd"), std::string::npos);
  EXPECT_NE(d.Log().find("took over from psmd"), std::string::npos);
  // Every form of psmctl stats tells an operator what happened.
  RunResult table = Psmctl(dir_, d, {"stats"});
  EXPECT_NE(table.out.find("generation 10: last handover carried 6 "
                           "endpoints, blackout "),
            std::string::npos)
      << table.out;
  RunResult json = Psmctl(dir_, d, {"stats", "--format", "json"});
  EXPECT_NE(json.out.find("\"generation\": 10, \"last_blackout_seconds\": 0."),
            std::string::npos)
      << json.out;
  EXPECT_NE(json.out.find("\"last_carried_endpoints\": 6"), std::string::npos);
  RunResult prom = Psmctl(dir_, d, {"stats", "--format", "prometheus"});
  EXPECT_NE(prom.out.find("\npsmd_generation 10\n"), std::string::npos)
      << prom.out;
  EXPECT_NE(prom.out.find("\npsmd_last_handover_endpoints 6\n"),
            std::string::npos);
  EXPECT_NE(prom.out.find("\npsmd_last_blackout_seconds 0."),
            std::string::npos);
  // New jobs open and run on the successor.
  Pair after;
  after.Start(dir_, d, "after", kJobA, 1000, 4096);
  EXPECT_EQ(after.r0.Wait(30), 0) << after.Errors();
  EXPECT_EQ(after.r1.Wait(30), 0) << after.Errors();
  EXPECT_TRUE(d.Stop());
}

// The endpoint journal goes across handovers (daemon/control/
// endpoint_journal.h): each successor records the endpoints it took over,
// so a psmd SIGKILLed after three upgrades is followed by one that names
// the carried endpoints (their processes' pids) as ended with it, and counts
// one crash, not four. A handover is no crash: crash_restarts stays 0 across
// the upgrades.
TEST_F(HandoverTest, AKillAfterUpgradesReportsTheEndpointsCarried) {
  auto d = std::make_unique<Daemon>(dir_);
  Pair pair;
  pair.Start(dir_, *d, "pair", kJobA, 100000000, 64);
  ASSERT_TRUE(WaitUntil(20, [&] { return EndpointCount(dir_, *d) == 2; }));
  for (int generation = 1; generation <= 3; generation++) {
    RunResult up = Psmctl(dir_, *d, {"upgrade"});
    ASSERT_EQ(up.exit_code, 0) << up.err << d->Log();
  }
  const std::string health = Psmctl(dir_, *d, {"health", "--json"}).out;
  EXPECT_NE(health.find("\"crash_restarts\": 0"), std::string::npos) << health;
  ASSERT_EQ(kill(d->pid(), SIGKILL), 0);
  d.reset();  // reaped
  d = std::make_unique<Daemon>(dir_);
  ASSERT_TRUE(WaitUntil(5, [&] {
    return d->Log().find(") serving ") != std::string::npos;
  })) << d->Log();
  const std::string log = d->Log();
  EXPECT_NE(log.find("the 2 endpoints it served ended with it"),
            std::string::npos)
      << log;
  for (const Process* p : {&pair.r0, &pair.r1}) {
    EXPECT_NE(log.find("pid " + std::to_string(p->pid()) + ", uid "),
              std::string::npos)
        << log;
  }
  EXPECT_NE(Psmctl(dir_, *d, {"health", "--json"})
                .out.find("\"crash_restarts\": 1, "
                          "\"last_crash_lost_endpoints\": 2"),
            std::string::npos);
  pair.r0.Wait(10 * TimeScale());
  pair.r1.Wait(10 * TimeScale());
  EXPECT_TRUE(d->Stop());
}

// Jobs that start, connect and end while psmd is handed over, and control
// calls made meanwhile, never notice: a connection made during the
// blackout waits in the socket's backlog, one being classified is handed
// over, and each call opens its own.
TEST_F(HandoverTest, JobsStartingDuringUpgradesNeverNotice) {
  Daemon d(dir_);
  std::atomic<bool> done{false};
  std::atomic<int> jobs{0}, calls{0};
  std::string failures;
  std::thread starter([&] {
    for (int i = 0; !done || i < 3; i++) {
      Pair p;
      p.Start(dir_, d, "job" + std::to_string(i), i % 2 ? kJobA : kJobB, 200,
              4096);
      const int r0 = p.r0.Wait(60), r1 = p.r1.Wait(60);
      if (r0 != 0 || r1 != 0) failures += p.Errors();
      jobs++;
    }
  });
  std::thread caller([&] {
    while (!done) {
      RunResult h = Psmctl(dir_, d, {"health"});
      if (h.exit_code != 0) failures += "health: " + h.err;
      calls++;
    }
  });
  for (int i = 0; i < 6; i++) {
    RunResult up = Psmctl(dir_, d, {"upgrade"});
    EXPECT_EQ(up.exit_code, 0) << up.err;
  }
  done = true;
  starter.join();
  caller.join();
  EXPECT_EQ(failures, "");
  EXPECT_GE(jobs.load(), 3);
  EXPECT_GE(calls.load(), 6);
  EXPECT_TRUE(d.Stop());
}

// A binary that reads another state format is refused before anything
// stops: psmd serves on and the exchange never notices.
TEST_F(HandoverTest, BinaryOfAnotherFormatIsRefusedWhilePsmdServesOn) {
  Daemon d(dir_);
  const std::string other = WriteScript(
      dir_, "other-psmd",
      "[[ \"$1\" == --handover-format ]] && { echo 999; exit 0; }\nexit 3\n");
  Pair p;
  p.Start(dir_, d, "p", kJobA, 100000, 64);
  ASSERT_TRUE(WaitUntil(20, [&] { return EndpointCount(dir_, d) == 2; }));
  RunResult up = Psmctl(dir_, d, {"upgrade", "--exec", other});
  EXPECT_EQ(up.exit_code, 1);
  EXPECT_NE(up.err.find("reads handover format 999, this psmd writes"),
            std::string::npos)
      << up.err;
  RunResult not_psmd = Psmctl(dir_, d, {"upgrade", "--exec", "/bin/true"});
  EXPECT_EQ(not_psmd.exit_code, 1);
  EXPECT_NE(not_psmd.err.find("is not a psmd that can take over"),
            std::string::npos)
      << not_psmd.err;
  RunResult relative = Psmctl(dir_, d, {"upgrade", "--exec", "psmd"});
  EXPECT_NE(relative.err.find("absolute path"), std::string::npos);
  EXPECT_EQ(p.r0.Wait(60 * TimeScale()), 0) << p.Errors();
  EXPECT_EQ(p.r1.Wait(30), 0) << p.Errors();
  EXPECT_EQ(d.Log().find("took over"), std::string::npos);
  EXPECT_TRUE(d.Stop());
}

// The exec itself fails (here the binary made itself unexecutable once it
// had answered its format): psmd resumes in the same process, the exchange
// never notices, and psmctl, psmctl health and the metrics say the upgrade
// failed and why.
TEST_F(HandoverTest, AnExecThatFailsLeavesPsmdServingAndIsCounted) {
  Daemon d(dir_);
  const std::string psmd = Runfile("daemon/psmd");
  const std::string vanishing =
      WriteScript(dir_, "vanishing-psmd",
                  "[[ \"$1\" == --handover-format ]] && { chmod a-x \"$0\"; "
                  "exec " +
                      psmd + " --handover-format; }\nexit 3\n");
  Pair p;
  p.Start(dir_, d, "p", kJobA, 1000000, 64);
  ASSERT_TRUE(WaitUntil(20, [&] { return EndpointCount(dir_, d) == 2; }));
  RunResult up = Psmctl(dir_, d, {"upgrade", "--exec", vanishing});
  EXPECT_EQ(up.exit_code, 1) << up.out;
  EXPECT_NE(
      up.err.find("the upgrade failed, psmd (pid " + std::to_string(d.pid()) +
                  ") serves on: exec " + vanishing + ": Permission denied"),
      std::string::npos)
      << up.err << d.Log();
  const std::string health = Psmctl(dir_, d, {"health", "--json"}).out;
  EXPECT_NE(health.find("\"upgrades_failed\": 1, \"last_upgrade_failure\": "
                        "\"exec " +
                        vanishing + ": Permission denied\""),
            std::string::npos)
      << health;
  EXPECT_NE(Psmctl(dir_, d, {"stats", "--format", "prometheus"})
                .out.find("\npsmd_upgrades_failed_total 1\n"),
            std::string::npos);
  EXPECT_EQ(p.r0.Wait(60 * TimeScale()), 0) << p.Errors();
  EXPECT_EQ(p.r1.Wait(30), 0) << p.Errors();
  EXPECT_EQ(d.Log().find("took over"), std::string::npos);
  EXPECT_TRUE(d.Stop());
}

// Issue 33, item 6: psmd hands over only to a binary that no one but root
// (or psmd's own user) can change: not one writable by others, not one in a
// directory others may write (unless it is sticky, as /tmp), not one owned
// by another user, and not through a symbolic link to such a file. Each is
// refused with the path and the fix, before it is even run, and psmd serves
// on.
TEST_F(HandoverTest, BinaryOthersCouldChangeIsRefusedWhilePsmdServesOn) {
  Daemon d(dir_);
  const std::string body =
      "[[ \"$1\" == --handover-format ]] && { echo 999; exit 0; }\nexit 3\n";
  auto refused = [&](const std::string& exec, const std::string& why) {
    RunResult up = Psmctl(dir_, d, {"upgrade", "--exec", exec});
    EXPECT_EQ(up.exit_code, 1) << exec;
    EXPECT_NE(up.err.find(why), std::string::npos) << exec << ": " << up.err;
    EXPECT_NE(up.err.find("only to a binary that no one but root"),
              std::string::npos)
        << up.err;
  };
  const std::string writable = WriteScript(dir_, "psmd-writable", body);
  chmod(writable.c_str(), 0757);
  refused(writable,
          writable + " is writable by its group or others (mode 0757)");
  refused(writable, "chmod go-w " + writable);

  const std::string open_dir = Subdir(dir_, "open");
  chmod(open_dir.c_str(), 0777);
  const std::string in_open = WriteScript(dir_, "open/psmd", body);
  refused(in_open,
          open_dir + " is writable by its group or others (mode 0777)");

  const std::string link = dir_.path() + "/psmd-link";
  ASSERT_EQ(symlink(writable.c_str(), link.c_str()), 0);
  refused(link, writable + " is writable");

  if (geteuid() == 0) {
    const std::string foreign = WriteScript(dir_, "psmd-foreign", body);
    ASSERT_EQ(chown(foreign.c_str(), 65534, 65534), 0);
    refused(foreign, foreign + " is owned by uid 65534");
  }

  // A sticky directory writable by all is fine for a file psmd's user owns:
  // the binary is then run, and refused for its format only.
  chmod(open_dir.c_str(), 01777);
  RunResult sticky = Psmctl(dir_, d, {"upgrade", "--exec", in_open});
  EXPECT_EQ(sticky.exit_code, 1);
  EXPECT_NE(sticky.err.find("reads handover format 999"), std::string::npos)
      << sticky.err;

  EXPECT_EQ(Psmctl(dir_, d, {"health"}).exit_code, 0);
  EXPECT_EQ(d.Log().find("took over"), std::string::npos);
  EXPECT_TRUE(d.Stop());
}

// The successor finds the state damaged (changed on the way by a wrapper
// that copies it and execs the real psmd): it refuses the whole
// state, every client is told why with its lost-psmd line, and psmd serves
// new jobs on the same socket.
TEST_F(HandoverTest, DamagedStateEndsEndpointsWithTheReasonAndPsmdServesOn) {
  const std::string psmd = Runfile("daemon/psmd");
  const std::string wrapper =
      WriteScript(dir_, "damaging-psmd",
                  "[[ \"$1\" == --handover-format ]] && exec " + psmd +
                      " --handover-format\n"
                      "f=" +
                      dir_.path() +
                      "/state.copy\n"
                      "cat /proc/self/fd/$PSMD_HANDOVER_FD >\"$f\"\n"
                      "case $DAMAGE_AT in\n"
                      "  t*) truncate -s \"${DAMAGE_AT#t}\" \"$f\" ;;\n"
                      "  *) printf '\\x5a' | dd of=\"$f\" bs=1 "
                      "seek=$((DAMAGE_AT)) conv=notrunc status=none ;;\n"
                      "esac\n"
                      "exec {copy}<\"$f\"\n"
                      "rm -f \"$f\"\n"
                      "exec {PSMD_HANDOVER_FD}<&-\n"
                      "PSMD_HANDOVER_FD=$copy exec " +
                      psmd + " \"$@\"\n");
  // A byte of the body changed; the format field changed; the file cut
  // short after its envelope.
  for (const char* at : {"200", "8", "t100"}) {
    SCOPED_TRACE(std::string("damage at byte ") + at);
    TempDir dir;
    Daemon d(dir, {}, {{"DAMAGE_AT", at}});
    Pair p;
    p.Start(dir, d, "p", kJobA, 1000000, 64);
    // Attached: a client still attaching when the state is refused is told
    // only that psmd did not answer its attach request.
    ASSERT_TRUE(WaitUntil(20, [&] { return p.Attached(); })) << p.Errors();
    ASSERT_EQ(EndpointCount(dir, d), 2);
    RunResult up = Psmctl(dir, d, {"upgrade", "--exec", wrapper});
    EXPECT_EQ(up.exit_code, 1) << up.out;
    EXPECT_NE(up.err.find("did not take over the 2 endpoints"),
              std::string::npos)
        << up.err << d.Log();
    // Their requests fail with PSM2_EP_WAS_CLOSED (exit 2 or 4: an API
    // error, or a request that ended with an error).
    const int r0 = p.r0.Wait(30), r1 = p.r1.Wait(30);
    EXPECT_TRUE(r0 == 2 || r0 == 4) << r0;
    EXPECT_TRUE(r1 == 2 || r1 == 4) << r1;
    const std::string errors = p.Errors();
    EXPECT_NE(errors.find("could not take over from"), std::string::npos)
        << errors;
    const std::string why = std::string(at) == "8"      ? "state format"
                            : std::string(at) == "t100" ? "state length"
                                                        : "checksum mismatch";
    EXPECT_NE(errors.find(why), std::string::npos) << errors;
    EXPECT_NE(d.Log().find("handover refused"), std::string::npos) << d.Log();
    Pair after;
    after.Start(dir, d, "after", kJobB, 1000, 64);
    EXPECT_EQ(after.r0.Wait(30), 0) << after.Errors();
    EXPECT_EQ(after.r1.Wait(30), 0) << after.Errors();
    EXPECT_TRUE(d.Stop());
  }
}

}  // namespace
}  // namespace psmd::testing
