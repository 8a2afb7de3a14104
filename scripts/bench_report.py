#!/usr/bin/env python3
"""scripts/bench.sh's report: reads RAW (every program's output, named
BENCH.SYSTEM.ROUND...), prints the markdown tables and writes OUT/plot/*.dat
and OUT/plots.gp (gnuplot: latency.png, bandwidth.png, stream.png).

Usage: bench_report.py RAW OUT RUNS SYSTEM...

A cell is the median over the rounds of each round's value, with the
smallest and largest round in parentheses; a round whose program failed
contributes nothing ("failed" when no round has a value).
"""
import glob
import os
import re
import statistics
import sys

raw, out, nruns, systems = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4:]
rounds = range(1, nruns + 1)


def lines(path):
    try:
        with open(path) as f:
            return f.read().splitlines()
    except OSError:
        return []


def grab(path, pattern):
    """The first group of the last line of PATH matching PATTERN, a float."""
    found = None
    for line in lines(path):
        if m := re.search(pattern, line):
            found = float(m.group(1))
    return found


def fmt(v):
    if v >= 100:
        return f"{v:,.0f}"
    return f"{v:.1f}" if v >= 10 else f"{v:.2f}"


def cell(values):
    values = [v for v in values if v is not None]
    if not values:
        return "failed"
    m = statistics.median(values)
    if len(values) == 1:
        return fmt(m)
    return f"{fmt(m)} ({fmt(min(values))}–{fmt(max(values))})"


def table(head, rows):
    print("| " + " | ".join(head) + " |")
    print("| --- |" + " ---: |" * (len(head) - 1))
    for r in rows:
        print("| " + " | ".join(r) + " |")
    print()


# --- pt2pt: ping-pong, streams, overlap, per system and round.
pingpong, stream, overlap, alone = {}, {}, {}, {}
for s in systems:
    for r in rounds:
        size = None
        for line in lines(f"{raw}/pt2pt.{s}.{r}.r0"):
            w = line.split()
            if len(w) == 4 and w[0].isdigit():
                pingpong.setdefault((s, int(w[0])), []).append(float(w[1]))
            elif m := re.match(r"# stream: (\d+) B", line):
                size = int(m.group(1))
            elif m := re.match(r"median (\S+) Mmsg/s", line):
                stream.setdefault((s, size), []).append(float(m.group(1)) * 1e6)
            elif m := re.match(r"# overlap: \d+ B, alone (\S+) ms", line):
                alone.setdefault(s, []).append(float(m.group(1)))
            elif m := re.match(r"overlap median (\S+)", line):
                overlap.setdefault(s, []).append(100 * float(m.group(1)))

print("\n".join(lines(f"{raw}/conditions.head")))
conditions = [line.split() for line in lines(f"{raw}/conditions")]
busy = [c for c in conditions if c[3] == "busy"]
failed = [c for c in conditions if c[-1] != "0"]
print(f"{len(conditions) - len(busy)} of {len(conditions)} measurements started on a quiet "
      f"machine, {len(busy)} after waiting in vain"
      + (f" (busiest sample {max(int(c[4].rstrip('%')) for c in busy)}%)" if busy else "")
      + (f"; {len(failed)} failed: " + ", ".join(f"{c[0]} on {c[1]}" for c in failed)
         if failed else "") + ".")
bindings = sorted({re.sub(r"^\[[^]]*\] ", "", line) for s in systems[:1]
                   for line in lines(f"{raw}/pt2pt.{s}.1.err") if "bound to" in line})
print("Placement: " + ("; ".join(bindings) if bindings else "ranks on CPUs 0 and 1")
      + " (every MPI system; the PSM2 pairs with taskset likewise); psmd unpinned, "
      "but on CPU 1 for deep_match (both ranks on CPU 0) and hop (the client on CPU 0).\n")

sizes = sorted({z for (_, z) in pingpong})
shown = [z for z in sizes if z in (0, 1, 8, 64, 512, 4096, 32768, 262144, 1 << 20, 4 << 20,
                                   16 << 20, 64 << 20) or z == sizes[-1]]
print("Ping-pong half round trip, µs (bench/mpi_pt2pt):\n")
table(["bytes"] + systems,
      [[str(z)] + [cell(pingpong.get((s, z), [])) for s in systems] for z in shown])

ssizes = sorted({z for (_, z) in stream})
print("Streaming bandwidth, 64 sends outstanding, MB/s:\n")
table(["bytes"] + systems,
      [[str(z)] + [cell([v * z / 1e6 for v in stream.get((s, z), [])]) for s in systems]
       for z in ssizes if z >= 64])
if 8 in ssizes:
    print("Message rate, 8 B, 64 sends outstanding, million messages/s:\n")
    table(["system", "Mmsg/s"],
          [[s, cell([v / 1e6 for v in stream.get((s, 8), [])])] for s in systems])

