"""The fit/check split of the size study (`realrun converge-study`, experiments kjv-h48 ...
kjv-h256), fixed before any of its runs was looked at:

- across size: every run of the largest model (hidden 256, 1.48M non-embedding parameters) is
  predicted by a profile fitted on the three smaller sizes only;
- past the horizon: every 512-step run (at every size) is predicted by a profile fitted on the
  128-step runs only (4x the fitted horizon, the schedule stretched: 10% warm-up, cosine to 0);
- targets: a check run is scored at each loss it reaches among TARGET_FRACTIONS of the drop from
  the untrained loss to the best final loss of the fit runs; the error is predicted / measured
  steps to that loss - 1 (measured steps interpolated between evaluation points).

The profile that scenarios use is fitted on every run once both checks are reported.

The second check (experiments kjv-h384, kjv-h64-long, kjv-h128-long), fixed before any of its
runs was made, scores the model and fit as they stand at the commit that first reads those runs
(recorded with the result), once:

- fresh size: every run of hidden 384 (3.3M non-embedding parameters, 2.2x the largest fitted)
  predicted by a profile fitted on every run of hidden 48 ... 256 (128- and 512-step runs);
  targets: TARGET_FRACTIONS of the drop from the mean post-plateau start to the best final
  loss of the fit set's 128-step runs (the check runs' length);
- fresh horizon: every 2048-step run (hidden 64 and 128) predicted by a profile fitted on every run
  of at most 512 steps at hidden 48 ... 256 (4x the longest fitted); targets per check run:
  LONG_FRACTIONS of the drop from its post-plateau start to the best final loss of the fit runs
  of its size (1.1: beyond anything the fit set reached).

The third check (experiments kjv-h512, kjv-h64-longer), fixed the same way before any of its
runs was made, scores the model and fit as they stand at the commit that first reads those
runs, once:

- third size: every run of hidden 512 (5.9M non-embedding parameters, 1.8x the largest
  fitted) predicted by a profile fitted on every run of the seven files of the first two checks
  (hidden 48 ... 384, 128 to 2048 steps); targets as the fresh size's, to the best final loss of
  the fit set's 128-step runs;
- third horizon: the 4096-step runs (hidden 64) predicted by a profile fitted on the same runs
  (2x the longest fitted); targets as the fresh horizon's, to the best final loss of the fit
  runs of its size.

The scaling model was changed after the second and third checks were scored (the learning
rate's response above its optimum got a fitted tail, `lr_tail`), so their runs count as seen
(SEEN_CHECKS). The fourth check (experiments kjv-h640, kjv-h64-longest), fixed the same way
before any of its runs was made, scores the model and fit as they stand at the commit that
first reads those runs, once:

- fourth size: every run of hidden 640 (9.2M non-embedding parameters, 1.6x the largest fitted)
  predicted by a profile fitted on every run of hidden 48 ... 512 of at most 2048 steps;
  targets as the fresh size's;
- fourth horizon: the 8192-step runs (hidden 64) predicted by the same profile (4x the longest
  fitted: the 4096-step runs are left out of its fit); targets as the fresh horizon's.

The fourth check was scored before the learning rate's tail got its size dependence, so its
runs count as seen too. The fifth check (experiments kjv-h512-lr, kjv-h640-lr, kjv-h768), fixed
the same way before any of its runs was made and scored once with the model as it stands at the
commit that first reads them:

- fit additions: the learning-rate sweep's missing ends at the two largest fitted sizes (FSDP
  on 128 sequences at lr 3e-4 and 1e-2, FL+FSDP 32 x 4 with K = 8 at lr 1e-3, hidden 512 and
  640), so that the optimal learning rate and the tail above it are measured where the size
  checks missed; these runs enter the fifth check's fit only (FIFTH_FIT_ONLY), the earlier
  checks keep their sets;
- fifth size: every run of hidden 768 (13.3M non-embedding parameters, 1.4x the largest
  fitted; an lr sweep of FSDP at 3e-4, 1e-3, 3e-3, FL+FSDP 32 x 4 with K = 8 at 1e-3 and 3e-3,
  one group of 4 and FL+FSDP 4 x 4 with K = 4 at 3e-3), evaluated every 4 steps, predicted by a
  profile fitted on every run of hidden 48 ... 640 (all run lengths); targets as the fresh
  size's.

The fifth check was scored and read before the model was next changed, so its runs count as seen
too. The sixth check (experiment kjv-h1024), fixed the same way before any of its runs was made
and scored once with the model as it stands at the commit that first reads them:

- sixth size: every run of hidden 1024 (23.6M non-embedding parameters, 1.8x the largest
  fitted; one group of 4 and FL+FSDP 4 x 4 with K = 4 at lr 3e-3, FSDP on 128 sequences at 1e-3
  and 3e-4, FL+FSDP 32 x 4 with K = 8 at 1e-3), evaluated every 4 steps, predicted by a profile
  fitted on every run of hidden 48 ... 768 (all run lengths, the fifth check's fit additions
  included); targets as the fresh size's. Scored as every earlier check (steps counted from
  where the loss leaves the plateau; the size target is judged on this score) and, as a second
  report fixed before its runs were read, from step 0 (the check runs whole, the same fit and
  targets), as a scenario's prediction counts steps.

The sixth check was scored and read before the model was next changed, so its runs count as
seen too, and the development data made after it (experiment kjv-h1024-lr: FSDP at lr 1e-4
and 3e-3, small batches at lower learning rates, hidden 1024) joins the fit of the seventh check
alone (AFTER_SIXTH). The seventh check (experiment kjv-h1280), fixed the same way before any of
its runs was made and scored once with the model as it stands at the commit that first reads
them:

- seventh size: every run of hidden 1280 (36.9M non-embedding parameters, 1.6x the largest
  fitted; FSDP on 128 sequences at lr 3e-4 and 1e-3, one group of 4, FL+FSDP 4 x 4 with K = 4
  and FL+FSDP 32 x 4 with K = 8 at 3e-4, near the optimum hidden 1024 measured), evaluated every
  4 steps, predicted by a profile fitted on every run of hidden 48 ... 1024 (all run lengths,
  kjv-h1024-lr included); targets as the fresh size's. Scored from where the loss leaves the
  plateau (the size target is judged on this score) and from step 0, as the sixth.

The seventh check also scores, fixed before its runs were read, the model with the learning
rate's lasting damage fitted (scaling.py `lr_damage`; development on seen data in
results/convergence/checks/development-before-seventh-check.json did not meet the rule written
for it, so the shipped model holds it at 0). If that second report's median |error| counted with
unreached targets is 3 points or more below the first's both from the plateau's exit and from
step 0, the shipped profile fits lr_damage from then on (a later check scores it); otherwise it
stays at 0.

The seventh check was scored and read (the variant was not adopted), so its runs count as seen.
The eighth check (experiments kjv-h1536 and kjv-h1536-b), fixed the same way before any of its
runs was made and scored once with the model as it stands at the commit that first reads them
(the runs are written outside the repository and enter git after that commit):

- eighth size: every run of hidden 1536 (53.1M non-embedding parameters, 1.4x the largest
  fitted; FSDP on 128 sequences at lr 3e-4 and 1e-3, one group of 4, FL+FSDP 4 x 4 with K = 4
  and 8 x 4 with K = 8 at 3e-4), evaluated every 4 steps, predicted by a profile fitted on every
  run of hidden 48 ... 1280 (all run lengths, every file of the study); targets as the fresh
  size's.
- Judged from step 0: the size target (median |error| <= 15%, about 80% inside [p10, p90]) is
  judged on the check runs whole, steps counted from their first step as `simfed run` counts
  them (a user's time to target includes the plateau), with the median that counts each
  unreached target at its least error. The score from the plateau's exit, on which the first
  seven checks were judged, is reported beside it. Why the change, fixed before these runs:
  the plateau-exit score measures stage 2 alone, and at h1280 its misses came from where the
  plateau ends (early, then steep), which a prediction from step 0 carries in the plateau's
  length; the product's answer is steps from 0. "Inside" is also reported counting a band open
  above as outside, and a check whose from-step-0 score meets the target while that count falls
  below 80% is reported as not met.

The eighth check was scored and read, so its runs count as seen. The ninth check (experiments
kjv-h1792, kjv-h1792-b and kjv-h1792-c), fixed the same way before any of its runs was made and
scored once with the model as it stands at the commit that first reads them (the runs are
written outside the repository and enter git after that commit):

- ninth size: every run of hidden 1792 (72.3M non-embedding parameters, 1.4x the largest
  fitted; FSDP on 128 sequences, one group of 4, FL+FSDP 4 x 4 with K = 4 and 8 x 4 with K = 8,
  all at the paper's lr 3e-4), evaluated every 4 steps, predicted by a profile fitted on every
  run of hidden 48 ... 1536 (all run lengths, every file of the study); targets as the fresh
  size's.
- Judged as the eighth: from step 0, the median counting unreached targets at their least error
  <= 15%, and at least 80% inside [p10, p90] with bands open above counted outside. The score
  from the plateau's exit is reported beside it.
- The band: the eighth check's bands were open above where a constant loss shift (the fit's
  residual spread, 0.11 nats) lifts a flat late curve above its target. The model committed
  before these runs are read may draw its band's spread as a shift of each run's progress (its
  speed; the spread of the fit runs' own progress factors) in place of that loss shift; if it
  does, the ninth check is judged on that band and the loss-shift band is reported beside it.
  Either way the band is fixed before the runs are read.

The ninth check was scored and read, so its runs count as seen. The tenth check (experiments
kjv-h1920 and kjv-h1920-b), fixed the same way before any of its runs was made and scored once
with the model as it stands at the commit that first reads them (the runs are written outside
the repository and enter git after that commit):

- tenth size: every run of hidden 1920 (82.9M non-embedding parameters, 1.15x the largest
  fitted; FSDP on 128 sequences, one group of 4, FL+FSDP 4 x 4 with K = 4 and with K = 8, all
  at the paper's lr 3e-4), evaluated every 4 steps, predicted by a profile fitted on every run
  of hidden 48 ... 1792 (all run lengths, every file of the study).
- Targets: TENTH_FRACTIONS (0.25, 0.5, 0.625) of the fresh size's drop (from the mean
  post-plateau start to the best final loss of the fit set's 128-step runs). Why, fixed before
  these runs: the eighth and ninth checks' last targets (0.9 of the drop) were reached at steps
  64-119 of 128, where the cosine has nearly stopped; a run a fifth slower than predicted never
  gets there, so their bands are open above under any spread the fit runs support, and the
  closed-band rule cannot judge them. On the seen h1792 runs these fractions were reached by
  step 84 (the one group's 0.625 not at all). The fresh size's TARGET_FRACTIONS are scored
  as a second report, judged the same way.
- Judged as the ninth: from step 0, the median counting unreached targets at their least error
  <= 15%, and at least 80% inside [p10, p90] with bands open above counted outside. The score
  from the plateau's exit is reported beside it.
- The band: the model committed before these runs are read may draw its progress factor with
  the spread the held-out checks measured (each run of the seventh, eighth and ninth checks,
  from step 0, given the factor that fits it best under its own check's profile) in place of
  the fit runs' spread (a confidence from the check set, not the fit set), if on the seen
  seventh to ninth checks (their own targets), each banded with the spread of the other two, it
  leaves at least as many points inside with bands open above counted outside as the fit runs'
  spread does, and at least 75% inside counting a band open above as reaching. If it does, the
  tenth check is judged on that band and the fit runs' progress band is reported beside it.
  Either way the band is fixed before the runs are read."""

