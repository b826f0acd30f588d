"""Run the fuzzer on demand and print counts per outcome.

    python -m tests.fuzz                      # 5,000 scenario cases, seed 0, 2 workers
    python -m tests.fuzz --kind trace --kind bench --cases 500   # 500 cases of each kind
    python -m tests.fuzz --kind all --cases 5000 --jobs 4 --json fuzz.json

Kinds: scenario (scenario files and `simfed run` options), results (plot/figures inputs), trace
(Chrome and realrun traces), bench (bench summaries), published (validate --published folders),
converge (realrun converge options), outputs (the output path of every command that writes a
file), and any appended to tests/fuzz/families.py's EXTRA_FAMILIES.

Exit status 1 when any case ends badly (a crash, a hang over 10 s, a silently accepted invalid
input, invalid JSON, a stray file: runner.BAD); each bad case is listed with its mutation.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from .cases import generate, kinds
from .runner import BAD, TIME_LIMIT_S, run_cases, summarise


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.fuzz", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", type=int, default=5000, help="cases of each kind")
    ap.add_argument("--kind", action="append", default=None,
                    help="an input kind (repeat; 'all': every kind; default: scenario)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--json", help="write every case's result here")
    ap.add_argument("--show", type=int, default=30, help="bad cases to list")
    ap.add_argument("--time-limit", type=float, default=TIME_LIMIT_S,
                    help="seconds a case may take before it counts as a hang")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    chosen = args.kind or ["scenario"]
    if "all" in chosen:
        chosen = kinds()
    cases = []
    for kind in chosen:
        batch = generate(args.cases, args.seed, kind)
        for c in batch:  # one numbering over the kinds
            c.id = len(cases) + 1
            cases.append(c)
    seen = [0]

    def progress(r) -> None:
        seen[0] += 1
        if seen[0] % 250 == 0:
            print(f"  {seen[0]:,}/{len(cases):,} cases, {time.perf_counter() - t0:.0f} s",
                  file=sys.stderr, flush=True)

    results = run_cases(cases, jobs=args.jobs, progress=progress, time_limit_s=args.time_limit)
    s = summarise(results)
    wall = time.perf_counter() - t0
    print(f"simfed fuzz: {s['cases']:,} cases ({', '.join(chosen)}; seed {args.seed}) in "
          f"{wall:.0f} s; "
          f"time limit {args.time_limit:g} s per case; slowest {s['slowest_s']} s ({s['slowest']})")
    print(f"expected: {s['expect']}")
    print("outcomes:")
    for k, v in s["outcomes"].items():
        print(f"  {k:18} {v:6,}{'   <- BAD' if k in BAD else ''}")
    print("by family:")
    for kind, counts in s["by_kind"].items():
        print(f"  {kind:9} " + ", ".join(f"{k} {v}" for k, v in counts.items()))
    bad = [r for r in results if r.outcome in BAD]
    for r in bad[:args.show]:
        print(f"BAD {r.outcome}: case {r.id} [{r.kind}] {r.what}: {r.detail}")
    print(f"bad outcomes: {len(bad)}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"summary": s, "results": [r.__dict__ for r in results]}, f, indent=1)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
