#!/usr/bin/env python3
"""psmd's journald sink, with the test as the journal.

psmd logs through sd_journal_send, which writes datagrams in the journal's
native protocol (KEY=value lines) to /run/systemd/journal/socket. There is
no journald here, so the test is one: in a private mount namespace with its
own /run (unshare -m; nothing outside changes), it binds that socket, starts
psmd with --log-target journal, makes it log an info line (start-up) and a
warning (a connection that sends junk), and checks that each datagram
carries the right syslog PRIORITY, psmd's identifier, and one whole
message. Needs root (unshare, mount), as CI has.
"""
import os
import socket
import subprocess
import sys
import tempfile
import time

NS_FLAG = "--in-namespace"


def parse(datagram):
    """The fields of one native-protocol datagram (text values only)."""
    fields = {}
    for line in datagram.decode("utf-8", "replace").split("\n"):
        if "=" in line:
            key, value = line.split("=", 1)
            fields[key] = value
    return fields


def in_namespace(psmd, workdir):
    os.makedirs("/run/systemd/journal", exist_ok=True)
    journal = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    journal.bind("/run/systemd/journal/socket")
    journal.settimeout(0.2)
    sock = os.path.join(workdir, "psmd.sock")
    proc = subprocess.Popen([psmd, "--socket", sock, "--log-target", "journal"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.time() + 10
        while not os.path.exists(sock) and time.time() < deadline:
            time.sleep(0.02)
        time.sleep(0.2)
        junk = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        junk.connect(sock)
        junk.sendall(b"GET / HTTP/1.1\r\n\r\n")
        junk.close()
        entries = []
        deadline = time.time() + 5
        while time.time() < deadline:
            try:
                entries.append(parse(journal.recv(65536)))
            except socket.timeout:
                if any(e.get("PRIORITY") == "4" for e in entries):
                    break
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=10)
    failures = []
    if err.strip():
        failures.append("psmd wrote to stderr with --log-target journal: %r"
                        % err[:200])
    if not entries:
        failures.append("no journal entries")
    for e in entries:
        if e.get("SYSLOG_IDENTIFIER") != "psmd":
            failures.append("entry without SYSLOG_IDENTIFIER=psmd: %r" % e)
        if "\n" in e.get("MESSAGE", "\n"):
            failures.append("entry without one whole MESSAGE: %r" % e)
    infos = [e for e in entries if e.get("PRIORITY") == "6"]
    warnings = [e for e in entries if e.get("PRIORITY") == "4"]
    if not any("serving" in e.get("MESSAGE", "") for e in infos):
        failures.append("the start-up line is not an info (PRIORITY=6) entry")
    if not any("sent neither gRPC nor an attach request" in e.get("MESSAGE", "")
               for e in warnings):
        failures.append("the junk connection's warning is not a PRIORITY=4 "
                        "entry (journalctl -p warning would miss it)")
    for f in failures:
        print("FAIL:", f)
    print("%d entries: %d info, %d warning" % (len(entries), len(infos),
                                               len(warnings)))
    return 1 if failures else 0


def main():
    if len(sys.argv) > 3 and sys.argv[1] == NS_FLAG:
        subprocess.run(["mount", "--make-rprivate", "/"], check=True)
        subprocess.run(["mount", "-t", "tmpfs", "tmpfs", "/run"], check=True)
        return in_namespace(sys.argv[2], sys.argv[3])
    psmd = os.path.abspath(sys.argv[1])
    with tempfile.TemporaryDirectory(
            prefix="psmd-journal-", dir=os.environ.get("PSMD_TEST_TMP")) as work:
        return subprocess.run(["unshare", "-m", sys.executable,
                               os.path.abspath(__file__), NS_FLAG, psmd,
                               work], timeout=60).returncode


if __name__ == "__main__":
    sys.exit(main())