osize = next((m.group(1) for s in systems for line in lines(f"{raw}/pt2pt.{s}.1.r0")
              if (m := re.match(r"# overlap: (\d+) B", line))), "?")
print(f"Asynchronous progress: one {osize} B message, both ranks compute 2× the "
      "transfer time T alone or 200 ms, whichever is longer, without calling the "
      "library; % of the transfer done when they return (1 - wait after / T):\n")
table(["system", "% done", "T alone, ms"],
      [[s, cell(overlap.get(s, [])), cell(alone.get(s, []))] for s in systems])

# --- PSM2 benchmarks.
psm2 = [s for s in systems if s in ("psmd", "intel")]


def per_round(pattern, fmtpath):
    return {s: [grab(fmtpath.format(s=s, r=r), pattern) for r in rounds] for s in psm2}


if psm2:
    rt = per_round(r"rt_us=(\S+)", raw + "/am_rate.{s}.{r}.r0")
    req = per_round(r"requests_per_s=(\S+)", raw + "/am_rate.{s}.{r}.r0")
    print("Active messages (bench/am_rate):\n")
    table(["system", "round trip, µs", "one-way requests, M/s"],
          [[s, cell(rt[s]), cell([v / 1e6 if v else None for v in req[s]])] for s in psm2])

    depths = sorted({int(p.split(".")[-2]) for p in glob.glob(f"{raw}/deep_match.*.r1")})
    rows = []
    for d in depths:
        for phase in ("posted", "unexpected"):
            rows.append([f"{d} {phase}"] + [
                cell([grab(f"{raw}/deep_match.{s}.{r}.{d}.r1", phase + r":\s+median (\S+) ns")
                      for r in rounds]) for s in psm2])
    print("Deep matching, ns per message (bench/deep_match):\n")
    table(["depth, queue"] + psm2, rows)

    hop = per_round(r"self (\S+) ns", raw + "/hop.{s}.{r}.r0")
    floor = [grab(f"{raw}/hop.floor.{r}.r0", r"cacheline (\S+) ns") for r in rounds]
    print("The hop: an 8 B message to oneself (bench/hop self) beside the cache-line "
          "round trip between CPUs 0 and 1, ns:\n")
    table(["system", "self round trip", "÷ cache line"],
          [[s, cell(hop[s]), cell([h / f if h and f else None for h, f in zip(hop[s], floor)])]
           for s in psm2] + [["cache line (floor)", cell(floor), ""]])

    print("Endpoint set-up, each in a fresh process, µs (bench/ep_open):\n")
    table(["step"] + psm2,
          [[step] + [cell([grab(f"{raw}/ep_open.{s}.{r}.r0", step + r" median (\S+) us")
                           for r in rounds]) for s in psm2]
           for step in ("init", "open", "connect", "close")])

if "psmd" in systems:
    print("psmd's idle CPU, % of one CPU (/proc/PID/stat utime + stime):\n")
    table(["clients", "psmd CPU %"],
          [[name, cell([grab(f"{raw}/idle.psmd.{r}.r0", f"idle {key} (\\S+)") for r in rounds])]
           for name, key in (("none", "none"), ("one, idle", "one"))])

# --- Plots: one line per system, median with min-max bars.
os.makedirs(f"{out}/plot", exist_ok=True)


def write(name, data):
    for s in systems:
        with open(f"{out}/plot/{name}.{s}.dat", "w") as f:
            for z, vals in sorted((z, v) for (t, z), v in data.items() if t == s and z > 0):
                f.write(f"{z} {statistics.median(vals)} {min(vals)} {max(vals)}\n")


write("latency", pingpong)
write("bandwidth", {k: [k[1] / v for v in vals] for k, vals in pingpong.items()})
write("stream", {k: [k[1] * v / 1e6 for v in vals] for k, vals in stream.items()})
with open(f"{out}/plots.gp", "w") as f:
    f.write('set terminal pngcairo noenhanced size 900,600 font ",11"\n'
            "set logscale xy\nset grid\nset key top left\n"
            'set xlabel "message size, bytes"\n'
            'set xtics ("1" 1, "8" 8, "64" 64, "512" 512, "4K" 4096, "32K" 32768, '
            '"256K" 262144, "2M" 2097152, "16M" 16777216, "64M" 67108864)\n')
    for name, ylabel, title in (
            ("latency", "half round trip, µs", "ping-pong latency"),
            ("bandwidth", "MB/s (size / half round trip)", "ping-pong bandwidth"),
            ("stream", "MB/s", "streaming bandwidth, 64 sends outstanding")):
        plots = ", ".join(f'"plot/{name}.{s}.dat" using 1:2:3:4 with yerrorlines title "{s}"'
                          for s in systems if os.path.getsize(f"{out}/plot/{name}.{s}.dat"))
        if not plots:
            continue
        f.write(f'set output "{name}.png"\nset ylabel "{ylabel}"\n'
                f'set title "{title} (median of {nruns} rounds, bars: min–max)"\n'
                f"plot {plots}\n")
