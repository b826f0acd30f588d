"""Fit `cluster.fabric.loaded_step_us` (or, with `--island`, `loaded_step_island_us`) for one
machine from its scale studies (the fit set).

`python -m simfed.calibration.loaded_step STUDIES [--island] [--folder DIR] [--grid 0,25,...]
[--set fit|check]` predicts every case of DIR/cases.yaml (default: validation/published; a
folder of your own scale runs in the same format works alike) whose study name starts with
STUDIES (`leonardo` and `mn5` stand for the shipped `modalities-leonardo-` and
`modalities-mn5-`) and lies in the given set (default: fit) at each grid value (default: the
machine's below, else 0-100 us by 6.25; `--island`: 0-25 by 3.125, the other term as the
scenarios ship it), and prints per value the scale-curve error: for every GPU
count of a study but its smallest, (predicted / predicted at the smallest count) / (published /
published at the smallest count) - 1. The chosen value has the smallest mean |scale-curve
error| (ties: the smaller median, then the smaller value). The curve, not the absolute error, is
the criterion: the term is a scale loss, and the level of each study is the compute model's.

`--joint` fits the loaded step and the island term of a machine with islands together, the
same rule over every pair of the two grids.

The term is fitted for the scenarios' own `cluster.fabric.loaded_step_scope` (by default paid
once a collective leaves its leaf switch). The shipped values (docs/accuracy.md, "Fourth check",
Method 24) came from this rule on the fit set: Leonardo on the 6.25 us grid 0-100; MareNostrum 5's
two terms jointly, each on the 3.125 us grid 0-25 (`mn5 --joint`).

`--extrapolate SHARE` asks whether a cluster's small runs pin the term: each study alone, fitted
by the same rule on its GPU counts up to SHARE of its largest, its loss to the largest count
predicted with that value and with the shipped one (docs/accuracy.md, "How sure").
"""

from __future__ import annotations

import argparse
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..spec import SpecError
from .published import DEFAULT_DIR, load_cases, predict_case

KEY = "cluster.fabric.loaded_step_us"
ISLAND_KEY = "cluster.fabric.loaded_step_island_us"
DEFAULT_GRID = tuple(6.25 * i for i in range(17))  # 0-100 us
FINE_GRID = tuple(3.125 * i for i in range(9))  # 0-25 us
ISLAND_GRID = FINE_GRID
GRIDS = {"leonardo": DEFAULT_GRID, "mn5": FINE_GRID}
ALIASES = {"leonardo": "modalities-leonardo-", "mn5": "modalities-mn5-"}


@dataclass(frozen=True)
class Point:
    value_us: float
    mean_abs: float
    median_abs: float
    worst_abs: float
    points: int


def study_cases(machine: str, which: str = "fit", folder: Path = DEFAULT_DIR
                ) -> dict[str, list[dict[str, Any]]]:
    """The scale studies whose name starts with `machine` (or its alias) in one set, their cases
    sorted by GPU count; a study needs two GPU counts."""
    prefix = ALIASES.get(machine, machine)
    by: dict[str, list[dict[str, Any]]] = {}
    for c in load_cases(folder):
        if c["set"] == which and c.get("study") and c["study"].startswith(prefix):
            by.setdefault(c["study"], []).append(c)
    by = {s: cs for s, cs in by.items() if len({c["gpus"] for c in cs}) > 1}
    if not by:
        raise ValueError(f"no {which} scale study (two GPU counts or more) named {prefix}* in "
                         f"{folder / 'cases.yaml'}")
    return {s: sorted(cs, key=lambda c: c["gpus"]) for s, cs in by.items()}


def curve_errors(studies: dict[str, list[dict[str, Any]]], value_us: float,
                 folder: Path = DEFAULT_DIR, key: str = KEY,
                 also: dict[str, Any] | None = None) -> list[float]:
    """Every non-base point's scale-curve error at one value of the term `key` (and the
    overrides `also`)."""
    out = []
    for cases in studies.values():
        rows = [predict_case(folder, c, {key: value_us, **(also or {})}) for c in cases]
        base = rows[0]
        out += [(r["predicted"] / base["predicted"]) / (r["published"] / base["published"]) - 1
                for r in rows[1:]]
    return out


