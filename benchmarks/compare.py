"""Wall time of `simulate()` on one `simfed bench` case, this tree against an older commit, on
the same machine in one run: the two trees alternate, each run in a fresh process (imports not
timed), and the ratio of the medians is printed (the host is shared and noisy: compare ratios,
and read the spread).

    .venv/bin/python benchmarks/compare.py --base 39a6b6c              # 16,384 GPUs x 4
    .venv/bin/python benchmarks/compare.py --base 39a6b6c --nodes 128 --repeat 7

The older commit is checked out into a temporary git worktree (removed at the end); both trees
run under this interpreter, and must give the same result (checked: the JSON of every run is
compared byte for byte).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

RUN = r"""
import json, sys, time
sys.path.insert(0, sys.argv[1])
from simfed.engine import simulate
from simfed.spec import load_scenario
scn = load_scenario(sys.argv[2], json.loads(sys.argv[3]))
t0 = time.perf_counter()
out, _ = simulate(scn)
wall = time.perf_counter() - t0
print(json.dumps({"wall_s": wall, "out": json.dumps(out, sort_keys=True)}))
"""


def run_once(tree: Path, scenario: str, overrides: dict) -> tuple[float, str]:
    res = subprocess.run([sys.executable, "-c", RUN, str(tree), scenario, json.dumps(overrides)],
                         capture_output=True, text=True, check=False, cwd=tree)
    if res.returncode:
        raise SystemExit(f"{tree}: {res.stderr.strip().splitlines()[-1]}")
    got = json.loads(res.stdout.strip().splitlines()[-1])
    return got["wall_s"], got["out"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", required=True, help="the older commit (e.g. 39a6b6c)")
    ap.add_argument("--scenario", default="scenarios/512gpu.yaml")
    ap.add_argument("--nodes", type=int, default=4096, help="cluster.nodes (4,096 x 4 GPUs)")
    ap.add_argument("--repeat", type=int, default=5, help="runs of each tree, alternating")
    args = ap.parse_args()
    overrides = {"cluster.nodes": args.nodes}
    with tempfile.TemporaryDirectory(prefix="simfed-base-") as tmp:
        base = Path(tmp) / "base"
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "-q", str(base),
                        args.base], check=True)
        try:
            times: dict[str, list[float]] = {"base": [], "this": []}
            outs: dict[str, set[str]] = {"base": set(), "this": set()}
            for i in range(args.repeat):
                for name, tree in (("base", base), ("this", ROOT))[:: 1 if i % 2 == 0 else -1]:
                    wall, out = run_once(tree, args.scenario, overrides)
                    times[name].append(wall)
                    outs[name].add(out)
                    print(f"  run {i + 1} {name:4s} {wall:6.2f} s", flush=True)
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(base)],
                           check=False)
    med = {k: statistics.median(v) for k, v in times.items()}
    gpus = json.loads(next(iter(outs["this"])))["cluster"]["world"]
    print(f"{args.scenario}, cluster.nodes={args.nodes} ({gpus:,} GPUs), all algorithms, "
          f"{args.repeat} runs each, alternating:")
    for k in ("base", "this"):
        label = args.base if k == "base" else "this tree"
        print(f"  {label:10s} median {med[k]:.2f} s (min {min(times[k]):.2f}, "
              f"max {max(times[k]):.2f})")
    print(f"  speed-up {med['base'] / med['this']:.2f}x (median over median)")
    same = outs["base"] == outs["this"] and len(outs["this"]) == 1
    print(f"  results identical: {'yes' if same else 'NO'}")
    if not same:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
