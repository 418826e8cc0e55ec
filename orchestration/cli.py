"""`headroom` command line. Input is validated before torch (or Ray) is imported: a bad input prints exactly one
line on stderr and exits 2, having started and written nothing."""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path

from lightning_modules.config import (
    FAMILIES,
    SCALES,
    DataConfig,
    HeadroomInputError,
    _first_error,
    check_compatible,
    model_config_for,
    train_config_for,
)
from lightning_modules.corpus import check_source

EXIT_BAD_INPUT = 2


class _Parser(argparse.ArgumentParser):
    """argparse prints usage plus an error; our contract is one line."""

    def error(self, message: str):
        raise HeadroomInputError(message)


def _positive_int(s: str) -> int:
    try:
        v = int(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {s!r}") from None
    if v <= 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {v}")
    return v


def _head_dim(s: str):
    return "auto" if s == "auto" else _positive_int(s)


def _add_train(sub) -> None:
    p = sub.add_parser("train", help="train one model at a preset scale and head count",
                       description="Train one model. --heads keeps the preset's head_dim (the Scratch-E "
                                   "architecture of a pruned model); --head-dim overrides it (auto = "
                                   "d_model // heads, the 'wide' control).")
    p.add_argument("--scale", default="xs", help=f"one of {', '.join(SCALES)} (default xs)")
    p.add_argument("--family", default="decoder", help=f"one of {', '.join(FAMILIES)} (default decoder)")
    p.add_argument("--heads", type=_positive_int, help="heads per layer (default: the scale's)")
    p.add_argument("--head-dim", type=_head_dim, help="head size, or auto for d_model // heads")
    p.add_argument("--steps", type=_positive_int)
    p.add_argument("--batch-size", type=_positive_int)
    p.add_argument("--seq-len", type=_positive_int)
    p.add_argument("--lr", type=float)
    p.add_argument("--warmup-steps", type=int)
    p.add_argument("--schedule", choices=["cosine", "linear", "constant"])
    p.add_argument("--weight-decay", type=float)
    p.add_argument("--precision", choices=["auto", "32-true", "bf16-mixed", "16-mixed"])
    p.add_argument("--val-every", type=_positive_int)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--data", default="stdlib", help="stdlib | path:GLOB | hf:NAME[:CONFIG] | mqar")
    p.add_argument("--shift", help="a second source for the shifted eval set (path:GLOB or hf:NAME)")
    p.add_argument("--tokenizer", default="byte", help="byte | bpe | pretrained:DIR")
    p.add_argument("--out", required=True, help="output directory (must not exist or be empty)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_train)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="headroom", description="Is multi-head attention over-provisioned? "
                                                  "Prune-vs-scratch experiments at several scales.")
    from importlib.metadata import PackageNotFoundError, version

    try:
        v = version("headroom")
    except PackageNotFoundError:
        v = "dev"
    parser.add_argument("--version", action="version", version=f"headroom {v}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    _add_train(sub)
    return parser


def _check_out(out: str) -> Path:
    p = Path(out).expanduser()
    if p.exists() and (not p.is_dir() or any(p.iterdir())):
        raise HeadroomInputError(f"--out {out}: exists and is not empty; choose a new directory")
    return p


def _quiet_frameworks() -> None:
    """Keep the terminal for progress and results: no framework banners, tips or deprecation chatter."""
    import logging
    import warnings

    warnings.filterwarnings("ignore", category=DeprecationWarning)
    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", message=".*LeafSpec.*")
    warnings.filterwarnings("ignore", message=".*weights_only.*")
    for name in ("pytorch_lightning", "lightning_fabric", "lightning.pytorch"):
        logging.getLogger(name).setLevel(logging.WARNING)


def cmd_train(args) -> int:
    # ---- validate everything first (no torch yet)
    model_cfg = model_config_for(args.scale, args.family, n_heads=args.heads, head_dim=args.head_dim)
    train_cfg = train_config_for(
        args.scale, steps=args.steps, batch_size=args.batch_size, seq_len=args.seq_len, lr=args.lr,
        warmup_steps=args.warmup_steps, schedule=args.schedule, weight_decay=args.weight_decay,
        precision=args.precision, seed=args.seed, val_every=args.val_every,
    )
    check_compatible(model_cfg, train_cfg)
    try:
        data_cfg = DataConfig(source=args.data, shift=args.shift, tokenizer=args.tokenizer)
    except ValueError as e:
        raise HeadroomInputError(f"--data: {_first_error(e)}") from None
    check_source(data_cfg)
    out = _check_out(args.out)

    # ---- now the frameworks
    _quiet_frameworks()
    from lightning_modules.train import set_threads, train_lm, write_run

    set_threads()
    staging = out.parent / f".{out.name}.partial-{os.getpid()}"
    try:
        result = train_lm(model_cfg, train_cfg, data_cfg, checkpoint_dir=staging / "checkpoints",
                          progress=not args.quiet)
        write_run(result, staging, staging / "checkpoints" / "last.ckpt")
        shutil.rmtree(staging / "checkpoints", ignore_errors=True)
        if out.exists():
            out.rmdir()
        os.replace(staging, out)  # complete or absent: never a half-written run under the name asked for
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    m = result.metrics
    finals = ", ".join(f"{k} {v['loss']:.4f}" for k, v in m["final"].items())
    print(f"trained {model_cfg.family} scale {args.scale}, {model_cfg.layer_heads[0]} heads x {model_cfg.head_dim}:"
          f" {m['params']:,} params, {m['steps']} steps, {m['tokens_per_s']:,.0f} tokens/s; loss {finals}")
    print(f"wrote {out}/ (model/, last.ckpt, metrics.json)")
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


if __name__ == "__main__":
    sys.exit(main())
