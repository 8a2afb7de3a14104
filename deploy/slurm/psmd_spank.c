/* psmd's SPANK plugin for Slurm (plugstack.conf: `required
 * /usr/lib/x86_64-linux-gnu/slurm-wlm/psmd_spank.so`; docs/operations.md,
 * "Running under Slurm"). In slurmstepd (remote context) only:
 *
 *   slurm_spank_task_init_privileged, in each task's process before it
 *   drops root and execs: sets the step's PSM2 job key in the task's
 *   environment (OMPI_MCA_orte_precondition_transports, which Open MPI's
 *   mtl psm2 and mtl psmd take as the key), from Slurm's job and step ids:
 *   the step's ranks share it, two steps never do.
 *   slurm_spank_task_post_fork, in slurmstepd as root once the task's
 *   process is in the step's cgroups and before any task execs (Slurm
 *   releases them only after every task's post_fork): registers the step
 *   with the node's psmd (job key, job id, step id, uid, and the step's
 *   cgroup as the task's /proc/PID/cgroup shows it: RegisterSlurmStep, root
 *   only), at its first task on the node, with the step's tasks and
 *   memory on the node, from which psmd sets its job's budgets there
 *   (psmd.toml(5): slurm_endpoints_per_task, slurm_unexpected_percent).
 *   So no task can open an endpoint before its step is known. When
 *   registering fails (psmd down or hung), the step fails (the error says
 *   why) and the plugin cancels it on every node (cancel_step), so the job
 *   fails at once rather than hang. task_init_privileged cannot
 *   register: it runs in the task before slurmstepd has put it in the
 *   step's cgroups; user_init neither: it runs without root, before any
 *   task exists.
 *   slurm_spank_exit, once the step's tasks are gone: tells psmd the step
 *   ended (EndSlurmStep); psmd closes what the step left open and the
 *   plugin logs it (slurmd's log).
 *
 * It talks to psmd through psmctl (slurm-register, slurm-end), run as root
 * with an empty environment, so that no gRPC runs inside slurmstepd.
 * Arguments (plugstack.conf, after the path): psmctl=PATH (default
 * /usr/bin/psmctl), socket=PATH (psmd's control socket, default
 * /run/psmd/psmd.sock).
 *
 * Thread-safety: Slurm calls a plugin's callbacks from one thread per
 * process; the options below are set once, in slurm_spank_init.
 */
#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <signal.h>
#include <slurm/slurm.h>
#include <slurm/spank.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

SPANK_PLUGIN(psmd, 1);

static const char* psmctl_path = "/usr/bin/psmctl";
static const char* socket_path = "/run/psmd/psmd.sock";

/* psmctl's bound: a psmd that does not answer fails the task, never hangs
 * it. */
enum { kTimeoutMs = 10000, kOutputBytes = 4096 };

int slurm_spank_init(spank_t sp, int ac, char** av) {
  (void)sp;
  for (int i = 0; i < ac; i++) {
    if (strncmp(av[i], "psmctl=", 7) == 0) {
      psmctl_path = av[i] + 7;
    } else if (strncmp(av[i], "socket=", 7) == 0) {
      socket_path = av[i] + 7;
    } else {
      slurm_error(
          "psmd: unknown plugstack.conf argument '%s' (psmctl=PATH, "
          "socket=PATH)",
          av[i]);
      return -1;
    }
  }
  return 0;
}

