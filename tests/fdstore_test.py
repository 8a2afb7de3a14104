#!/usr/bin/env python3
"""systemctl restart psmd without ending a job, with the test as systemd.

Under systemd, psmd answers SIGTERM by storing its state file and every
descriptor its endpoints need in the service's file-descriptor store
(sd_pid_notify_with_fds, FDSTORE=1 and a name each), and systemd hands them
to the psmd it starts next (sd_listen_fds_with_names): what systemctl
restart does. A stop discards the store, which ends the endpoints. There is
no systemd here, so the test plays its part of that protocol as
sd_notify(3), sd_listen_fds(3) and systemd.service(5) specify it, and as
systemd 252 (Debian 12's) does it: the notify socket (NOTIFY_SOCKET),
descriptors kept by name (a file stored twice kept once), dropped when they
hang up (POLLHUP) or are removed (FDSTOREREMOVE=1 and a name), passed back
from fd 3 on with LISTEN_FDS, LISTEN_FDNAMES and LISTEN_PID, the socket
unit's listening socket first (psmd.socket, socket activation), then the
store newest first (service_add_fd_store prepends), and KEPT across starts:
systemd hands the whole store to every start until the unit stops for
good. scripts/test_systemd.sh runs the same under a real systemd.
psmd, its clients and their exchanges are real. A third run gives the managed psmd a fabric and a second psmd
(node 2, started plainly) to serve a job across the two: the restart
carries the job's session too (docs/design.md, "Handover with a fabric").

usage: fdstore_test.py PSMD PSMCTL EXCHANGE
"""
import array
import ctypes
import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

PSMD, PSMCTL, EXCHANGE = sys.argv[1:4]
failures = 0


def check(ok, what):
    global failures
    print(("ok: " if ok else "FAIL: ") + what, flush=True)
    failures += 0 if ok else 1


_libc = ctypes.CDLL(None, use_errno=True)
SYS_KCMP, KCMP_FILE = 312, 0  # x86_64


def same_file(a, b):
    """systemd's same_fd(): one open file description (kcmp KCMP_FILE)."""
    pid = os.getpid()
    return _libc.syscall(SYS_KCMP, pid, pid, KCMP_FILE, a, b) == 0


