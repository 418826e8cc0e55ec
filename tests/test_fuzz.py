"""No input ends in a traceback: a property-based fuzzer (hypothesis, derandomised and bounded) over every shipped
sweep file — mutated in structure (wrong types, out-of-range and non-finite numbers, unknown keys, structures where
scalars belong and the reverse, empty and huge lists) and in text (duplicated keys, deep nesting, aliases, keys
that are lists, garbage) — and over the CLI's flags, paths and checkpoints. For each input, run in-process as
`headroom` runs it: exit 0 with a valid plan, or exit 2 with one line on stderr; never an exception; nothing
created (no mlflow.db, runs, reports, cache entries or partial output directories). The figures (inputs tried,
refused, accepted) are printed, and README's reliability section states them."""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import shutil
import tempfile
from collections import Counter
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = sorted((ROOT / "sweeps").glob("*.yaml"))
FIGURES: Counter = Counter()
FUZZ = settings(deadline=None, derandomize=True, database=None, print_blob=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                                       HealthCheck.data_too_large])


def _tree(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")} if root.exists() else set()


def call(argv: list[str], cwd: Path, keep: tuple[Path, ...] = ()) -> tuple[int, str, str]:
    """`headroom ARGV` in this process, in `cwd`: (exit status, stdout, stderr). Any exception escapes (a test
    failure with its traceback: the defect under test); afterwards nothing is new in `cwd`, in HEADROOM_CACHE or in
    `keep`, unless the command succeeded."""
    from orchestration.cli import main

    cache = Path(os.environ["HEADROOM_CACHE"])
    before = {d: _tree(d) for d in (cwd, cache, *keep)}
    out, err = io.StringIO(), io.StringIO()
    old = os.getcwd()
    os.chdir(cwd)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                rc = main(argv)
            except SystemExit as e:  # argparse's --help / --version
                rc = e.code if isinstance(e.code, int) else 2
    finally:
        os.chdir(old)
    if rc != 0:
        for d, was in before.items():
            assert _tree(d) == was, f"{argv}: exit {rc} left {sorted(_tree(d) - was)[:5]} in {d}"
    return rc, out.getvalue(), err.getvalue()


def check_outcome(rc: int, out: str, err: str, what: str, plan_json: bool = False) -> str:
    """The contract: exit 0 (with a plan that parses, for `--plan --json`) or exit 2 with exactly one line on
    stderr that says it is headroom's error. Returns "accepted" or "refused"."""
    if rc == 0:
        if plan_json:
            rows = json.loads(out)
            assert isinstance(rows, list) and rows and all("name" in r and "stage" in r for r in rows), what
        return "accepted"
    lines = err.strip().splitlines()
    assert rc == 2, f"{what}: exit {rc}, stderr {err[-1500:]}"
    assert len(lines) == 1 and lines[0].startswith("headroom: error: "), f"{what}: stderr {err[-1500:]!r}"
    return "refused"


# ------------------------------------------------------------------------------------------------ sweep files

def _paths(node, at=()) -> list[tuple]:
    """Every path into a parsed sweep file: mapping keys and list indices, the document itself first."""
    out = [at]
    if isinstance(node, dict):
        for k, v in node.items():
            out += _paths(v, (*at, k))
    elif isinstance(node, list):
        for i, v in enumerate(node[:4]):
            out += _paths(v, (*at, i))
    return out


def _get(doc, path):
    for p in path:
        doc = doc[p]
    return doc


def _set(doc, path, value):
    if not path:
        return value
    _get(doc, path[:-1])[path[-1]] = value
    return doc


HUGE = 2 ** 70
bad_values = st.one_of(
    st.none(), st.booleans(),
    st.integers(-HUGE, HUGE), st.sampled_from([0, -1, 1, 2 ** 31, 2 ** 53 + 1, 2 ** 63, HUGE]),
    st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([float("nan"), float("inf"), -0.0, 1e308, 5e-324]),
    st.text(max_size=12), st.sampled_from(["", "none", "null", "*", "1e3", "0x10", "~", "yes", "../../etc/passwd"]),
    st.lists(st.integers(-5, 5), max_size=4), st.just([]), st.just(list(range(3000))),
    st.dictionaries(st.text(max_size=4), st.integers(), max_size=3), st.just({}),
)


@st.composite
def mutated_sweep(draw) -> tuple[str, str]:
    """(what was done, the text of a shipped sweep file mutated in structure)."""
    src = draw(st.sampled_from(SHIPPED))
    doc = yaml.safe_load(src.read_text())
    what = [src.name]
    for _ in range(draw(st.integers(1, 3))):
        paths = _paths(doc)
        path = draw(st.sampled_from(paths))
        kind = draw(st.sampled_from(["value", "delete", "unknown", "wrap", "unwrap"]))
        node = _get(doc, path) if path else doc
        if kind == "delete" and path:
            del _get(doc, path[:-1])[path[-1]]
        elif kind == "unknown" and isinstance(node, dict):
            node[draw(st.sampled_from(["seedz", "prune_", "Scales", "x", "1"]))] = draw(bad_values)
        elif kind == "wrap":
            doc = _set(doc, path, [node])
        elif kind == "unwrap" and isinstance(node, (list, dict)) and node:
            doc = _set(doc, path, next(iter(node.values())) if isinstance(node, dict) else node[0])
        else:
            doc = _set(doc, path, draw(bad_values))
        what.append(f"{kind} {'.'.join(map(str, path)) or '<doc>'}")
    return "; ".join(what), yaml.safe_dump(doc, sort_keys=False, allow_unicode=True)


def _flow(v) -> str:
    text = yaml.safe_dump(v, default_flow_style=True, allow_unicode=True, width=10 ** 9).strip()
    return text.removesuffix("...").strip()


@st.composite
def mangled_text(draw) -> tuple[str, str | bytes]:
    """(what was done, a shipped sweep file mangled as text: what no parsed document can express)."""
    src = draw(st.sampled_from(SHIPPED))
    doc = yaml.safe_load(src.read_text())
    keys = list(doc)
    lines = [f"{k}: {_flow(v)}" for k, v in doc.items()]
    i = draw(st.integers(0, len(keys) - 1))
    kind = draw(st.sampled_from(["duplicate", "deep", "alias", "bomb", "list_key", "map_key", "garbage", "bytes",
                                 "empty", "truncate", "tab", "tagged", "nested_duplicate"]))
    if kind == "duplicate":
        lines.append(lines[i])
    elif kind == "deep":
        d = draw(st.sampled_from([30, 300, 3000, 30000]))
        opener = draw(st.sampled_from(["[", "{a: "]))
        lines[i] = f"{keys[i]}: " + opener * d + ("]" if opener == "[" else "}") * d
    elif kind == "alias":
        j = draw(st.integers(0, len(keys) - 1))
        lines[i] = f"{keys[i]}: &anchor {_flow(doc[keys[i]])}"
        if j > i:
            lines[j] = f"{keys[j]}: *anchor"
    elif kind == "bomb":  # nine levels of nine references: 9^9 leaves if anything walked them all
        levels = ["&l0 [0, 0, 0, 0, 0, 0, 0, 0, 0]"] + [
            f"&l{n} [{', '.join([f'*l{n - 1}'] * 9)}]" for n in range(1, 9)]
        lines[i] = f"{keys[i]}: [{', '.join(levels)}]"
    elif kind == "list_key":
        lines.append("? [a, b]\n: 1")
    elif kind == "map_key":
        lines.append(f"? {{{keys[i]}: 1}}\n: 2")
    elif kind == "garbage":
        return f"{src.name}: garbage", draw(st.text(max_size=200))
    elif kind == "bytes":
        return f"{src.name}: bytes", draw(st.binary(max_size=200))
    elif kind == "empty":
        return f"{src.name}: empty", ""
    elif kind == "truncate":
        text = src.read_text()
        return f"{src.name}: truncated", text[:draw(st.integers(0, len(text)))]
    elif kind == "tab":
        lines[i] = "\t" + lines[i]
    elif kind == "nested_duplicate":  # a key twice inside a mapping below the top level
        nested = [k for k, v in doc.items() if isinstance(v, dict) and v]
        if nested:
            k = draw(st.sampled_from(nested))
            inner = list(doc[k].items())
            first = f"{inner[0][0]}: {_flow(inner[0][1])}"
            rest = ", ".join(f"{a}: {_flow(b)}" for a, b in inner)
            lines[keys.index(k)] = f"{k}: {{{first}, {rest}}}"
            i = keys.index(k)
    elif kind == "tagged":  # a value whose tag or form names a type it cannot be read as, or none safe_load knows
        lines[i] = f"{keys[i]}: " + draw(st.sampled_from([
            "!!int abc", "!!float x", "!!timestamp x", "2020-13-45", "2020-02-30 25:61:00", "!!bool maybe",
            "!!map 1", "!!seq 1", "!!binary '@@'", "!!python/object:os.system x", "!custom 1", "9" * 5000,
            "!!float 1e999", "0o999", "!!set {a: 1}", "!!omap [a]"]))
    return f"{src.name}: {kind} {keys[i]}", "\n".join(lines) + "\n"


def _plan(text: str | bytes, what: str) -> str:
    with tempfile.TemporaryDirectory() as d:
        f = Path(d) / "sweep.yaml"
        f.write_bytes(text) if isinstance(text, bytes) else f.write_text(text)
        rc, out, err = call(["sweep", str(f), "--plan", "--json"], Path(d), keep=(ROOT / "sweeps",))
        assert sorted(os.listdir(d)) == ["sweep.yaml"], (what, os.listdir(d))
    return check_outcome(rc, out, err, what, plan_json=True)


def test_every_shipped_sweep_plans(cache_dir):
    """The fuzzer's seeds: each shipped sweep file as it is plans (exit 0), or is refused for want of what it
    names (the pretrained sweep's checkpoint directory) in one line."""
    for f in SHIPPED:
        outcome = _plan(f.read_text(), f.name)
        assert outcome == "accepted" or f.name == "pretrained.yaml", f.name


@settings(FUZZ, max_examples=260)
@given(mutated_sweep())
def test_mutated_sweep_files_exit_0_or_2_in_one_line(cache_dir, case):
    what, text = case
    FIGURES["sweep structure", _plan(text, what)] += 1


@settings(FUZZ, max_examples=140)
@given(mangled_text())
def test_mangled_sweep_text_exits_0_or_2_in_one_line(cache_dir, case):
    what, text = case
    FIGURES["sweep text", _plan(text, what)] += 1


# ------------------------------------------------------------------------------------------------ flags, paths

def _options(command: str) -> list[argparse.Action]:
    from orchestration.cli import build_parser

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return [a for a in sub.choices[command]._actions if not isinstance(a, argparse._HelpAction)]


@pytest.fixture(scope="module")
def inputs(tmp_path_factory, xs_decoder_run):
    """Paths the flags are drawn from: a file, a non-empty directory, and damaged copies of the shared trained
    run (weights truncated, or bit-flipped; config.json not JSON, of another shape, or of absurd size)."""
    d = tmp_path_factory.mktemp("fuzz-inputs")
    (d / "a-file").write_text("not a directory\n")
    (d / "full").mkdir()
    (d / "full" / "x").write_text("x")
    damaged = {}

    def copy(name, edit):
        p = d / name
        shutil.copytree(xs_decoder_run, p)
        edit(p / "model")
        damaged[name] = p

    weights = "model.safetensors"
    copy("truncated", lambda m: os.truncate(m / weights, (m / weights).stat().st_size // 3))
    copy("header", lambda m: os.truncate(m / weights, 5))

    def flip(m):
        b = bytearray((m / weights).read_bytes())
        b[8:40] = b"\xff" * 32  # the header's JSON
        (m / weights).write_bytes(bytes(b))

    copy("flipped", flip)
    copy("config-not-json", lambda m: (m / "config.json").write_text("{not json"))

    def reshape(m, **change):
        cfg = json.loads((m / "config.json").read_text())
        cfg.update(change)
        if "headroom" in cfg and "heads" in change:
            for layer in cfg["headroom"]["layers"]:
                layer["heads"] = change["heads"]
        cfg.pop("heads", None)
        (m / "config.json").write_text(json.dumps(cfg))

    copy("other-shape", lambda m: reshape(m, hidden_size=128, heads=3))
    copy("absurd", lambda m: reshape(m, hidden_size=2 ** 20, intermediate_size=2 ** 24, num_hidden_layers=4096))
    copy("no-weights", lambda m: (m / weights).unlink())
    copy("config-a-list", lambda m: (m / "config.json").write_text("[1, 2]"))
    copy("config-not-utf8", lambda m: (m / "config.json").write_bytes(b"\xff\xfe{\"model_type\": \"llama\"}"))

    def edit_config(m, edit):
        cfg = json.loads((m / "config.json").read_text())
        edit(cfg)
        (m / "config.json").write_text(json.dumps(cfg))

    copy("headroom-block-a-string", lambda m: edit_config(m, lambda c: c.update(headroom="x")))
    copy("headroom-heads-a-string",
         lambda m: edit_config(m, lambda c: c["headroom"]["layers"][0].update(heads="4")))
    copy("architectures-of-numbers", lambda m: edit_config(m, lambda c: c.update(architectures=[1])))

    def edit_run(m, edit):
        run = json.loads((m.parent / "metrics.json").read_text())
        (m.parent / "metrics.json").write_text(json.dumps(edit(run)))

    copy("metrics-a-list", lambda m: edit_run(m, lambda r: [r]))
    copy("train-config-a-string", lambda m: edit_run(m, lambda r: {**r, "train_config": "x"}))

    def index(m, weight_map):
        (m / weights).unlink()
        (m / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))

    copy("index-empty", lambda m: index(m, {}))
    copy("index-missing-shard", lambda m: index(m, {"lm_head.weight": "model-00001-of-00002.safetensors"}))
    # read by the commands that train or evaluate from the run's settings (prune, score), not by export
    copy("train-config-values",
         lambda m: edit_run(m, lambda r: {**r, "train_config": {**r["train_config"], "lr": "abc"}}))
    return {"dir": d, "damaged": damaged}


# what each damaged copy's one line must say: the check meant for it refused it, not a later accident
WHY = {"truncated": "is damaged (truncated or corrupt", "header": "more than its weights files",
       "flipped": "is damaged (truncated or corrupt", "config-not-json": "config.json is not valid JSON",
       "other-shape": "weights do not fit its recorded architecture", "absurd": "describes no model headroom can build",
       "no-weights": "no model weights", "config-a-list": "config.json holds a JSON list, not an object",
       "config-not-utf8": "config.json is not valid JSON",
       "headroom-block-a-string": "config.json's headroom block is not an object",
       "headroom-heads-a-string": "config.json's headroom.layers is not a list",
       "architectures-of-numbers": "architectures is not a list of class names",
       "metrics-a-list": "metrics.json holds a JSON list", "train-config-a-string": "train_config is not an object",
       "index-empty": "has no weight_map", "index-missing-shard": "which is not there",
       "train-config-values": "metrics.json's train_config: lr:"}
EXPORT_READS_NO_SETTINGS = {"train-config-values"}  # export copies the model; a run's training settings it ignores


def _value(draw, inputs, option: argparse.Action) -> str:
    d = inputs["dir"]
    pool = ["-1", "0", "1", "3", "0.5", "1e308", "nan", "inf", "-inf", str(2 ** 70), "abc", "", " ", "1,2",
            "/proc/headroom", "/sys/headroom", str(d / "a-file"), str(d / "a-file" / "below"), str(d / "full"),
            str(d / "missing" / "deep"), "stdlib", "hf:nonexistent", "path:/proc/headroom", "sqlite:///x.db",
            "http://127.0.0.1:9", "file:///proc/headroom", *map(str, inputs["damaged"].values())]
    if option.choices:
        pool += list(map(str, option.choices))
    return draw(st.sampled_from(pool))


@st.composite
def command_line(draw, inputs) -> list[str]:
    """A command with a random subset of its flags at random values — and one input that cannot be worked on (an
    output path nothing can be written to, a damaged checkpoint), so that no draw starts real work: every other
    flag is validated before it."""
    command = draw(st.sampled_from(["train", "prune", "score", "export", "report", "sweep"]))
    opts = _options(command)
    argv = [command]
    damaged = sorted(str(p) for n, p in inputs["damaged"].items() if n not in EXPORT_READS_NO_SETTINGS)
    bad_out = ["/proc/headroom", "/sys/headroom/x", str(inputs["dir"] / "a-file" / "x"), str(inputs["dir"] / "full")]
    for a in opts:
        if not a.option_strings:  # the positional
            argv.append(draw(st.sampled_from(damaged)) if a.dest == "checkpoint" else
                        str(draw(st.sampled_from(SHIPPED))))
            continue
        if not draw(st.booleans()) and not a.required:
            continue
        flag = draw(st.sampled_from(a.option_strings))
        if a.nargs == 0:
            argv.append(flag)
        elif command == "train" and a.dest == "out":
            argv += [flag, draw(st.sampled_from(bad_out))]
        else:
            argv += [flag, _value(draw, inputs, a)]
    if command == "sweep" and "--plan" not in argv:
        argv += ["--storage", "/proc/headroom"]  # checked after every other flag: no sweep starts
    if command == "report" and "--tracking-uri" not in argv:
        argv += ["--tracking-uri", "sqlite:///no-such.db"]
    return argv


@settings(FUZZ, max_examples=220)
@given(st.data())
def test_flags_paths_and_checkpoints_exit_0_or_2_in_one_line(cache_dir, inputs, data):
    argv = data.draw(command_line(inputs))
    with tempfile.TemporaryDirectory() as d:
        rc, out, err = call(argv, Path(d), keep=(inputs["dir"],))
        assert rc != 0 or (argv[0] == "sweep" and "--plan" in argv), f"{argv}: did real work"
        assert not os.listdir(d), (argv, os.listdir(d))
    FIGURES["flags", check_outcome(rc, out, err, " ".join(argv), plan_json="--json" in argv and "--plan" in argv)] \
        += 1


def test_damaged_checkpoints_are_refused_by_every_command_that_reads_one(cache_dir, inputs, tmp_path):
    """Each damaged copy of the trained run: `prune`, `score` and `export` refuse it in one line, exit 2, and write
    nothing (the shape check refuses the absurd config before allocating it)."""
    for name, ckpt in inputs["damaged"].items():
        for argv in (["prune", str(ckpt), "--method", "magnitude", "--ratio", "0.5", "--finetune-steps", "0",
                      "--out", str(tmp_path / "p"), "--quiet"],
                     ["score", str(ckpt), "--method", "magnitude", "--out", str(tmp_path / "s.json")],
                     ["export", str(ckpt), "--out", str(tmp_path / "e")]):
            if argv[0] == "export" and name in EXPORT_READS_NO_SETTINGS:
                continue
            rc, out, err = call(argv, tmp_path, keep=(inputs["dir"],))
            assert check_outcome(rc, out, err, f"{argv[0]} {name}") == "refused", (name, argv[0])
            assert str(ckpt) in err or name in err, err
            assert WHY[name] in err, (name, argv[0], err)
            FIGURES["checkpoints", "refused"] += 1
    assert not list(tmp_path.iterdir())


# ------------------------------------------------------------------------------------------------ --plan bounded

def test_plan_is_bounded_and_counts_what_it_refuses(cache_dir, tmp_path):
    """`--plan` answers within seconds for any accepted sweep: one past `MAX_UNITS` units is refused in one line
    with its count — checked against the units the plan builds for a few seeds (an upper bound, equal but for
    the first seed's half-budget run) — and one whose single seed already plans too many keys is refused after
    at most 2 x `MAX_UNITS` keys' work."""
    import time

    from orchestration.design.plan import MAX_UNITS, build_plan, check_plan_size
    from orchestration.design.spec import parse_sweep

    doc = yaml.safe_load((ROOT / "sweeps" / "quickstart.yaml").read_text())
    few = parse_sweep(yaml.safe_dump({**doc, "seeds": [0, 1, 2]}))
    p = build_plan(few, "plan")
    built = len(p.trained) + len(p.pruned) + len(p.taught)
    per_seed = check_plan_size(few) // 3
    assert built <= 3 * per_seed <= built + 2 * sum(u.arm == "dense_half" for u in p.trained)
    for seeds, ratios in ((list(range(MAX_UNITS)), doc["prune"]["ratios"]),
                          ([0], [round(i / 8000, 6) for i in range(1, 6000)])):
        f = tmp_path / "big.yaml"
        f.write_text(yaml.safe_dump({**doc, "seeds": seeds, "prune": {**doc["prune"], "ratios": ratios}}))
        t = time.perf_counter()
        rc, out, err = call(["sweep", str(f), "--plan"], tmp_path)
        took = time.perf_counter() - t
        assert check_outcome(rc, out, err, "big") == "refused" and f"{MAX_UNITS}" in err, err
        assert took < 60, took  # bounded by MAX_UNITS units' planning, not by the sweep's size
        if len(seeds) > 1:
            assert f"{per_seed * len(seeds)} units ({per_seed} per seed × {len(seeds)} seeds)" in err, err
        else:
            assert "for one seed alone" in err, err


def test_plan_bound_covers_every_shipped_sweep(cache_dir):
    """`check_plan_size` is an upper bound on what each shipped sweep runs, counted independently here from the
    whole plan: every unit it builds for all seeds, each global prune's controls as if none were shared (at run
    time they are decided by the heads it keeps, and a shared one is planned once), and every learning-rate
    search's `trials + extend` candidates. The bound is tight within the first seed's half-budget runs; a limit
    one below it refuses the sweep, naming the search candidates where there are any."""
    from lightning_modules.declarations.config import HeadroomInputError
    from orchestration.design.plan import build_plan, check_plan_size
    from orchestration.design.spec import load_sweep

    seen_global = seen_search = False
    for f in sorted((ROOT / "sweeps").glob("*.yaml")):
        if "pretrained" in yaml.safe_load(f.read_text()):  # no units of its own to bound: one checkpoint's prunes
            continue
        sweep, _ = load_sweep(f)
        p = build_plan(sweep, "plan")
        units = len(p.trained) + len(p.pruned) + len(p.taught)
        controls = sum(len(p.controls_of(u, [1] * u.model.n_layers)) for u in p.pruned if u.scope == "global")
        search = len(p.lr_search) * (sweep.lr.search.trials + sweep.lr.search.extend) if p.lr_search else 0
        seen_global |= controls > 0
        seen_search |= search > 0
        bound = check_plan_size(sweep)
        half = sum(u.arm == "dense_half" for u in p.trained)
        assert units + controls + search <= bound <= units + controls + search + (len(sweep.seeds) - 1) * half, f
        with pytest.raises(HeadroomInputError) as e:
            check_plan_size(sweep, limit=bound - 1)
        assert f"up to {bound} units" in str(e.value), (f, str(e.value))
        assert ("learning-rate search candidates" in str(e.value)) == (search > 0), (f, str(e.value))
    assert seen_global and seen_search  # the shipped sweeps exercise both terms of the bound


def test_zz_figures(capsys):
    """The fuzzer's figures for README (inputs tried, refused, accepted), printed past pytest's capture; run with
    the module (it reads what the tests above counted): every suite ran and tried inputs."""
    suites = ("sweep structure", "sweep text", "flags", "checkpoints")
    with capsys.disabled():
        for s in suites:
            tried = FIGURES[s, "accepted"] + FIGURES[s, "refused"]
            print(f"\nfuzz {s}: {tried} inputs tried, {FIGURES[s, 'refused']} refused (exit 2, one line), "
                  f"{FIGURES[s, 'accepted']} accepted (exit 0)")
    assert all(FIGURES[s, "accepted"] + FIGURES[s, "refused"] > 0 for s in suites), dict(FIGURES)