def scan(machine: str, grid: tuple[float, ...] | None = None, which: str = "fit",
         folder: Path = DEFAULT_DIR, key: str = KEY) -> tuple[list[Point], Point]:
    """Each grid value's scale-curve error over the machine's studies, and the chosen one."""
    default = ISLAND_GRID if key == ISLAND_KEY else GRIDS.get(machine, DEFAULT_GRID)
    return _fit(study_cases(machine, which, folder), grid or default, folder, key)


def _fit(studies: dict[str, list[dict[str, Any]]], grid: tuple[float, ...], folder: Path,
         key: str = KEY) -> tuple[list[Point], Point]:
    """The rule: each grid value's scale-curve error over `studies`; the smallest mean |error|
    chosen (ties: the smaller median, then the smaller value)."""
    pts = []
    for v in grid:
        a = [abs(e) for e in curve_errors(studies, v, folder, key)]
        pts.append(Point(v, statistics.mean(a), statistics.median(a), max(a), len(a)))
    best = min(pts, key=lambda p: (round(p.mean_abs, 3), round(p.median_abs, 3), p.value_us))
    return pts, best


@dataclass(frozen=True)
class JointPoint:
    value_us: float
    island_us: float
    mean_abs: float
    median_abs: float
    worst_abs: float
    points: int


def scan_joint(machine: str, grid: tuple[float, ...] | None = None,
               island_grid: tuple[float, ...] | None = None, which: str = "fit",
               folder: Path = DEFAULT_DIR) -> tuple[list[JointPoint], JointPoint]:
    """Both terms of a machine with islands at once, the same rule over every pair of the two
    grids (loaded step x island term): fitted one after the other, each stops where the other
    was left."""
    studies = study_cases(machine, which, folder)
    pts = []
    for v in grid or GRIDS.get(machine, DEFAULT_GRID):
        for w in island_grid or ISLAND_GRID:
            a = [abs(e) for e in curve_errors(studies, v, folder, KEY, {ISLAND_KEY: w})]
            pts.append(JointPoint(v, w, statistics.mean(a), statistics.median(a), max(a), len(a)))
    best = min(pts, key=lambda p: (round(p.mean_abs, 3), round(p.median_abs, 3), p.value_us,
                                   p.island_us))
    return pts, best


def _loss(folder: Path, smallest: dict[str, Any], largest: dict[str, Any],
          overrides: dict[str, Any]) -> float:
    """Predicted throughput per GPU lost from the smallest to the largest count."""
    lo, hi = (predict_case(folder, c, overrides)["predicted"] for c in (smallest, largest))
    return 1.0 - hi / lo


@dataclass(frozen=True)
class Extrapolation:
    study: str
    fitted_on: tuple[int, ...]
    largest: int
    value_us: float
    published_loss: float
    calibrated_loss: float
    shipped_loss: float


def extrapolate(machine: str, grid: tuple[float, ...] | None = None, which: str = "fit",
                folder: Path = DEFAULT_DIR, share: float = 0.25) -> list[Extrapolation]:
    """Each study alone, as a user with small runs would calibrate: the term fitted (the rule
    above) on its GPU counts up to `share` of its largest (two counts at least, else the study is
    skipped), then its throughput lost from its smallest to its largest count predicted with that
    value and with the value its scenarios ship."""
    out = []
    for name, cases in study_cases(machine, which, folder).items():
        largest = cases[-1]["gpus"]
        small = [c for c in cases if c["gpus"] <= share * largest]
        if len({c["gpus"] for c in small}) < 2:
            continue
        value = _fit({name: small}, grid or GRIDS.get(machine, DEFAULT_GRID), folder)[1].value_us
        pub = 1.0 - cases[-1]["published_tokens_per_s_per_gpu"] / cases[0][
            "published_tokens_per_s_per_gpu"]
        out.append(Extrapolation(name, tuple(sorted({c["gpus"] for c in small})), largest, value,
                                 pub, _loss(folder, cases[0], cases[-1], {KEY: value}),
                                 _loss(folder, cases[0], cases[-1], {})))
    return out