from __future__ import annotations

from typing import Any

SIZE_CHECK_HIDDEN = 256
HORIZON_FIT_STEPS = 128
HORIZON_CHECK_STEPS = 512
TARGET_FRACTIONS = (0.5, 0.75, 0.9)


FRESH_SIZE_HIDDEN = 384
FRESH_FIT_HIDDEN = (48, 64, 128, 256)
LONG_CHECK_STEPS = 2048
LONG_FIT_MAX_STEPS = 512
LONG_FRACTIONS = (0.5, 0.75, 0.9, 1.0, 1.1)
THIRD_SIZE_HIDDEN = 512
LONGER_CHECK_STEPS = 4096
FOURTH_FIT_HIDDEN = (48, 64, 128, 256, 384, 512)
FOURTH_FIT_MAX_STEPS = 2048
FOURTH_SIZE_HIDDEN = 640
LONGEST_CHECK_STEPS = 8192
FIFTH_FIT_HIDDEN = (48, 64, 128, 256, 384, 512, 640)
FIFTH_FIT_MAX_STEPS = 8192
FIFTH_SIZE_HIDDEN = 768
FIFTH_FIT_ONLY = ("kjv-h512-lr", "kjv-h640-lr")  # fitted by the fifth and sixth checks alone
SIXTH_FIT_HIDDEN = (*FIFTH_FIT_HIDDEN, FIFTH_SIZE_HIDDEN)
SIXTH_SIZE_HIDDEN = 1024
# development data made after the sixth check was scored: read by no check up to the sixth
# (the seventh fits it)
AFTER_SIXTH = ("kjv-h1024-lr",)
SEVENTH_FIT_HIDDEN = (*SIXTH_FIT_HIDDEN, SIXTH_SIZE_HIDDEN)
SEVENTH_SIZE_HIDDEN = 1280
EIGHTH_FIT_HIDDEN = (*SEVENTH_FIT_HIDDEN, SEVENTH_SIZE_HIDDEN)
EIGHTH_SIZE_HIDDEN = 1536
NINTH_FIT_HIDDEN = (*EIGHTH_FIT_HIDDEN, EIGHTH_SIZE_HIDDEN)
NINTH_SIZE_HIDDEN = 1792
TENTH_FIT_HIDDEN = (*NINTH_FIT_HIDDEN, NINTH_SIZE_HIDDEN)
TENTH_SIZE_HIDDEN = 1920
TENTH_FRACTIONS = (0.25, 0.5, 0.625)
# the held-out checks whose runs' progress factors give the tenth check's band (and, where
# HELD_OUT_BAND, the shipped profile's), and whether the rule on seen data adopted it
BAND_FROM_CHECKS = ("seventh size, from step 0", "eighth size, from step 0",
                    "ninth size, from step 0")
