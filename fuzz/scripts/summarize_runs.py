#!/usr/bin/env python3
"""One results-table row per run folder made by run_decoder_target.sh (from fuzz/):
    python3 scripts/summarize_runs.py runs/*"""
import re
import sys

for run in sys.argv[1:]:
    info = dict(kv.split("=", 1) for kv in open(f"{run}/info").read().split() if "=" in kv)
    log = open(f"{run}/fuzz-0.log", errors="replace").read()
    stat = dict(re.findall(r"stat::(\w+):\s+(\d+)", log))
    last = [l for l in log.splitlines() if l.startswith("#") and " cov: " in l]
    m = re.search(r"cov: (\d+) ft: (\d+) corp: (\d+)/(\S+)", last[-1]) if last else None
    done = re.search(r"Done (\d+) runs in (\d+) second", log)
    crash = re.search(r"==\d+== ERROR: (.*)|SUMMARY: (.*)|panicked at (.*)", log)
    print(f"| `{info['target']}` | {info['commit']} | {info['start']} | "
          f"{done.group(2) + ' s' if done else '?'} | {stat.get('number_of_executed_units', '?')} | "
          f"{stat.get('average_exec_per_sec', '?')} | "
          f"{m.group(1) + ' / ' + m.group(2) if m else '?'} | "
          f"{m.group(3) + ' files, ' + m.group(4) if m else '?'} | "
          f"{stat.get('peak_rss_mb', '?')} MB | "
          f"{'crash: ' + next(g for g in crash.groups() if g) if crash else 'no crash'} |")