class ServiceManager:
    """systemd's side of a Type=notify service with a file-descriptor store."""

    def __init__(self, workdir, activate, extra=()):
        self.workdir = workdir
        self.extra = list(extra)  # psmd's flags beyond the socket
        self.sock = os.path.join(workdir, "psmd.sock")
        self.notify_path = os.path.join(workdir, "notify")
        self.notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.notify.bind(self.notify_path)
        self.notify.settimeout(0.1)
        self.store = []  # [name, fd], newest first
        self.ready = threading.Event()
        self.drained = threading.Event()
        self.listening = None
        if activate:  # psmd.socket
            self.listening = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self.listening.bind(self.sock)
            os.chmod(self.sock, 0o666)
            self.listening.listen(128)
        self.proc = None
        self.running = True
        self.log = open(os.path.join(workdir, "psmd.log"), "ab")
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        while self.running:
            try:
                msg, anc, _, _ = self.notify.recvmsg(
                    4096, socket.CMSG_SPACE(253 * 4), socket.MSG_CMSG_CLOEXEC)
            except socket.timeout:
                continue
            except OSError:
                return
            fds = array.array("i")
            for level, kind, data in anc:
                if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                    fds.frombytes(data[:len(data) - len(data) % fds.itemsize])
            fields = dict(l.split("=", 1) for l in msg.decode().split("\n")
                          if "=" in l)
            if fields.get("FDSTORE") == "1":
                name = fields.get("FDNAME", "stored")
                for fd in fds:
                    if any(same_file(fd, k) for _, k in self.store):
                        os.close(fd)  # "already stored"
                    else:
                        self.store.insert(0, [name, fd])
            else:
                for fd in fds:
                    os.close(fd)
            if fields.get("FDSTOREREMOVE") == "1":
                self.forget(fields.get("FDNAME"))
            if fields.get("READY") == "1":
                self.ready.set()
            if fields.get("DRAINED") == "1":
                self.drained.set()

    def _drop_hung_up(self):
        # "automatically closed when POLLHUP or POLLERR is seen on them"
        for entry in list(self.store):
            p = select.poll()
            p.register(entry[1], select.POLLIN)
            if any(ev & (select.POLLHUP | select.POLLERR) for _, ev in p.poll(0)):
                os.close(entry[1])
                self.store.remove(entry)

    def start(self):
        self._drop_hung_up()
        fds, names = [], []
        if self.listening is not None:
            # The socket unit's descriptors in blocking mode, whatever the
            # last psmd set (NonBlocking=no: systemd's flags_fds at exec).
            os.set_blocking(self.listening.fileno(), True)
            fds.append(self.listening.fileno())
            names.append("psmd.socket")
        for name, fd in self.store:
            fds.append(fd)
            names.append(name)

        def arrange():  # in the child: fds at 3, 4, ...
            for i, fd in enumerate(fds):
                os.dup2(fd, 10000 + i)
            for i in range(len(fds)):
                os.dup2(10000 + i, 3 + i)
                os.close(10000 + i)

        env = dict(os.environ, NOTIFY_SOCKET=self.notify_path)
        if fds:
            env.update(LISTEN_FDS=str(len(fds)), LISTEN_FDNAMES=":".join(names))
        self.ready.clear()
        # LISTEN_PID is psmd's own pid: the shell's, which exec keeps.
        self.proc = subprocess.Popen(
            ["/bin/sh", "-c", 'LISTEN_PID=$$; export LISTEN_PID; exec "$0" "$@"',
             PSMD, "--socket", self.sock, "--config", "/dev/null",
             *self.extra],
            env=env, preexec_fn=arrange, close_fds=False,
            stdout=self.log, stderr=self.log)
        # The store keeps its copies: psmd removes them (FDSTOREREMOVE).
        return self.ready.wait(20)

    def sigterm(self):
        self.proc.send_signal(signal.SIGTERM)
        code = self.proc.wait(30)
        self._drain()
        return code

    def names(self):
        """What the store holds, once every message sent so far is read."""
        self._drain()
        return [name for name, _ in self.store]

    def _drain(self):
        # What psmd sent before it exited may still wait in the notify
        # socket for the reader thread (seen under load in CI: the state
        # not yet in the store when looked at). Datagrams keep their order:
        # once the reader has seen one of ours, it has seen every earlier one.
        self.drained.clear()
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
            s.sendto(b"DRAINED=1", self.notify_path)
        if not self.drained.wait(10):
            raise RuntimeError("the notify reader did not drain within 10 s")

    def forget(self, name):
        """What a psmd's FDSTOREREMOVE=1 of `name` does."""
        for entry in [e for e in self.store if e[0] == name]:
            os.close(entry[1])
            self.store.remove(entry)

    def discard(self):  # the unit fully stopped: the store is flushed
        for _, fd in self.store:
            os.close(fd)
        self.store.clear()

    def close(self):
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.running = False
        self.reader.join()
        self.notify.close()
        self.discard()
        if self.listening is not None:
            self.listening.close()
        self.log.close()


def psmctl(mgr, *args):
    return subprocess.run([PSMCTL, "--socket", mgr.sock, *args],
                          capture_output=True, text=True, timeout=60)


def pair(mgr, name, uuid, messages, max_size, hold=0, rank1_socket=None):
    """An exchange of two ranks on mgr's psmd (rank 1 on rank1_socket's, if
    given: another node's)."""
    rv = os.path.join(mgr.workdir, name)
    os.mkdir(rv)
    procs = []
    for rank in (1, 0):
        sock = rank1_socket if rank == 1 and rank1_socket else mgr.sock
        procs.append(subprocess.Popen(
            [EXCHANGE, "--rank", str(rank), "--dir", rv, "--uuid", uuid,
             "--messages", str(messages), "--max-size", str(max_size),
             "--hold-seconds", str(hold)],
            env=dict(os.environ, PSMD_SOCKET=sock), stdout=subprocess.DEVNULL,
            stderr=open(os.path.join(rv, "r%d.err" % rank), "w")))
    return procs, rv


def errors(rv):
    return "".join(open(os.path.join(rv, f)).read() for f in ("r0.err", "r1.err"))


def all_failed(procs, timeout):
    """Whether every one of procs exits non-zero within timeout s."""
    try:
        return all(p.wait(timeout) not in (0, None) for p in procs)
    except subprocess.TimeoutExpired:
        return False


def wait_holding(rv):
    """Both ranks connected and holding (exchange writes holding.R then)."""
    for _ in range(400):
        if all(os.path.exists(os.path.join(rv, "holding.%d" % r))
               for r in (0, 1)):
            return True
        time.sleep(0.05)
    return False


def wait_endpoints(mgr, n):
    for _ in range(400):
        out = psmctl(mgr, "health", "--json").stdout
        if '"endpoint_count": %d,' % n in out:
            return True
        time.sleep(0.05)
    return False


