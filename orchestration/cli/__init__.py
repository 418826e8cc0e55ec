"""`headroom` command line. Input is validated before torch (or Ray) is imported: a bad input prints exactly one
line on stderr and exits 2, having started and written nothing."""

from __future__ import annotations

import argparse
import base64
import json
import math
import os
import sys
import urllib.error
import urllib.request
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Literal, get_args, get_origin

from lightning_modules.data.tokens import planned_vocab_size
from lightning_modules.declarations.bounds import MAX_INT, MAX_SEED
from lightning_modules.declarations.config import (
    FAMILIES,
    PRESET_FIELDS,
    SCALES,
    HeadroomInputError,
    TrainConfig,
)
from lightning_modules.declarations.methods import METHODS
from lightning_modules.declarations.prune_plan import DEFAULT_CALIBRATION_BATCHES, DEFAULT_FINETUNE_LR, Scope
from lightning_modules.models.checkpoints import checkpoint_info
from orchestration.design.packing import packing_note
from orchestration.design.plan import build_plan, check_plan_size, pretrained_units
from orchestration.design.preflight import compute_note, format_table, plan_rows
from orchestration.design.spec import DEFAULT_TRACKING_URI, load_sweep, report_dir, resolve_tracking_uri
from orchestration.report import headline_table, write_report
from orchestration.running.frameworks import quiet_frameworks as _quiet_frameworks
from orchestration.running.stages import run_sweep

from .bench import add_bench
from .commands import TRAIN_FLAGS, cmd_export, cmd_prune, cmd_score, cmd_train
from .paths import check_writable, user_path

EXIT_BAD_INPUT = 2


class _Parser(argparse.ArgumentParser):
    """argparse prints usage plus an error; our contract is one line."""

    def error(self, message: str):
        raise HeadroomInputError(message)


