"""The man pages as a reader sees them (scdoc, then man): every name they
must carry appears exactly, underscores and all (scdoc takes an unescaped
'_' inside an emphasised name for the end of the emphasis and drops it).

usage: man_test.py PSMD COUNTERS_H PSMD_8_SCD (its folder holds the others)
  - psmd(8) names every long option of `psmd --help`;
  - psmd.toml(5) names every key of `psmd --check-config`;
  - psmctl(8) names every endpoint, refusal and peer counter of
    proto/counters.h (peer counters by their table column).
"""
import os
import re
import subprocess
import sys
import tempfile

psmd, counters_h, man_dir = sys.argv[1], sys.argv[2], os.path.dirname(sys.argv[3])


def rendered(page):
    with open(os.path.join(man_dir, page + ".scd")) as f:
        roff = subprocess.run(["scdoc"], stdin=f, capture_output=True,
                              text=True, check=True).stdout
    with tempfile.NamedTemporaryFile("w", suffix="." + page.split(".")[-1],
                                     dir=os.environ.get("TEST_TMPDIR")) as t:
        t.write(roff)
        t.flush()
        # One very long line per paragraph: no line breaks, no hyphens.
        env = dict(os.environ, MANWIDTH="100000", MAN_KEEP_FORMATTING="")
        text = subprocess.run(["man", "-l", t.name], capture_output=True,
                              text=True, env=env, check=True).stdout
    return re.sub(r".\x08", "", text)  # overstrike (bold, underline)


def missing(text, names):
    return [n for n in names if not re.search(r"(?<![\w-])" + re.escape(n) +
                                              r"(?![\w-])", text)]


failures = 0


def check(page, names, what):
    global failures
    gone = missing(rendered(page), names)
    print(f"{page}: {len(names) - len(gone)} of {len(names)} {what}")
    for n in gone:
        print(f"  MISSING from {page}: {n}")
    failures += len(gone)
    if not names:
        print(f"  no {what} found to check")
        failures += 1


help_text = subprocess.run([psmd, "--help"], capture_output=True, text=True,
                           check=True).stdout
options = sorted(set(re.findall(r"(--[a-z][a-z0-9-]+)", help_text)) - {"--help"})
check("psmd.8", options, "options of psmd --help")

config = subprocess.run([psmd, "--check-config", "--config", "/dev/null"],
                        capture_output=True, text=True).stdout
keys = sorted(set(re.findall(r"^([a-z_]+) =", config, re.M)))
check("psmd.toml.5", keys, "keys of psmd --check-config")

src = open(counters_h).read()
lists = {}
for m in re.finditer(r"#define (PSMD_\w+_COUNTERS)\(X\)(.*?)(?:\n\n|\n#)", src,
                     re.S):
    lists[m.group(1)] = re.findall(r"X\(\s*(\w+),\s*(\w+),", m.group(2))
names = [n for n, _ in lists.get("PSMD_ENDPOINT_COUNTERS", [])]
names += [n for n, _ in lists.get("PSMD_REFUSAL_COUNTERS", [])]
for peer in ("PSMD_FABRIC_TRAFFIC_COUNTERS", "PSMD_FABRIC_EVENT_COUNTERS",
             "PSMD_REMOTE_EVENT_COUNTERS"):
    names += [column for _, column in lists.get(peer, [])]
check("psmctl.8", sorted(set(names)), "counters of proto/counters.h")
print(f"{failures} missing")
sys.exit(1 if failures else 0)