HELD_OUT_BAND = True  # development-before-tenth-check.json: 75% against 71%, 88% inside
# the shipped profile's band: every held-out check scored from step 0 since the progress band
PROFILE_BAND_FROM = (*BAND_FROM_CHECKS, "tenth size, from step 0")
# checks scored before the scaling model last changed: their runs were seen
SEEN_CHECKS = ("fresh size", "fresh horizon", "third size", "third horizon", "fourth size",
               "fourth horizon", "fifth size", "sixth size", "sixth size, from step 0",
               "seventh size", "seventh size, from step 0", "eighth size",
               "eighth size, from step 0", "ninth size", "ninth size, from step 0")


def is_size_check(run: dict[str, Any]) -> bool:
    """A run of the largest model of the size study."""
    return int(run["model"]["hidden"]) == SIZE_CHECK_HIDDEN


def is_horizon_check(run: dict[str, Any]) -> bool:
    return int(run["steps"]) == HORIZON_CHECK_STEPS


def is_horizon_fit(run: dict[str, Any]) -> bool:
    return int(run["steps"]) == HORIZON_FIT_STEPS


def targets(loss_init: float, best_final: float,
            fractions: tuple[float, ...] = TARGET_FRACTIONS) -> list[float]:
    return [loss_init - f * (loss_init - best_final) for f in fractions]