def _int(s: str, low: int = -MAX_INT - 1, high: int = MAX_INT) -> int:
    """An integer flag within what the code downstream holds (config.MAX_INT: a signed 64-bit integer)."""
    try:
        v = int(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {s!r}") from None
    if v < low:
        raise argparse.ArgumentTypeError(f"must be at least {low}, got {v}")
    if v > high:
        raise argparse.ArgumentTypeError(f"must be at most {high}, got {v}")
    return v


def _positive_int(s: str) -> int:
    return _int(s, 1)


def _count(s: str) -> int:
    return _int(s, 0)


def _seed(s: str) -> int:
    return _int(s, 0, MAX_SEED)  # config.MAX_SEED: what numpy's and torch's generators accept with room


def _float(s: str) -> float:
    """A float flag: finite (no inf or nan reaches a config)."""
    try:
        v = float(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {s!r}") from None
    if not math.isfinite(v):
        raise argparse.ArgumentTypeError(f"must be a finite number, got {s}")
    return v


def _flag_of(field) -> dict:
    """argparse's type or choices for a pydantic field: a Literal's values, an int that must be positive, int, float."""
    ann = field.annotation
    if type(None) in get_args(ann):  # X | None: the flag is X, absent is None
        ann = next(a for a in get_args(ann) if a is not type(None))
    if get_origin(ann) is Literal:
        return {"choices": get_args(ann)}
    if ann is int and any(getattr(m, "gt", None) == 0 for m in field.metadata):
        return {"type": _positive_int}
    return {"type": {int: _int, float: _float}.get(ann, ann)}  # bounded: within int64, finite


def _head_dim(s: str):
    return "auto" if s == "auto" else _positive_int(s)


def _add_train(sub) -> None:
    p = sub.add_parser("train", help="train one model at a preset scale and head count",
                       description="Train one model. --heads keeps the preset's head_dim (the Scratch-E "
                                   "architecture of a pruned model); --head-dim overrides it (auto: the largest "
                                   "even size with heads x head_dim <= d_model, the 'wide' control).")
    p.add_argument("--scale", default="xs", help=f"one of {', '.join(SCALES)} (default xs)")
    p.add_argument("--family", default="decoder", help=f"one of {', '.join(FAMILIES)} (default decoder)")
    p.add_argument("--heads", type=_positive_int, help="heads per layer (default: the scale's)")
    p.add_argument("--head-dim", type=_head_dim,
                   help="head size, or auto for the wide control's (the largest even size that fits d_model)")
    for name, help_text in TRAIN_FLAGS.items():  # TrainConfig's fields, their types and constraints
        field = TrainConfig.model_fields[name]
        default = "the scale preset's" if name in PRESET_FIELDS else field.default
        p.add_argument("--" + name.replace("_", "-"), help=help_text or f"default: {default}", **_flag_of(field))
    p.add_argument("--seed", type=_seed, default=0)
    p.add_argument("--data", default="stdlib", help="stdlib | path:GLOB | hf:NAME[:CONFIG] | mqar")
    p.add_argument("--shift", help="a second source for the shifted eval set (path:GLOB or hf:NAME)")
    p.add_argument("--tokenizer", default="byte", help="byte | bpe | pretrained:DIR")
    p.add_argument("--workers", type=_positive_int, default=1,
                   help="data-parallel workers (DDP through Ray Train on a local Ray; each takes batch-size / "
                        "workers of every batch, one CPU or GPU each; default 1: this process)")
    p.add_argument("--compile", action="store_true",
                   help="torch.compile the model (as HEADROOM_COMPILE=1 does for a sweep's trials); see "
                        "benchmarks/train_kernels.py for what it buys")
    p.add_argument("--out", required=True, help="output directory (must not exist or be empty)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_train)


def _add_data_args(p) -> None:
    p.add_argument("--data", help="stdlib | path:GLOB | hf:NAME[:CONFIG] | mqar (default: the run's data, or stdlib)")
    p.add_argument("--shift", help="a second source for the shifted eval set")
    p.add_argument("--tokenizer", help="byte | bpe | pretrained:DIR (default: the run's, or the checkpoint's own)")
    p.add_argument("--batch-size", type=_positive_int)
    p.add_argument("--seq-len", type=_positive_int)
    p.add_argument("--calibration-batches", type=_positive_int, default=DEFAULT_CALIBRATION_BATCHES)
    p.add_argument("--seed", type=_seed, default=None,
                   help="data order and random scores (default: the run's own seed, else 0)")


def _add_score(sub) -> None:
    p = sub.add_parser("score", help="score the heads of a checkpoint on calibration data",
                       description="Write head importances [layers x heads] as JSON and a heatmap PNG beside it.")
    p.add_argument("checkpoint", help="a `headroom train` run directory or a Hugging Face model directory")
    p.add_argument("--method", required=True, help=f"one of {', '.join(METHODS)}")
    p.add_argument("--out", default="scores.json", help="JSON file (the heatmap goes beside it as .png)")
    _add_data_args(p)
    p.set_defaults(func=cmd_score)


def _add_prune(sub) -> None:
    p = sub.add_parser("prune", help="prune the heads of a checkpoint, fine-tune, evaluate, time",
                       description="Score heads, remove a fraction of them physically, optionally fine-tune, and "
                                   "write the pruned model and metrics.json.")
    p.add_argument("checkpoint", help="a `headroom train` run directory or a Hugging Face model directory")
    p.add_argument("--method", required=True, help=f"one of {', '.join(METHODS)}")
    p.add_argument("--ratio", type=_float, required=True, help="fraction of heads to remove, in [0, 1)")
    p.add_argument("--scope", choices=get_args(Scope), default="per_layer")
    p.add_argument("--iterative", type=_float, metavar="STEP",
                   help="remove STEP of the heads at a time, re-scoring in between (default: one shot)")
    p.add_argument("--finetune-steps", type=_count, default=0)
    p.add_argument("--finetune-lr", type=_float, default=DEFAULT_FINETUNE_LR)
    p.add_argument("--bias-compensation", action=argparse.BooleanOptionalAction, default=None,
                   help="fold the removed heads' mean output into the output projection's bias (FLAP); default: "
                        "the method's own recipe (on for flap)")
    p.add_argument("--eval-batches", type=_positive_int,
                   help="batches of each eval set (default: every window of it, up to 2^20 tokens)")
    p.add_argument("--curve-batches", type=_positive_int, default=8,
                   help="batches per point of the mask-only prune curve (default 8)")
    p.add_argument("--out", required=True, help="output directory (must not exist or be empty)")
    p.add_argument("--quiet", action="store_true")
    _add_data_args(p)
    p.set_defaults(func=cmd_prune)


def _add_sweep(sub) -> None:
    p = sub.add_parser("sweep", help="run a sweep file: Ray Tune trials, MLflow runs, a summary",
                       description="Run a sweep (sweeps/*.yaml) as Ray Tune stages — lr_search, train, prune, "
                                   "controls — every unit an MLflow child run of the sweep's parent run. With no "
                                   "flags: local Ray in-process, MLflow at sqlite:///mlflow.db, Tune storage "
                                   "./ray_results. Under `ray job submit` the job's cluster is used.")
    p.add_argument("file", help="the sweep file (YAML)")
    p.add_argument("--resume", action="store_true",
                   help="continue an interrupted or failed sweep: unfinished units start from their newest "
                        "checkpoint, finished ones are skipped")
    p.add_argument("--address", help="Ray cluster address (default: $RAY_ADDRESS, else a local Ray)")
    p.add_argument("--tracking-uri", help="MLflow tracking URI (default: the sweep's, else sqlite:///mlflow.db)")
    p.add_argument("--storage", help="Ray Tune storage: a path shared by all nodes, or s3://... (default ./ray_results)")
    p.add_argument("--quiet", action="store_true", help="no progress output")
    p.add_argument("--register", action="store_true",
                   help="after the report, register the pruned models of the primary method (gradient, per layer, "
                        "one-shot) in MLflow's Model Registry: one model per scale, family and ratio "
                        "(<sweep>-<scale>-<family>-r<ratio>-pruned), a version per seed, tagged with the verdict "
                        "and the dense and pruned losses")
    p.add_argument("--plan", action="store_true",
                   help="plan every unit and build its model on the meta device, print one row per unit (stage, "
                        "arm, heads, head_dim, lr, steps, tokens, params, FLOPs, estimated cost) and exit; "
                        "nothing is trained or recorded")
    p.add_argument("--json", action="store_true", help="with --plan: the rows as a JSON list")
    p.add_argument("--simulate-gpus", type=_positive_int, metavar="N",
                   help="a local Ray that declares N GPUs which do not exist: fractional `gpu` trials are packed "
                        "as on a GPU node, each records the GPU it was given (param gpu_ids) and trains on the CPU "
                        "(sets HEADROOM_SIMULATED_GPUS=1); for testing a sweep's packing without a GPU")
    p.set_defaults(func=cmd_sweep)


def _add_report(sub) -> None:
    p = sub.add_parser("report", help="the verdict report of a sweep, from its MLflow runs",
                       description="Read the newest parent run of a sweep (and its finished children) from MLflow "
                                   "and write verdict.json, report.md, report.html and the plots to "
                                   "reports/<sweep>/; log them to the parent run. `headroom sweep` runs this at "
                                   "its end.")
    p.add_argument("--sweep", required=True, help="the sweep's name (its MLflow experiment)")
    p.add_argument("--tracking-uri", help="MLflow tracking URI (default sqlite:///mlflow.db)")
    p.add_argument("--out", help="output directory (default reports/<sweep>/)")
    p.set_defaults(func=cmd_report)


def _add_export(sub) -> None:
    p = sub.add_parser("export", help="write a model directory that loads without headroom",
                       description="Write a checkpoint (a run directory or a model directory) as a Hugging Face "
                                   "directory with its tokenizer that loads with torch and transformers alone: "
                                   "plain from_pretrained where transformers can build its shape, otherwise with "
                                   "trust_remote_code=True through the modeling_headroom.py it carries (per-layer "
                                   "head counts, pruned GPT-2/BERT heads, headroom's rotary encoder).")
    p.add_argument("checkpoint", help="a `headroom train`/`headroom prune` run directory or a model directory")
    p.add_argument("--out", required=True, help="output directory (must not exist or be empty)")
    p.add_argument("--onnx", action="store_true",
                   help="also write onnx/model.onnx (transformers' ONNX exporter; dynamic batch and length), checked "
                        "in onnxruntime against PyTorch; needs `pip install 'headroom[onnx]'`")
    p.set_defaults(func=cmd_export)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="headroom", description="Is multi-head attention over-provisioned? "
                                                  "Prune-vs-scratch experiments at several scales.")
    try:
        v = version("headroom")
    except PackageNotFoundError:
        v = "dev"
    parser.add_argument("--version", action="version", version=f"headroom {v}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    _add_train(sub)
    _add_score(sub)
    _add_prune(sub)
    _add_sweep(sub)
    _add_report(sub)
    _add_export(sub)
    add_bench(sub)
    return parser


def _check_tracking_uri(uri: str) -> None:
    """A tracking URI we can use, and — for a server — one that answers, before anything starts."""
    scheme = uri.split("://", 1)[0] if "://" in uri else ""
    if scheme == "sqlite":
        path = uri[len("sqlite:///"):] if uri.startswith("sqlite:///") else ""
        if not path:
            raise HeadroomInputError(f"--tracking-uri {uri}: expected sqlite:///PATH")
        db = user_path(path, "--tracking-uri")
        check_writable(str(db), "--tracking-uri", kind="file")
        parent = Path(os.path.abspath(db)).parent
        if not parent.is_dir():
            raise HeadroomInputError(f"--tracking-uri {uri}: directory {parent} does not exist")
    elif scheme in ("http", "https"):
        try:
            urllib.request.urlopen(uri.rstrip("/") + "/health", timeout=5).read()
        except (urllib.error.URLError, OSError, ValueError) as e:
            reason = getattr(e, "reason", e)
            raise HeadroomInputError(f"--tracking-uri {uri}: tracking server unreachable ({reason})") from None
        _check_credentials(uri)
    elif scheme in ("", "file") and os.environ.get("MLFLOW_ALLOW_FILE_STORE", "").lower() not in ("1", "true"):
        raise HeadroomInputError(f"--tracking-uri {uri}: MLflow refuses its file store (a directory) unless "
                                 "MLFLOW_ALLOW_FILE_STORE=true; use sqlite:///PATH or a tracking server")
    elif scheme not in ("", "file", "postgresql", "mysql", "databricks"):
        raise HeadroomInputError(f"--tracking-uri {uri}: unsupported scheme {scheme!r}")


def _check_credentials(uri: str) -> None:
    """A server with authentication (MLflow's basic-auth app) answers /health to anyone: ask it something that
    needs a login, with the credentials MLflow's client will send (MLFLOW_TRACKING_USERNAME/PASSWORD or
    MLFLOW_TRACKING_TOKEN), so that missing or wrong ones stop us here rather than mid-sweep."""
    req = urllib.request.Request(uri.rstrip("/") + "/api/2.0/mlflow/experiments/search?max_results=1")
    user, password = os.environ.get("MLFLOW_TRACKING_USERNAME"), os.environ.get("MLFLOW_TRACKING_PASSWORD")
    token = os.environ.get("MLFLOW_TRACKING_TOKEN")
    if user and password:
        req.add_header("Authorization", "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode())
    elif token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        urllib.request.urlopen(req, timeout=10).read()
    except urllib.error.HTTPError as e:
        if e.code == 401:
            raise HeadroomInputError(
                f"--tracking-uri {uri}: credentials rejected (MLFLOW_TRACKING_USERNAME {user!r})" if user or token
                else f"--tracking-uri {uri}: the server requires a login; set MLFLOW_TRACKING_USERNAME and "
                     "MLFLOW_TRACKING_PASSWORD") from None
        if e.code == 403:
            raise HeadroomInputError(f"--tracking-uri {uri}: user {user!r} may not read experiments") from None
    except (urllib.error.URLError, OSError) as e:
        raise HeadroomInputError(f"--tracking-uri {uri}: tracking server unreachable "
                                 f"({getattr(e, 'reason', e)})") from None


def cmd_sweep(args) -> int:
    sweep, text = load_sweep(args.file)
    check_plan_size(sweep)  # before anything is built: a plan too large to hold is refused in one line
    if args.json and not args.plan:
        raise HeadroomInputError("--json: only with --plan")
    if args.plan:
        return _print_plan(sweep, args.json)
    if args.register and not sweep.log_models:
        raise HeadroomInputError("--register: the sweep file sets log_models: false, so there is no model to register")
    _check_tracking_uri(args.tracking_uri or sweep.tracking_uri or DEFAULT_TRACKING_URI)
    storage = args.storage or sweep.storage
    if storage and "://" not in storage:
        check_writable(storage, "--storage")
    check_writable(str(report_dir(sweep.name)), "the sweep's report directory")  # written when the sweep ends
    if args.simulate_gpus and (args.address or os.environ.get("RAY_ADDRESS")):
        raise HeadroomInputError("--simulate-gpus starts a local Ray; to simulate GPUs on a cluster, start its nodes "
                                 "with `ray start --num-gpus N` and HEADROOM_SIMULATED_GPUS=1 in their environment")
    ddp = [s for s, r in ((s, sweep.resources_for(s)) for s in sweep.scales or {}) if r.workers > 1 and r.gpu]
    if args.simulate_gpus and ddp:
        raise HeadroomInputError(f"--simulate-gpus: scale {ddp[0]} trains data-parallel on GPUs (workers > 1), "
                                 "which needs NCCL on real GPUs; simulate with workers: 1")
    return run_sweep(sweep, args.file, text, resume=args.resume, address=args.address, tracking_uri=args.tracking_uri,
                     storage=args.storage, progress=not args.quiet, register=args.register,
                     simulate_gpus=args.simulate_gpus)


def _print_plan(sweep, as_json: bool) -> int:
    """`headroom sweep FILE --plan [--json]`: the rows of orchestration.design.preflight, before any data is read."""
    _quiet_frameworks()
    if sweep.pretrained is not None:  # the checkpoint's own model, pruned: no architecture of ours to build
        info = checkpoint_info(sweep.pretrained.checkpoint)
        units = pretrained_units(sweep, sweep.families[0] if sweep.family else info.family, "plan",
                                 info.layer_heads, "plan")
        if as_json:
            print(json.dumps([{"stage": u.stage, "arm": u.arm, "name": u.name, "heads": info.layer_heads,
                               "method": u.method, "ratio": u.ratio, "scope": u.scope, "seed": u.seed}
                              for u in units], indent=1))
        else:
            print(f"pretrained sweep: {len(units)} prune unit(s) of {info.model_dir} ({info.model_type}, heads "
                  f"{info.layer_heads}); nothing is trained from scratch\n" + "\n".join(u.name for u in units))
        return 0
    vocab, how = planned_vocab_size(sweep.data)
    rows = plan_rows(build_plan(sweep, "plan", vocab))
    if as_json:
        print(json.dumps([r.to_json() for r in rows], indent=1))
    else:
        print("\n".join(x for x in (format_table(rows, f"{vocab} ({how})"), packing_note(sweep, rows),
                                     compute_note(rows)) if x))
    return 0


def cmd_report(args) -> int:
    _check_tracking_uri(args.tracking_uri or DEFAULT_TRACKING_URI)  # the path as given, before it is resolved
    uri = resolve_tracking_uri(args.tracking_uri)
    out = (check_writable(args.out) if args.out
           else check_writable(str(report_dir(args.sweep)), f"--sweep {args.sweep}: its report directory"))
    out, rep = write_report(uri, args.sweep, out)
    print(headline_table(rep))
    print(f"report: {out / 'report.html'} (also report.md, verdict.json; logged to MLflow run {rep.data.parent_id})")
    if rep.data.missing:
        print(f"headroom: partial report, {len(rep.data.missing)} planned unit(s) missing: "
              + ", ".join(rep.data.missing[:10]) + (" ..." if len(rep.data.missing) > 10 else ""), file=sys.stderr)
    return 0


def main(argv: list[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
        return args.func(args)
    except HeadroomInputError as e:
        print(f"headroom: error: {str(e).splitlines()[0] if str(e) else 'bad input'}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        print("headroom: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `headroom sweep FILE --plan | head`: the reader has what it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())
