"""Sweep files (`sweeps/*.yaml`) parsed once into validated objects.

Every later layer receives a `Sweep`, never a raw dict. Unknown keys are rejected and every error names its field
path (`prune.ratios[1]: must be in [0, 1)`), so `headroom sweep` fails with one line before torch or Ray is
imported. Cross-field checks (a ratio that empties a layer, a data path that matches nothing, a missing pretrained
checkpoint) run here too, for the same reason.

A sweep file, with the defaults of the fields it may leave out:

    name: quickstart                # the MLflow experiment and the reports/<name>/ folder
    family: decoder                 # or a list: [decoder, encoder]
    data: {source: stdlib}          # lightning_modules.declarations.config.DataConfig: source, shift, tokenizer, ...
    scales:                         # preset name -> its budget (absent with `pretrained`)
      xs: {steps: 300, heads: 8, overrides: {batch_size: 16, seq_len: 128, val_every: 50}}
                                    # overrides.eval_batches absent: every clean window of each eval set, up to
                                    # 2^20 tokens (lightning_modules.declarations.config.EVAL_CAP_TOKENS)
                                    # steps: [100, 300, 900]: several budgets, each its own dense run, controls
                                    # and prunes (the report's trend against tokens per parameter)
    seeds: [0, 1, 2]
    prune:
      ratios: [0.5]
      methods: [gradient, ablation, random]
      scope: [per_layer]            # per_layer | global
      schedule: [one_shot]          # one_shot | iterative (step: fraction removed per round)
      finetune_steps: 0             # recovery fine-tune F; a list ([20, 200, 1000]) is an axis: each F its own
                                    # prunes and its own Scratch-B (whose budget follows F)
      recovery: [lm]                # what the fine-tune minimises: lm (next token) | distill (KL to the dense
                                    # teacher's logits); [lm, distill]: both, each with its own Scratch-B
      distill: {temperature: 1.0, lm_weight: 0.0}   # distill's settings (lightning_modules/training/distill.py)
      # finetune_lr: 3.0e-4         # a number fixes the fine-tune's rate; absent, it is chosen on val from:
      finetune_lr_grid: [0.03, 0.1, 0.3]    # multiples of the dense model's learning rate
      # curve_batches: 4            # batches per point of the mask-only curve (absent: the eval budget)
      tolerance: 0.05               # "prunable": pruned loss before fine-tune <= dense loss x (1 + tolerance)
      at: [1.0]                     # prune timing: fractions of T at which heads go (0: at init; p < 1: the
                                    # dense run keeps a checkpoint at p·T, the pruned model trains on to T)
    controls: [scratch_e, scratch_b, wide]   # and scratch_kd: the pruned shape from scratch, distilled from
                                    # the same dense teacher for the distilled pruned arm's compute
    lr: 3.0e-3                      # or {search: {trials: 4, low: 1.0e-3, high: 1.0e-2, steps: 40}}: one search
                                    # per architecture trained from scratch; absent: the scale preset's
    probes: {every: 50, method: gradient, batches: 2, redundancy: true}   # absent: no probes
    trust: {margin: 0.05, doubling_gain: 0.05}   # the report's trust diagnostics: margin, convergence threshold
    resources: {cpu: 1, gpu: 0, workers: 1}   # per trial: cpu and gpu per worker (gpu may be fractional:
                                    # trials share a GPU); workers > 1: data-parallel through Ray Train. A scale's
                                    # own `resources` (scales: {l: {resources: {gpu: 1, workers: 4}}}) replaces
                                    # the fields it gives
    retries: 2                      # Ray retries of a failed trial (it continues from its checkpoint)
    storage: ./ray_results          # or s3://bucket/prefix; CLI --storage overrides
    tracking_uri: sqlite:///mlflow.db   # CLI --tracking-uri overrides
    log_models: true                # each prune unit's pruned model as an MLflow transformers model (off: large models)
    pretrained: {checkpoint: DIR}   # instead of scales: prune a local checkpoint only (Michel et al. style)
"""

from __future__ import annotations

import re
from pathlib import Path

import yaml
from pydantic import ValidationError

from lightning_modules.data.corpus import check_source
from lightning_modules.declarations.arms import ARMS
from lightning_modules.declarations.bounds import check_tokens
from lightning_modules.declarations.config import (
    HeadroomInputError,
    check_compatible,
    model_config_for,
    train_config_for,
)
from lightning_modules.declarations.prune_plan import check_ratio_fits
from lightning_modules.models.checkpoints import checkpoint_info

from .schema import Sweep

DEFAULT_TRACKING_URI = "sqlite:///mlflow.db"


def resolve_tracking_uri(uri: str | None) -> str:
    """The MLflow tracking URI; default `sqlite:///mlflow.db` in the working directory, made absolute (here, in
    the driver: trials run in their own working directories)."""
    uri = uri or DEFAULT_TRACKING_URI
    if uri.startswith("sqlite:///") and not uri.startswith("sqlite:////"):  # relative, or `~` (the user's home,
        return "sqlite:///" + str(Path(uri[len("sqlite:///"):]).expanduser().resolve())  # as the CLI checks it)
    if "://" not in uri:  # a plain directory: MLflow's file store
        return Path(uri).expanduser().resolve().as_uri()
    return uri