def end(procs):
    """Kills (by pid) and reaps whichever of procs still run."""
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.wait()


def restart_under(mgr, small, large, endpoints, restarts=1):
    """systemctl restart (SIGTERM, the process exits, a new one starts with
    what the store holds) `restarts` times under two running pairs (procs,
    rendezvous dir): each next psmd takes their `endpoints` over, empties
    the store, and both pairs finish intact."""
    procs = small[0] + large[0]
    for generation in range(1, restarts + 1):
        code = mgr.sigterm()
        check(code == 0, "psmd exited 0 on SIGTERM (%s)" % code)
        names = mgr.names()
        check(names.count("psmd-state") == 1,
              "its state, once, is in the store: %s" % names[:4])
        check(all(p.poll() is None for p in procs),
              "both exchanges still ran at the restart")
        check(mgr.start(), "the next psmd started and said READY=1")
        health = psmctl(mgr, "health", "--json").stdout
        check('"generation": %d,' % generation in health and
              '"last_carried_endpoints": %d' % endpoints in health,
              "it took the %d endpoints over (generation %d): %s" %
              (endpoints, generation, health.strip()))
        # Left there, systemd would hand this state to the next start too,
        # and keep the clients from seeing a crash (handover.h).
        check(mgr.names() == [], "it emptied the store: %s" % mgr.names()[:4])
    for p in procs:
        p.wait(120)
    for name, (pair_procs, rv) in (("small", small), ("large", large)):
        check(all(p.returncode == 0 for p in pair_procs),
              "the %s pair finished intact %s" % (name, errors(rv)))
    check("lost psmd" not in errors(small[1]) + errors(large[1]),
          "no client lost psmd")


def run(activate):
    print("-- %s" % ("socket-activated (psmd.socket)" if activate
                     else "psmd's own socket"), flush=True)
    with tempfile.TemporaryDirectory(prefix="psmd-fdstore.", dir="/tmp") as d:
        mgr = ServiceManager(d, activate)
        procs = []
        try:
            check(mgr.start(), "psmd started and said READY=1")
            small, rv_small = pair(mgr, "small", "5053d0d0" + "a" * 24, 400000, 64)
            large, rv_large = pair(mgr, "large", "5053d0d0" + "b" * 24, 30000, 192 * 1024)
            procs = small + large
            check(wait_endpoints(mgr, 4), "4 endpoints open")
            restart_under(mgr, (small, rv_small), (large, rv_large), 4,
                          restarts=3)
            # A crash after a restart (Restart=on-failure): the clients see
            # it at once, and the next psmd adopts nothing.
            busy, rv_busy = pair(mgr, "crashed", "5053d0d0" + "f" * 24,
                                 50000000, 64)
            procs = busy
            check(wait_endpoints(mgr, 2), "a busy pair open")
            check(mgr.sigterm() == 0 and mgr.start(),
                  "restarted under the busy pair")
            check(wait_endpoints(mgr, 2), "the busy pair carried over")
            check(all(p.poll() is None for p in busy), "it still exchanges")
            mgr.proc.kill()
            mgr.proc.wait()
            t0 = time.monotonic()
            ended = all_failed(busy, 20)
            check(ended and "lost psmd" in errors(rv_busy),
                  "a crash ends the busy pair within %.1f s (lost psmd): %s" %
                  (time.monotonic() - t0, errors(rv_busy)[:300]))
            check(mgr.start(), "the psmd started after the crash said READY=1")
            health = psmctl(mgr, "health", "--json").stdout
            check('"generation": 0,' in health and
                  '"endpoint_count": 0,' in health,
                  "it adopted nothing: %s" % health.strip())
            # A successor killed in its adoption: it took the state out of
            # the store, and ended before it took the rest. The next psmd
            # ends those endpoints with the reason, empties the store, and
            # serves on its socket (the held pair below connects to it).
            # (Connected first: held for 2 s, then busy.)
            orphan, rv_orphan = pair(mgr, "orphaned", "5053d0d0" + "e" * 24,
                                     50000000, 64, hold=2)
            procs = orphan
            check(wait_holding(rv_orphan) and wait_endpoints(mgr, 2),
                  "a pair open and connected")
            check(mgr.sigterm() == 0, "psmd stored the pair")
            mgr.forget("psmd-state")
            check(mgr.start(),
                  "a psmd started over a store without a state said READY=1")
            t0 = time.monotonic()
            ended = all_failed(orphan, 20)
            check(ended and "without their state" in errors(rv_orphan),
                  "the pair ended within %.1f s, told why: %s" %
                  (time.monotonic() - t0, errors(rv_orphan)[:300]))
            health = psmctl(mgr, "health", "--json").stdout
            check('"generation": 0,' in health and
                  '"endpoint_count": 0,' in health and
                  '"crash_restarts": 2,' in health,
                  "it adopted nothing and counted a second crash: %s" %
                  health.strip())
            check(mgr.names() == [], "it emptied the store: %s" % mgr.names())
            # systemctl stop: the store is discarded, the endpoints end.
            # (held idle for a few seconds, so that the stop comes first)
            held, rv_held = pair(mgr, "held", "5053d0d0" + "c" * 24, 10, 64, hold=5)
            procs = held
            check(wait_holding(rv_held) and wait_endpoints(mgr, 2),
                  "a held pair open and connected")
            check(mgr.sigterm() == 0, "stop: psmd exited 0")
            mgr.discard()
            ended = all_failed(held, 60)
            check(ended and "lost psmd" in errors(rv_held),
                  "a stop ends the endpoints (lost psmd): " + errors(rv_held)[:300])
        finally:
            end(procs)
            mgr.close()
            log = open(os.path.join(d, "psmd.log"), errors="replace").read()
            if failures:
                print(log[-4000:])
    left = [f for f in os.listdir("/dev/shm") if "psmd" in f]
    check(not left, "nothing left in /dev/shm")


