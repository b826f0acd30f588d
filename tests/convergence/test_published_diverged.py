"""The published convergence check leaves out runs that diverged (the model has no
instability): the rule, and what it takes out of the Step Law grid."""

from __future__ import annotations

from simfed.convergence import published_check as pc
from simfed.convergence.published import load_published_convergence
from simfed.convergence.runs import Run, Shape


def _run(key: str, final: float, tokens: float = 1e9, params: float = 1e8) -> Run:
    shape = Shape(params=params, batch_tokens=1e5, steps=int(tokens / 1e5), lr=1e-3,
                  warmup_steps=0, schedule="cosine", loss_init=10.8)
    return Run(key=key, shape=shape, eval_steps=(0, shape.steps), eval_loss=(10.8, final),
               source="t", tags={"split": "fit", "batch_published": True,
                                 "cell": (params, tokens)})


def test_a_run_over_a_nat_above_its_cells_best_is_diverged_others_are_not():
    runs = [_run("a", 2.60), _run("b", 2.95), _run("c", 6.7),
            _run("d", 6.7, tokens=2e9)]  # alone in its cell: nothing to compare with
    assert pc.diverged(runs) == {"c"}


def test_the_step_law_grid_loses_its_diverged_runs_and_only_those():
    src = next(s for s in load_published_convergence(pc.FOLDER) if s.pool == "li2025-steplaw")
    runs = [r for r in (pc.to_run(x, src)[0] for x in src.runs) if r is not None]
    gone = pc.diverged(runs)
    assert gone and len(gone) < len(runs) // 10
    finals = {r.key: r.final_loss for r in runs}
    assert min(finals[k] for k in gone) > 6.0  # they ended near the unigram loss or above
    assert max(v for k, v in finals.items() if k not in gone) < 4.0
