"""The torchrun entry point: one rank of a real FSDP / HSDP / FL+FSDP / FL+HSDP training run.

    torchrun --nproc-per-node 4 -m realrun.train scenarios/cpu4.yaml --algorithm fl_fsdp \
        --out runs/x [--set training.steps=8 ...] [--device auto|cpu|cuda] [--timeout-s 120]

`--algorithm a,b` or `all` runs several algorithms one after another in the same processes,
each into DIR/NAME. Each rank writes DIR/trace_rank{r}.jsonl as it goes; at the end rank 0
writes DIR/summary.json and DIR/trace.json (Chrome/Perfetto). Failures print one line,
`error: rank R: ...`, and exit with the status of `realrun.errors` (2 bad input, 3 a peer died
or a collective timed out, 4 internal error with the traceback in DIR/error_rank{r}.txt).

A step: other (batch) -> forward -> backward -> optimizer (+ LR step) -> aggregation (FedAvg,
every K steps and after the last step, federated algorithms only) -> other (loss to host).
Evaluation runs before training (the untrained perplexity) and after the final aggregation.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import math
import os
import signal
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from simfed.spec import (
    FED,
    PHASES,
    REPLICATE,
    SHARD,
    AlgorithmSpec,
    SpecError,
    algorithm_info,
    load_scenario,
    to_plain,
)
from simfed.spec.overrides import parse_sets
from simfed.spec.paths import write_text_atomic
from simfed.spec.rounds import ends_round

from .collectives import CollectiveTap
from .config import check_runnable, parse_window, select_algorithms
from .data import EVAL_STREAM, TRAIN_STREAM, Sampler, eval_sequences, load_corpus, make_batch
from .errors import (
    EXIT_BAD_INPUT,
    EXIT_INTERNAL,
    EXIT_OK,
    EXIT_PEER_LOST,
    CollectiveError,
    RealrunError,
)
from .fedavg import FedAvg, local_shards
from .mesh import Mesh, Placement, init_process_group
from .model import Llama, next_token_loss
from .optimizer import build_optimizer, clip_gradients
from .sharding import shard_model
from .summary import write_outputs
from .tracing import Tracer, host_facts

DEFAULT_TIMEOUT_S = 120.0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m realrun.train", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("scenario", help="scenario YAML")
    ap.add_argument("--algorithm", required=True,
                    help="fsdp, hsdp, fl_fsdp or fl_hsdp (or a label); a comma-separated list "
                    "or `all` runs them one after another, each in DIR/NAME")
    ap.add_argument("--out", required=True, help="output directory")
    ap.add_argument("--set", dest="overrides", action="append", default=[],
                    metavar="KEY=VALUE", help="override a scenario key (dotted path; YAML value)")
    ap.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    ap.add_argument("--timeout-s", type=float, default=DEFAULT_TIMEOUT_S,
                    help="collective timeout: a dead or hung peer ends the run after this")
    ap.add_argument("--profile-steps", default="", metavar="A:B",
                    help="torch.profiler window over steps A..B-1 -> DIR/profile_rank{r}.json")
    ap.add_argument("--dump-fedavg", action="store_true",
                    help="save each rank's shards before and after every FedAvg round "
                    "(DIR/fedavg/round{n}_rank{r}.pt), for checks")
    ap.add_argument("--kill-rank", type=int, default=-1, help="fault injection: this rank ...")
    ap.add_argument("--kill-at-step", type=int, default=-1, help="... at this step")
    ap.add_argument("--kill-in", default="step", choices=("step", "aggregation"),
                    help="... at its start, or inside its FedAvg round (before the all-reduce)")
    ap.add_argument("--kill-signal", default="KILL", choices=("KILL", "STOP"),
                    help="... sends itself SIGKILL (dies) or SIGSTOP (hangs)")
    return ap.parse_args(argv)


class Launch:
    """What every algorithm of this launch shares: the scenario, this rank's placement and the
    default process group. All validation happens here, before any collective."""

    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.scenario_path = Path(args.scenario)
        self.scenario = sc = load_scenario(self.scenario_path, parse_sets(args.overrides))
        self.algorithms = select_algorithms(sc, args.algorithm)
        check_runnable(sc)
        self.window = parse_window(args.profile_steps)
        self.placement = Placement.from_env(args.device)
        world = sc.cluster.world
        if self.placement.world != world:
            raise RealrunError(
                f"torchrun started {self.placement.world} ranks but the scenario's cluster "
                f"{sc.cluster.name} has {sc.cluster.nodes} nodes x {sc.cluster.node.gpus} = "
                f"{world}"
            )
        self.corpus = load_corpus(sc, self.scenario_path)
        self.debug_checks = sc.runtime.host.debug_checks
        if self.debug_checks == "detail":  # the paper's launcher exports this on every rank
            os.environ["TORCH_DISTRIBUTED_DEBUG"] = "DETAIL"
        os.environ.setdefault("TORCH_DISTRIBUTED_DEBUG", "OFF")
        dist.set_debug_level_from_env()
        init_process_group(self.placement, args.timeout_s)

    def out_dir(self, algo: AlgorithmSpec) -> Path:
        out = Path(self.args.out)
        return out if len(self.algorithms) == 1 else out / (algo.label or algo.name)


class Trainer:
    """One algorithm on this rank: mesh, model, optimizer, FedAvg and tracing, then `run()`."""

    def __init__(self, launch: Launch, algo: AlgorithmSpec):
        self.launch, self.args, self.algo = launch, launch.args, algo
        sc = self.scenario = launch.scenario
        self.scenario_path, self.window = launch.scenario_path, launch.window
        self.placement, self.corpus = launch.placement, launch.corpus
        self.debug_checks = launch.debug_checks
        self.out = launch.out_dir(algo)
        self.info = algorithm_info(algo.name)
        self.plan = algo.plan(sc.cluster)
        self.training = sc.training
        self.rank = self.placement.rank
        self.n_eval = eval_sequences(sc)
        self.sampler = Sampler(world=self.plan.world, micro_batch=self.training.micro_batch,
                               dataset_sequences=sc.dataset_sequences)

        self.mesh = Mesh(self.plan, self.placement, self.args.timeout_s)
        device = self.placement.device
        torch.manual_seed(sc.seed)  # every rank builds the same full model, then shards it
        self.model = Llama(sc.model, self.training.seq_len, device)
        # training.activation_checkpointing / checkpoint_early_stop, as simfed charges them
        self.checkpointed = self.model.set_checkpointing(self.training)
        self.compiled = self.model.set_compile(self.training)
        self.params = sum(p.numel() for p in self.model.parameters())
        self.sharding = shard_model(self.model, self.mesh.model_mesh(), self.algo)
        self.opt, self.sched = build_optimizer(self.model, self.training, device)
        self.trainable = [p for p in self.model.parameters() if p.requires_grad]
        self.fedavg = None
        a = self.algo
        # FL variants (simfed.engine.variants; realrun.fedavg's module note): a timed round
        # (budget or deadline) or an outer optimizer
        self.timed = ("budget" if a.round_budget_s > 0 else
                      "deadline" if a.round_deadline_s > 0 else "")
        if self.info.federated and self.plan.groups > 1:
            self.fedavg = FedAvg(self.model, self.mesh.group(FED), self.plan.groups,
                                 a.fedavg_dtype, outer_optimizer=a.outer_optimizer,
                                 outer_lr=a.outer_lr, outer_momentum=a.outer_momentum,
                                 variant=bool(self.timed))

        self.meta = self._meta()
        self.tracer = Tracer(self.out / f"trace_rank{self.rank}.jsonl", self.meta, rank=self.rank,
                             device=device, sync_per_phase=sc.runtime.host.sync_per_phase)
        self.tap = CollectiveTap(
            rank=self.rank, clock=self.tracer.now, where=self.tracer.where,
            kind_of=self.mesh.kind_of, write=self.tracer.emit, timeout_s=self.args.timeout_s,
            cuda=device.type == "cuda",
        )
        self.tracer.attach(self.tap)
        self.tap.install()

    def _meta(self) -> dict[str, Any]:
        p, pl = self.plan, self.placement
        g, r, s = self.mesh.coords
        gloo = pl.backend == "gloo"
        return {
            "source": "realrun",
            "scenario": self.scenario.name,
            "algorithm": self.algo.name,
            "label": self.algo.display,
            "backend": pl.backend,
            "device": str(pl.device),
            "world_size": p.world,
            "rank": self.rank,
            "pid": os.getpid(),
            "node": p.node_of(self.rank),
            "coords": {"group": g, "replica": r, "shard_index": s},
            "plan": {"groups": p.groups, "replicate": p.replicate, "shard": p.shard,
                     "nodes": p.nodes, "gpus_per_node": p.gpus_per_node},
            "debug_checks": self.debug_checks,
            "torch_distributed_debug": dist.get_debug_level().name,
            "timeout_s": self.args.timeout_s,
            "seed": self.scenario.seed,
            "model": {"name": self.scenario.model.name, "params": self.params,
                      "dtype": self.scenario.model.dtype},
            "sharding": self.sharding,
            "activation_checkpointing": {"blocks": self.checkpointed,
                                         "early_stop": self.training.checkpoint_early_stop,
                                         "policy": self.training.ac_policy},
            "compile": self.compiled,
            "fedavg_dtype": self.algo.fedavg_dtype if self.fedavg else None,
            "clock": "seconds since a barrier before training",
            "comm_nbytes": "full buffer: all_gather output, reduce_scatter input, "
                           "all_reduce tensor",
            "comm_overlaps_compute": not gloo,
            "reduce_scatter_impl": "gloo: a full all-reduce of the input" if gloo else "backend",
            **host_facts(),
        }

    # ---- the run ----------------------------------------------------------------------------
    def run(self) -> None:
        t, tracer = self.training, self.tracer
        self.tap.enabled = False
        dist.barrier()
        tracer.start_clock()
        self.tap.enabled = True
        self.say(f"{self.algo.display}: {self.plan.describe()}, {self.placement.backend} on "
                 f"{self.placement.device.type}, {self.params:,} params, {t.steps} steps, "
                 f"debug_checks {self.debug_checks}")
        eval_untrained = self.evaluate(step=-1, name="eval_untrained")
        losses: list[float] = []
        rounds: list[int] = []
        k = self.algo.aggregate_every
        prof = None
        # a timed round (budget / deadline): the group stops taking local steps when the next
        # one would not fit in the budget, or once past the deadline; a stopped group's slots
        # up to the round's FedAvg do no work and repeat its last loss (fl_rounds says which)
        round_start, taken, stopped, last_step_s = time.perf_counter(), 0, False, 0.0
        self.fl_rounds: list[dict[str, Any]] = []
        for step in range(t.steps):
            if self.window and step == self.window[0]:
                prof = self._start_profiler()
            aggregate = self.fedavg and ends_round(step, steps=t.steps, every=k)
            with tracer.step_span(step):
                if not stopped:
                    began = time.perf_counter()
                    with tracer.phase_span("other"):
                        self._maybe_die(step, "step")
                        idx = self.sampler.train_indices(step, self.rank)
                        inputs, targets, _ = make_batch(self.corpus, TRAIN_STREAM, idx,
                                                        self.placement.device)
                    with tracer.phase_span("forward"):
                        loss = next_token_loss(self.model(inputs), targets)  # (B, T, V) -> ()
                    with tracer.phase_span("backward"):
                        loss.backward()
                    with tracer.phase_span("optimizer"):
                        clip_gradients(self.trainable, t)
                        self.opt.step()
                        self.sched.step()
                        self.opt.zero_grad(set_to_none=True)
                    taken += 1
                    last_step_s = time.perf_counter() - began
                    if self.timed and not aggregate:
                        stopped = self._round_over(time.perf_counter() - round_start,
                                                   last_step_s)
                if aggregate:
                    made_it = True
                    if self.timed == "deadline":  # done with the round's steps by the deadline
                        made_it = not stopped and not self._round_over(
                            time.perf_counter() - round_start, 0.0)
                    self._aggregate(step, len(rounds), taken if self.timed else None, made_it)
                    rounds.append(step)
                    round_start, taken, stopped = time.perf_counter(), 0, False
                with tracer.phase_span("other"):
                    losses.append(loss.item())
            if prof is not None and self.window and step == self.window[1] - 1:
                prof.__exit__(None, None, None)
                prof.export_chrome_trace(str(self.out / f"profile_rank{self.rank}.json"))
                prof = None
            self.say(f"step {step + 1}/{t.steps} loss {losses[-1]:.4f} "
                     f"(ppl {math.exp(losses[-1]):.2f}) {tracer.step_s[step]:.3f} s")
        eval_final = self.evaluate(step=t.steps, name="eval")
        with tracer.host_span("model_hash", step=t.steps):
            self.tap.enabled = False
            sha = self.model_sha256()
        record = {
            "rank": self.rank,
            "coords": list(self.mesh.coords),
            "train_loss": losses,
            "step_s": [tracer.step_s[s] for s in range(t.steps)],
            "step_start_s": [tracer.step_start_s[s] for s in range(t.steps)],
            "phase_s": {ph: [tracer.phase_s[s][ph] for s in range(t.steps)] for ph in PHASES},
            "eval": eval_final,
            "eval_untrained": eval_untrained,
            "sha256": sha,
            "fedavg_steps": rounds,
            "fl_rounds": self.fl_rounds,
        }
        records: list[Any] = [None] * self.plan.world if self.rank == 0 else []
        dist.gather_object(record, records if self.rank == 0 else None, dst=0)
        tracer.close()
        dist.barrier()  # every trace is closed before rank 0 merges them
        if self.rank == 0:
            summary = write_outputs(self.out, records, self._summary_context())
            if self.fedavg and (self.timed or self.algo.outer_optimizer != "average"):
                summary = self._add_variant(summary, records)
            self.say(f"train ppl {summary['train_perplexity'][0]:.2f} -> "
                     f"{summary['train_perplexity'][-1]:.2f}, eval ppl "
                     f"{summary['untrained_eval_perplexity']:.2f} -> "
                     f"{summary['eval_perplexity']:.2f}, step {summary['step_time_s']:.3f} s, "
                     f"{summary['tokens_per_s']:.0f} tokens/s -> {self.out}/summary.json")

    def close(self) -> None:
        """Undo what outlives this algorithm in the process (the tap), free the model."""
        self.tap.uninstall()
        self.tracer.close()
        del self.model, self.opt, self.sched, self.fedavg
        dist.barrier()

    def _maybe_die(self, step: int, where: str) -> None:
        """Fault injection (tests): this rank dies (SIGKILL) or hangs (SIGSTOP) at the start
        of a step, or inside its FedAvg round while its peers are in the all-reduce."""
        a = self.args
        if self.rank == a.kill_rank and step == a.kill_at_step and where == a.kill_in:
            os.kill(os.getpid(), signal.Signals[f"SIG{self.args.kill_signal}"])

    def _round_over(self, elapsed_s: float, next_step_s: float) -> bool:
        """Whether this federation group's timed round is over (the next step would not fit in
        the budget; past the deadline), the same answer on every rank of the group: the
        largest of its ranks' clocks (a MAX all-reduce over the group's shard, then replica,
        groups; untraced control messages, not training traffic)."""
        a = self.algo
        limit = a.round_budget_s if self.timed == "budget" else a.round_deadline_s
        seen = torch.tensor([elapsed_s + next_step_s], dtype=torch.float64,
                            device=self.placement.device)  # NCCL: on the GPU
        self.tap.enabled = False
        for kind, size in ((SHARD, self.plan.shard), (REPLICATE, self.plan.replicate)):
            if size > 1:
                dist.all_reduce(seen, op=dist.ReduceOp.MAX, group=self.mesh.group(kind))
        self.tap.enabled = True
        return float(seen) > limit

    def _add_variant(self, summary: dict[str, Any], records: list[Any]) -> dict[str, Any]:
        """summary.json's fl_variant: the variant and, per round and group, the local steps
        taken and whether the group was in the average."""
        a = self.algo
        first = {}
        for r in sorted(records, key=lambda x: x["rank"]):
            first.setdefault(r["coords"][0], r)
        summary["fl_variant"] = {
            "timed": self.timed or None,
            "round_budget_s": a.round_budget_s or None,
            "round_deadline_s": a.round_deadline_s or None,
            "outer_optimizer": a.outer_optimizer,
            "outer_lr": a.outer_lr if a.outer_optimizer != "average" else None,
            "outer_momentum": a.outer_momentum if a.outer_optimizer != "average" else None,
            "rounds_per_group": [first[g]["fl_rounds"] for g in sorted(first)],
        }
        write_text_atomic(self.out / "summary.json", json.dumps(summary, indent=1) + "\n")
        return summary

    def _aggregate(self, step: int, round_index: int, steps_taken: int | None = None,
                   participate: bool = True) -> None:
        """One FedAvg round; with --dump-fedavg, the shards before and after (the copying and
        saving count as "other"). A timed round passes the local steps the group took and
        whether it made the deadline."""
        assert self.fedavg is not None
        dump = self.args.dump_fedavg
        if dump:
            with self.tracer.phase_span("other", dump="fedavg"):
                pre = [t.detach().clone() for t in local_shards(self.model)]
        with self.tracer.phase_span("aggregation", round=round_index):
            self._maybe_die(step, "aggregation")
            seen = self.fedavg(steps_taken, participate)
        self.fl_rounds.append({"step": step, "steps_taken": steps_taken,
                               "participated": participate, **seen})
        if dump:
            with self.tracer.phase_span("other", dump="fedavg"):
                post = [t.detach().clone() for t in local_shards(self.model)]
                path = self.out / "fedavg" / f"round{round_index}_rank{self.rank}.pt"
                path.parent.mkdir(parents=True, exist_ok=True)
                torch.save({"step": step, "rank": self.rank, "coords": self.mesh.coords,
                            "names": [n for n, _ in self.model.named_parameters()],
                            "pre": pre, "post": post}, path)

    def _start_profiler(self) -> Any:
        acts = [torch.profiler.ProfilerActivity.CPU]
        if self.placement.device.type == "cuda":
            acts.append(torch.profiler.ProfilerActivity.CUDA)
        # shapes ("Input Dims", "Input type") for `simfed calibrate`'s per-operator fit
        # (simfed.calibration.profiler): GEMM shapes, bytes of memory-bound ops
        prof = torch.profiler.profile(activities=acts, record_shapes=True)
        prof.__enter__()
        return prof

    @torch.no_grad()
    def evaluate(self, *, step: int, name: str) -> list[float]:
        """Sum of token losses (nats) and token count over this rank's share of the eval set.
        Every federation group evaluates the whole set, split over the group's ranks."""
        size = self.plan.group_size
        position = self.rank % size
        loss_sum, tokens = 0.0, 0
        with self.tracer.host_span(name, step=step) as attrs:
            for idx in self.sampler.eval_indices(position, size, self.n_eval):
                inputs, targets, weight = make_batch(self.corpus, EVAL_STREAM, idx,
                                                     self.placement.device)
                per_token = next_token_loss(self.model(inputs), targets, reduction="none")
                per_seq = per_token.view(targets.shape).sum(dim=1)  # (B,)
                loss_sum += float((per_seq * weight).sum().item())
                tokens += int(weight.sum().item()) * targets.shape[1]
            attrs.update(loss_sum=loss_sum, tokens=tokens)
        # a forward without backward leaves a root kept unsharded after forward gathered
        reshard = getattr(self.model, "reshard", None)
        if callable(reshard):
            reshard()
        return [loss_sum, tokens]

    @torch.no_grad()
    def model_sha256(self) -> str:
        """SHA-256 of this rank's full model copy (names, dtypes, shapes, bytes)."""
        h = hashlib.sha256()
        for name, p in self.model.named_parameters():
            full = p.full_tensor() if hasattr(p, "full_tensor") else p
            t = full.detach().contiguous().cpu()
            h.update(f"{name}:{t.dtype}:{tuple(t.shape)}".encode())
            h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
        return h.hexdigest()

    def _summary_context(self) -> dict[str, Any]:
        t, sc = self.training, self.scenario
        return {
            "meta": self.meta,
            "algorithm": self.algo.name,
            "title": self.info.title,
            "scenario": sc.name,
            "scenario_path": str(self.scenario_path),
            "steps": t.steps,
            "seq_len": t.seq_len,
            "micro_batch": t.micro_batch,
            "aggregate_every": self.algo.aggregate_every if self.fedavg else None,
            "fedavg_nbytes_per_rank": self.fedavg.nbytes if self.fedavg else 0,
            "eval_sequences": self.n_eval,
            "data": self.corpus.describe(),
            "entropy_floor_bits": self.corpus.entropy_floor_bits,
            "vocab": sc.model.vocab,
            "training": to_plain(t),
        }

    def say(self, msg: str) -> None:
        if self.rank == 0:
            print(f"realrun: {msg}", flush=True)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    rank = int(os.environ.get("RANK", "0"))
    code, trainer = EXIT_OK, None
    try:
        launch = Launch(args)
        for algo in launch.algorithms:
            trainer = Trainer(launch, algo)
            trainer.run()
            trainer.close()
    except CollectiveError as exc:
        code = _fail(rank, str(exc), EXIT_PEER_LOST)
    except (RealrunError, SpecError) as exc:
        code = _fail(rank, str(exc), EXIT_BAD_INPUT)
    except OSError as exc:  # the environment: a full disk, a file-size limit, permissions
        code = _fail(rank, f"{exc.filename or 'a file'}: {exc.strerror or exc}", EXIT_BAD_INPUT)
    except Exception as exc:
        tap = trainer.tap if trainer is not None else None
        if tap is not None and tap.failure:  # a collective failed inside an autograd hook
            code = _fail(rank, tap.failure, EXIT_PEER_LOST)
        elif isinstance(exc, dist.DistError):
            code = _fail(rank, f"{type(exc).__name__}: {_first_line(exc)}", EXIT_PEER_LOST)
        else:
            code = _internal_error(rank, Path(args.out), exc)
    finally:
        if trainer is not None:
            with contextlib.suppress(Exception):  # nothing more to save
                trainer.tracer.close()
        sys.stdout.flush()
        sys.stderr.flush()
        if code == EXIT_OK and dist.is_initialized():
            dist.destroy_process_group()
        # os._exit skips interpreter teardown, which aborts now and then after gloo shutdown
        os._exit(code)


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return (lines[0] if lines else type(exc).__name__)[:300]


def _fail(rank: int, msg: str, code: int) -> int:
    print(f"error: rank {rank}: {msg}", file=sys.stderr, flush=True)
    return code


def _internal_error(rank: int, out: Path, exc: BaseException) -> int:
    path = out / f"error_rank{rank}.txt"
    try:
        out.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(traceback.format_exception(exc)), encoding="utf-8")
        where = f" (traceback in {path})"
    except OSError:
        where = ""
    return _fail(rank, f"internal error: {type(exc).__name__}: {_first_line(exc)}{where}",
                 EXIT_INTERNAL)


if __name__ == "__main__":
    main()
