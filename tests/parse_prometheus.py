#!/usr/bin/env python3
"""Parses a Prometheus text exposition file with prometheus_client's own
parser (what node_exporter's textfile collector accepts) and prints one line
per family (name, type) and per sample: name, labels as k=v joined by commas
in name order ("-" for none), value. Exits 1 when the file does not parse or
a family lacks HELP or TYPE."""
import sys

from prometheus_client.parser import text_string_to_metric_families

text = open(sys.argv[1]).read()
try:
    families = list(text_string_to_metric_families(text))
except Exception as e:  # the parser raises ValueError and others
    print(f"parse error: {e}", file=sys.stderr)
    sys.exit(1)
if not families:
    print("no metric families", file=sys.stderr)
    sys.exit(1)
for family in families:
    if not family.documentation or family.type not in ("counter", "gauge"):
        print(f"{family.name}: no HELP or TYPE", file=sys.stderr)
        sys.exit(1)
    print(f"family {family.name} {family.type}")
    for s in family.samples:
        labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()))
        print(f"sample {s.name} {labels or '-'} {s.value:.3f}")