static long long now_ms(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (long long)t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

/* Runs psmctl with `args` (NULL-terminated, after the program's name and
 * --socket), collecting its output (stdout and stderr) in `out`. Returns its
 * exit status, or -1 when it could not run or did not end in time. */
static int run_psmctl(const char* const* args, char* out, size_t out_len) {
  const char* argv[24];
  size_t n = 0;
  argv[n++] = psmctl_path;
  argv[n++] = "--socket";
  argv[n++] = socket_path;
  for (size_t i = 0; args[i] != NULL && n + 1 < sizeof(argv) / sizeof(*argv);
       i++) {
    argv[n++] = args[i];
  }
  argv[n] = NULL;
  out[0] = '\0';
  int pipe_fds[2];
  if (pipe(pipe_fds) != 0) {
    snprintf(out, out_len, "pipe: %s", strerror(errno));
    return -1;
  }
  pid_t pid = fork();
  if (pid < 0) {
    snprintf(out, out_len, "fork: %s", strerror(errno));
    close(pipe_fds[0]);
    close(pipe_fds[1]);
    return -1;
  }
  if (pid == 0) {
    static char* const env[] = {"PATH=/usr/sbin:/usr/bin:/sbin:/bin", NULL};
    dup2(pipe_fds[1], STDOUT_FILENO);
    dup2(pipe_fds[1], STDERR_FILENO);
    close(pipe_fds[0]);
    close(pipe_fds[1]);
    execve(psmctl_path, (char* const*)argv, env);
    fprintf(stderr, "cannot run %s: %s\n", psmctl_path, strerror(errno));
    _exit(127);
  }
  close(pipe_fds[1]);
  size_t got = 0;
  const long long deadline = now_ms() + kTimeoutMs;
  int timed_out = 0;
  for (;;) {
    long long left = deadline - now_ms();
    if (left <= 0) {
      timed_out = 1;
      break;
    }
    struct pollfd p = {pipe_fds[0], POLLIN, 0};
    int r = poll(&p, 1, (int)left);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) continue;
    char buf[512];
    ssize_t k = read(pipe_fds[0], buf, sizeof(buf));
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) break; /* psmctl closed its output: it is ending */
    size_t take = (size_t)k;
    if (got + take >= out_len) take = out_len - 1 - got;
    memcpy(out + got, buf, take);
    got += take;
    out[got] = '\0';
  }
  close(pipe_fds[0]);
  if (timed_out) kill(pid, SIGKILL);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (timed_out) {
    snprintf(out, out_len, "%s did not answer within %d ms (is psmd hung?)",
             psmctl_path, kTimeoutMs);
    return -1;
  }
  while (got > 0 && out[got - 1] == '\n') out[--got] = '\0';
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

/* The step's cgroup: the line of /proc/PID/cgroup whose path holds
 * "/job_JOB/step_", cut after the step's directory; the freezer
 * hierarchy's when there is one (proctrack/cgroup's, which holds every
 * process of the step), else the first such (cgroup v2: "0::"). */
static int step_cgroup(pid_t pid, uint32_t job, char* out, size_t out_len) {
  char path[64];
  snprintf(path, sizeof(path), "/proc/%d/cgroup", (int)pid);
  FILE* f = fopen(path, "r");
  if (f == NULL) return -1;
  char want[32];
  snprintf(want, sizeof(want), "/job_%" PRIu32 "/step_", job);
  char line[1024];
  int found = 0;
  while (fgets(line, sizeof(line), f) != NULL) {
    char* at = strstr(line, want);
    if (at == NULL) continue;
    char* end = strpbrk(at + strlen(want), "/\n");
    if (end != NULL) *end = '\0';
    const int freezer = strstr(line, ":freezer:") != NULL;
    if (!found || freezer) {
      snprintf(out, out_len, "%s", line);
      found = 1;
    }
    if (freezer) break;
  }
  fclose(f);
  return found ? 0 : -1;
}

/* The step's PSM2 job key, as Open MPI writes orte_precondition_transports:
 * "psmd" and the job id, "slrm" and the step id. */
static void job_key(uint32_t job, uint32_t step, char* out, size_t out_len) {
  snprintf(out, out_len, "%016" PRIx64 "-%016" PRIx64,
           ((uint64_t)0x70736d64 << 32) | job,
           ((uint64_t)0x736c726d << 32) | step);
}

/* A step's ids, as numbers and as psmctl's arguments. */
struct step {
  uint32_t job, id;
  char job_text[16], id_text[16];
};

/* In slurmstepd (remote context): fills *st and returns 1, or -1 when
 * Slurm does not say. Elsewhere (srun, sbatch: nothing to do here): 0. */
static int remote_step(spank_t sp, struct step* st) {
  if (spank_context() != S_CTX_REMOTE) return 0;
  if (spank_get_item(sp, S_JOB_ID, &st->job) != ESPANK_SUCCESS ||
      spank_get_item(sp, S_JOB_STEPID, &st->id) != ESPANK_SUCCESS) {
    slurm_error("psmd: cannot get the job and step ids");
    return -1;
  }
  snprintf(st->job_text, sizeof(st->job_text), "%" PRIu32, st->job);
  snprintf(st->id_text, sizeof(st->id_text), "%" PRIu32, st->id);
  return 1;
}

int slurm_spank_task_init_privileged(spank_t sp, int ac, char** av) {
  (void)ac;
  (void)av;
  struct step st;
  const int remote = remote_step(sp, &st);
  if (remote <= 0) return remote;
  char key[40];
  job_key(st.job, st.id, key, sizeof(key));
  if (spank_setenv(sp, "OMPI_MCA_orte_precondition_transports", key, 1) !=
      ESPANK_SUCCESS) {
    slurm_error("psmd: cannot set the job key in the task's environment");
    return -1;
  }
  return 0;
}

/* slurmstepd's: its step is registered (the first task's post_fork). */
static int registered;