def free_port(host):
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def run_with_fabric():
    """systemctl restart of node 1's psmd under a job across nodes 1 and 2."""
    print("-- with a fabric: a job across two nodes", flush=True)
    with tempfile.TemporaryDirectory(prefix="psmd-fdstore.", dir="/tmp") as d:
        listen = {1: "127.0.0.2:%d" % free_port("127.0.0.2"),
                  2: "127.0.0.3:%d" % free_port("127.0.0.3")}
        nodes = os.path.join(d, "nodes")
        with open(nodes, "w") as f:
            for n in (1, 2):
                f.write("%d node%d %d@%s\n" % (n, n, n, listen[n]))

        def flags(n):
            return ["--node-id", str(n), "--fabric-listen", listen[n],
                    "--fabric-nodes", nodes, "--fabric-auth", "none",
                    "--fabric-sessions", "on"]
        mgr = ServiceManager(d, activate=False, extra=flags(1))
        sock2 = os.path.join(d, "psmd2.sock")
        log2 = open(os.path.join(d, "psmd2.log"), "ab")
        node2 = subprocess.Popen(
            [PSMD, "--socket", sock2, "--config", "/dev/null", *flags(2)],
            stdout=log2, stderr=log2)
        procs = []
        try:
            check(mgr.start(), "node 1's psmd started and said READY=1")
            for _ in range(400):
                if os.path.exists(sock2):
                    break
                time.sleep(0.05)
            small, rv_small = pair(mgr, "small", "5053d0d0" + "d" * 24,
                                   200000, 64, rank1_socket=sock2)
            large, rv_large = pair(mgr, "large", "5053d0d0" + "e" * 24,
                                   10000, 192 * 1024, rank1_socket=sock2)
            procs = small + large
            # Both pairs connected across the nodes (past the exchange
            # program's connect barrier): node 1 has a session to carry.
            for _ in range(400):
                if all(os.path.exists(os.path.join(rv, "rank1%d.epid" % r))
                       for rv in (rv_small, rv_large) for r in (0, 1)):
                    break
                time.sleep(0.05)
            check(wait_endpoints(mgr, 2), "2 endpoints open on node 1")
            restart_under(mgr, (small, rv_small), (large, rv_large), 2)
            log1 = open(os.path.join(d, "psmd.log"), errors="replace").read()
            check("fabric: adopted 1 sessions" in log1,
                  "the next psmd adopted the session with node 2")
            log2.flush()
            log = open(os.path.join(d, "psmd2.log"), errors="replace").read()
            check("resumed" in log and "not resumed" not in log,
                  "node 2 resumed the session")
        finally:
            end(procs)
            mgr.close()
            node2.terminate()
            try:
                node2.wait(30)
            except subprocess.TimeoutExpired:
                node2.kill()
                node2.wait()
            log2.close()
            if failures:
                print(open(os.path.join(d, "psmd.log"),
                           errors="replace").read()[-3000:])
                print(open(os.path.join(d, "psmd2.log"),
                           errors="replace").read()[-3000:])
    left = [f for f in os.listdir("/dev/shm") if "psmd" in f]
    check(not left, "nothing left in /dev/shm")


run(activate=True)
run(activate=False)
run_with_fabric()
print("%d failures" % failures)
sys.exit(1 if failures else 0)