def _grid(text: str | None, flag: str) -> tuple[float, ...] | None:
    if not text:
        return None
    try:
        grid = tuple(float(x) for x in text.split(","))
    except ValueError:
        raise ValueError(f"{flag}: comma-separated numbers in us, got {text}") from None
    if any(v < 0 for v in grid):
        raise ValueError(f"{flag}: values must be >= 0 us, got {text}")
    return grid


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m simfed.calibration.loaded_step",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("studies", help="a study-name prefix, or leonardo / mn5 (the shipped ones)")
    ap.add_argument("--folder", type=Path, default=DEFAULT_DIR,
                    help="a folder with cases.yaml (default: validation/published)")
    ap.add_argument("--grid", help="comma-separated values in us (default: the machine's)")
    ap.add_argument("--set", dest="which", choices=("fit", "check"), default="fit")
    ap.add_argument("--extrapolate", type=float, metavar="SHARE",
                    help="instead: fit each study alone on its GPU counts up to SHARE of its "
                    "largest (e.g. 0.25) and report its loss to the largest, calibrated so and "
                    "as shipped")
    ap.add_argument("--island", action="store_true",
                    help="fit cluster.fabric.loaded_step_island_us (the latency a collective over "
                    "more than one island adds per step) instead")
    ap.add_argument("--joint", action="store_true",
                    help="fit the loaded step and the island term together (every pair of --grid "
                    "and --island-grid)")
    ap.add_argument("--island-grid", help="comma-separated island-term values in us for --joint "
                    "(default: 0-25 by 3.125)")
    a = ap.parse_args(argv)
    try:
        grid = _grid(a.grid, "--grid")
        island_grid = _grid(a.island_grid, "--island-grid")
        if a.joint:
            jpts, jbest = scan_joint(a.studies, grid, island_grid, a.which, a.folder)
        elif a.extrapolate is not None:
            if not 0 < a.extrapolate < 1:
                raise ValueError(f"--extrapolate: a share between 0 and 1, got {a.extrapolate}")
            rows = extrapolate(a.studies, grid, a.which, a.folder, a.extrapolate)
            if not rows:
                raise ValueError(f"--extrapolate {a.extrapolate}: no study has two GPU counts "
                                 "up to that share of its largest")
        else:
            pts, best = scan(a.studies, grid, a.which, a.folder,
                             ISLAND_KEY if a.island else KEY)
    except (ValueError, SpecError) as e:
        ap.error(str(e).splitlines()[0])
    if a.joint:
        for q in jpts:
            print(f"{q.value_us:7.3f} us, island {q.island_us:7.3f} us: mean |scale-curve error| "
                  f"{100 * q.mean_abs:5.1f}%, median {100 * q.median_abs:5.1f}%, worst "
                  f"{100 * q.worst_abs:5.1f}% over {q.points} points")
        print(f"chosen: {jbest.value_us:g} us, island {jbest.island_us:g} us")
        return
    if a.extrapolate is not None:
        for r in rows:
            print(f"{r.study}: fitted on {', '.join(map(str, r.fitted_on))} GPUs: "
                  f"{r.value_us:g} us; loss to {r.largest:,} GPUs published "
                  f"{100 * r.published_loss:.1f}%, "
                  f"calibrated {100 * r.calibrated_loss:.1f}%, as shipped "
                  f"{100 * r.shipped_loss:.1f}%")
        cal = [abs(r.calibrated_loss - r.published_loss) for r in rows]
        shp = [abs(r.shipped_loss - r.published_loss) for r in rows]
        print(f"median |difference|: calibrated {100 * statistics.median(cal):.1f} pp, as shipped "
              f"{100 * statistics.median(shp):.1f} pp over {len(rows)} studies; within 2 pp: "
              f"{sum(x <= 0.02 for x in cal)} and {sum(x <= 0.02 for x in shp)}")
        return
    for p in pts:
        print(f"{p.value_us:7.1f} us: mean |scale-curve error| {100 * p.mean_abs:5.1f}%, "
              f"median {100 * p.median_abs:5.1f}%, worst {100 * p.worst_abs:5.1f}% "
              f"over {p.points} points")
    print(f"chosen: {best.value_us:g} us")


if __name__ == "__main__":
    main()
