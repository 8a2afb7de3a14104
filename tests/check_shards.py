#!/usr/bin/env python3
"""Checks psmd's engine shards from `psmctl stats --format json` (root's view).

Usage: check_shards.py STATS_JSON WORKERS

Passes when psmd ran WORKERS progress workers, every one of them took
submissions from its endpoints' rings, messages crossed between them, and
as many were taken as were handed over (none lost in a lane). The tests that
run psmd with --workers call it after their ranks ended (docs/testing.md).
"""
import json
import sys


def main():
    stats = json.load(open(sys.argv[1]))
    want = int(sys.argv[2])
    workers = stats["workers"]
    problems = []
    if len(workers) != want:
        problems.append(f"{len(workers)} workers, not {want}")
    for w in workers:
        print(f"check_shards: worker {w['shard']}: {w['endpoints']} endpoints "
              f"open, {w['submissions']} submissions, {w['cross_in']} messages "
              f"in, {w['cross_out']} out", file=sys.stderr)
        if w["submissions"] == 0:
            problems.append(f"worker {w['shard']} took no submission")
    handed = sum(w["cross_out"] for w in workers)
    taken = sum(w["cross_in"] for w in workers)
    if handed == 0:
        problems.append("no message crossed between workers")
    if taken != handed:
        problems.append(f"{handed} messages handed over, {taken} taken")
    if problems:
        print("check_shards: " + "; ".join(problems), file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