def report_dir(sweep_name: str) -> Path:
    """Where a sweep's report is written unless `headroom report --out` says otherwise: reports/<sweep>/ in the
    working directory."""
    return Path("reports", sweep_name)


# ------------------------------------------------------------------------------------------------ loading


class _UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML keeps the last of two equal keys silently; a sweep file with `seeds:` twice is a mistake."""


def _mapping(loader: _UniqueKeyLoader, node, deep=False):
    seen = set()
    for key_node, _ in node.value:
        if not isinstance(key_node, yaml.ScalarNode):  # `? [a, b]` or `? {a: 1}`: no field is named so
            raise yaml.constructor.ConstructorError(None, None, "a key must be a plain name, not a list or mapping",
                                                    key_node.start_mark)
        key = loader.construct_object(key_node, deep=deep)
        if key in seen:
            raise yaml.constructor.ConstructorError(None, None, f"duplicate key {key!r}", key_node.start_mark)
        seen.add(key)
    return yaml.SafeLoader.construct_mapping(loader, node, deep)


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping)
# YAML 1.1 reads 3e-3 (no dot) as a string; sweep authors mean a number
_UniqueKeyLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"),
)


def _path(loc: tuple) -> str:
    out = ""
    for part in loc:
        if part == "[key]":
            continue
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _message(err: dict) -> str:
    kind = err.get("type")
    if kind == "extra_forbidden":
        return "unknown key"
    if kind == "missing":
        return "required"
    return err.get("msg", "invalid").removeprefix("Value error, ")


def format_error(e: ValidationError) -> str:
    """One line for the first error; an unknown key comes first (a misspelt key also makes its field missing)."""
    errors = e.errors()
    err = next((x for x in errors if x.get("type") == "extra_forbidden"), errors[0])
    path = _path(tuple(err.get("loc", ())))
    return f"{path}: {_message(err)}" if path else _message(err)


_TOO_DEEP = "nested too deeply to read (no sweep field nests more than a few levels)"


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0][:120] if text else e.__class__.__name__


def parse_sweep(text: str, source: str = "sweep") -> Sweep:
    """YAML text → a validated Sweep (schema and cross-field checks). Raises HeadroomInputError with one line."""
    try:
        raw = yaml.load(text, Loader=_UniqueKeyLoader)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None) or getattr(e, "context_mark", None)
        where = f"line {mark.line + 1}: " if mark is not None else ""
        what = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise HeadroomInputError(f"{source}: {where}{what}") from None
    except RecursionError:  # the parser recurses once per level: a file nested that deep is no sweep
        raise HeadroomInputError(f"{source}: {_TOO_DEEP}") from None
    except (ValueError, TypeError, KeyError, AttributeError, IndexError, OverflowError) as e:
        # a scalar PyYAML resolves and then cannot build: `2020-13-45`, `!!int abc`, `!!bool maybe`, an integer
        # past Python's 4,300-digit limit — its constructor raises without a line number
        raise HeadroomInputError(f"{source}: a value cannot be read as the type its form or tag names "
                                 f"({_first_line(e)})") from None
    if not isinstance(raw, dict):
        raise HeadroomInputError(f"{source}: expected a mapping of sweep fields at the top level")
    try:
        sweep = Sweep.model_validate(raw)
    except ValidationError as e:
        raise HeadroomInputError(f"{source}: {format_error(e)}") from None
    except RecursionError:
        raise HeadroomInputError(f"{source}: {_TOO_DEEP}") from None
    try:
        check_sweep(sweep)
    except HeadroomInputError as e:
        raise HeadroomInputError(f"{source}: {e}") from None
    return sweep


def load_sweep(path: str | Path) -> tuple[Sweep, str]:
    """Read and validate a sweep file; returns (sweep, file text)."""
    try:
        p = Path(path).expanduser()
        found = p.is_file()
    except (OSError, ValueError, RuntimeError) as e:  # a NUL byte, a name too long, `~nosuchuser`, no permission
        raise HeadroomInputError(f"sweep file {str(path)[:80]!r}: not a readable path ({e.__class__.__name__})") from None
    if not found:
        raise HeadroomInputError(f"sweep file {path}: no such file")
    try:
        text = p.read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise HeadroomInputError(f"sweep file {path}: cannot read it ({e.__class__.__name__})") from None
    return parse_sweep(text, source=str(path)), text


def _check_ratios(s: Sweep, layer_heads: list[int], what: str) -> None:
    for i, r in enumerate(s.prune.ratios):
        for scope in s.prune.scope:
            try:
                check_ratio_fits(layer_heads, r, scope)
            except HeadroomInputError as e:
                raise HeadroomInputError(f"prune.ratios[{i}]: {e} of {what}") from None


def _check_resources(s: Sweep, scale: str, batch_size: int) -> None:
    where = f"scales.{scale}.resources" if s.scales[scale].resources is not None else "resources"
    try:
        r = s.resources_for(scale)
    except ValidationError as e:
        raise HeadroomInputError(f"scales.{scale}.resources: {_message(e.errors()[0])}") from None
    if batch_size % r.workers:
        raise HeadroomInputError(f"{where}.workers: scale {scale}'s batch_size {batch_size} is not divisible by "
                                 f"{r.workers} workers (each takes an equal share of every batch)")


def check_sweep(s: Sweep) -> None:
    """What one field cannot say alone. Raises HeadroomInputError('field.path: message')."""
    if s.pretrained is not None:
        if s.prune.at != [1.0]:
            raise HeadroomInputError("prune.at: a pretrained checkpoint has no training history to prune early in; "
                                     "remove prune.at")
        for field, bad in (("scales", s.scales), ("controls", s.controls), ("lr", s.lr), ("family", s.family),
                           ("probes", s.probes)):
            if bad:
                raise HeadroomInputError(f"{field}: a pretrained sweep runs the prune stage only; remove {field}")
        try:
            info = checkpoint_info(s.pretrained.checkpoint)
        except HeadroomInputError as e:
            raise HeadroomInputError(f"pretrained.checkpoint: {e}") from None
        _check_ratios(s, info.layer_heads, "the checkpoint")
        if any(s.prune.finetune_steps) and s.prune.finetune_lr is None:
            raise HeadroomInputError("prune.finetune_lr: required to fine-tune a pretrained checkpoint (the grid is "
                                     "relative to a learning rate this sweep did not train with)")
        if info.max_positions and s.pretrained.seq_len > info.max_positions:
            raise HeadroomInputError(f"pretrained.seq_len: {s.pretrained.seq_len} exceeds the checkpoint's "
                                     f"maximum {info.max_positions}")
    elif not s.scales:
        raise HeadroomInputError("scales: required (or name a pretrained checkpoint)")
    if "distill" in s.prune.recovery and not any(s.every_finetune_steps()):
        raise HeadroomInputError("prune.recovery: distill fine-tunes towards the dense teacher; give a recovery "
                                 "budget (prune.finetune_steps > 0)")
    if "distill" in s.prune.recovery and any(a < 1 for a in s.prune.at):
        raise HeadroomInputError("prune.at: a prune at p < 1 recovering by distill would learn from the dense model "
                                 "at T while its compute counts only p·T of the dense training; use recovery lm "
                                 "with prune.at < 1, or distill with prune.at [1.0]")
    for i, m in enumerate(s.prune.recover_methods or []):
        if m not in s.prune.methods:
            raise HeadroomInputError(f"prune.recover_methods[{i}]: {m} is not one of prune.methods")
    for name in s.controls:
        arm = ARMS[name]
        if arm.per_recovery and not set(arm.recoveries) & set(s.prune.recovery):
            raise HeadroomInputError(f"controls: {name} is matched to a recovery by "
                                     f"{' or '.join(arm.recoveries)}; add it to prune.recovery")
        if arm.teacher and not any(s.every_finetune_steps()):
            raise HeadroomInputError(f"controls: {name} matches a distilled recovery; give prune.finetune_steps > 0")
    for name, sc in (s.scales or {}).items():
        h = s.dense_heads(name)
        try:
            model = model_config_for(name, s.families[0], n_heads=h)
            for steps in sc.budgets(name):
                train = train_config_for(name, steps=steps, **sc.overrides.model_dump(exclude_none=True))
                check_compatible(model, train)
            # the recovery fine-tune and a search trial train at this scale's batch too
            own = sc.finetune_steps is not None
            check_tokens(f"scales.{name}.finetune_steps" if own else "prune.finetune_steps",
                         max(s.finetune_steps(name)), train.batch_size, train.seq_len)
            if s.lr is not None and s.lr.search is not None:
                check_tokens("lr.search.steps", s.lr.search.steps, train.batch_size, train.seq_len)
        except HeadroomInputError as e:
            raise HeadroomInputError(f"scales.{name}: {e}") from None
        except ValidationError as e:
            raise HeadroomInputError(f"scales.{name}: {format_error(e)}") from None
        except ValueError as e:  # check_tokens: it names its field
            raise HeadroomInputError(f"{e} (at scale {name})") from None
        _check_ratios(s, model.layer_heads, f"scale {name}")
        _check_resources(s, name, train.batch_size)
    if s.lr is not None and s.lr.search is not None:
        for name in s.scales or {}:
            if s.lr.search.steps > min(s.scales[name].budgets(name)):
                raise HeadroomInputError(f"lr.search.steps: {s.lr.search.steps} exceeds scale {name}'s budget")
    try:
        check_source(s.data)
    except HeadroomInputError as e:
        raise HeadroomInputError(f"data.source: {e}") from None
    if s.data.tokenizer.startswith("pretrained:") and not Path(s.data.tokenizer[11:]).is_dir():
        raise HeadroomInputError(f"data.tokenizer: {s.data.tokenizer[11:]} is not a directory")