/* A step that cannot register on this node fails here, but Slurm 22.05
 * does not end it on its other nodes: their ranks wait in PMIx's fence for
 * this node's, and srun never returns (docs/operations.md, "A node whose
 * psmd is down"). So the plugin ends the step everywhere itself, as
 * `scancel --signal=KILL JOB.STEP` would (slurmctld signals every node's
 * tasks; root's request, through slurmstepd's own libslurm and its MUNGE
 * credential): srun then returns at once with the error above and the
 * step's tasks killed. Once per slurmstepd. */
static void cancel_step(const struct step* st) {
  static int cancelled;
  if (cancelled) return;
  cancelled = 1;
  slurm_error(
      "psmd: cancelling step %s.%s on every node: its tasks cannot use psmd "
      "on this node",
      st->job_text, st->id_text);
  if (slurm_kill_job_step(st->job, st->id, SIGKILL) != 0) {
    slurm_error("psmd: could not cancel step %s.%s: %s", st->job_text,
                st->id_text, strerror(errno));
  }
}

int slurm_spank_task_post_fork(spank_t sp, int ac, char** av) {
  (void)ac;
  (void)av;
  struct step st;
  const int remote = registered ? 0 : remote_step(sp, &st);
  if (remote <= 0) return remote;
  uid_t uid;
  pid_t pid;
  if (spank_get_item(sp, S_JOB_UID, &uid) != ESPANK_SUCCESS ||
      spank_get_item(sp, S_TASK_PID, &pid) != ESPANK_SUCCESS) {
    slurm_error("psmd: cannot get the job's uid or the task's pid");
    return -1;
  }
  char cgroup[1024];
  if (step_cgroup(pid, st.job, cgroup, sizeof(cgroup)) != 0) {
    slurm_error(
        "psmd: job %s step %s: no cgroup of the step in "
        "/proc/%d/cgroup (psmd needs proctrack/cgroup or task/cgroup)",
        st.job_text, st.id_text, (int)pid);
    return -1;
  }
  /* The step's allocation on this node, for its budgets in psmd: its tasks
   * here, and its memory here (the step's, else the job's; 0 when Slurm
   * does not track memory, SelectTypeParameters without _Memory). */
  uint32_t tasks = 0;
  uint64_t step_mem = 0, job_mem = 0;
  if (spank_get_item(sp, S_JOB_LOCAL_TASK_COUNT, &tasks) != ESPANK_SUCCESS)
    tasks = 0;
  if (spank_get_item(sp, S_STEP_ALLOC_MEM, &step_mem) != ESPANK_SUCCESS)
    step_mem = 0;
  if (spank_get_item(sp, S_JOB_ALLOC_MEM, &job_mem) != ESPANK_SUCCESS)
    job_mem = 0;
  char key[40], uid_text[16], tasks_text[16], mem_text[24];
  job_key(st.job, st.id, key, sizeof(key));
  snprintf(uid_text, sizeof(uid_text), "%u", (unsigned)uid);
  snprintf(tasks_text, sizeof(tasks_text), "%" PRIu32, tasks);
  snprintf(mem_text, sizeof(mem_text), "%" PRIu64,
           step_mem != 0 ? step_mem : job_mem);
  const char* args[] = {"slurm-register", "--job-key",    key,        "--job",
                        st.job_text,      "--step",       st.id_text, "--uid",
                        uid_text,         "--cgroup",     cgroup,     "--tasks",
                        tasks_text,       "--memory-mib", mem_text,   NULL};
  char out[kOutputBytes];
  if (run_psmctl(args, out, sizeof(out)) != 0) {
    slurm_error("psmd: cannot register job %s step %s with psmd at %s: %s",
                st.job_text, st.id_text, socket_path, out);
    cancel_step(&st);
    return -1;
  }
  registered = 1;
  return 0;
}

int slurm_spank_exit(spank_t sp, int ac, char** av) {
  (void)ac;
  (void)av;
  struct step st;
  const int remote = remote_step(sp, &st);
  if (remote <= 0) return remote;
  const char* args[] = {"slurm-end", "--job",    st.job_text,
                        "--step",    st.id_text, NULL};
  char out[kOutputBytes];
  if (run_psmctl(args, out, sizeof(out)) != 0) {
    slurm_error("psmd: cannot end job %s step %s in psmd at %s: %s",
                st.job_text, st.id_text, socket_path, out);
    return -1;
  }
  /* One log line per line of psmctl's: the step, then each endpoint it
   * left open. */
  for (char* line = strtok(out, "\n"); line != NULL;
       line = strtok(NULL, "\n")) {
    slurm_info("psmd: %s", line);
  }
  return 0;
}
