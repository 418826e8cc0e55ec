"""`headroom train` as a user runs it: bad input gets one line and exit 2 before any framework loads and
nothing is written; a good run writes a complete output directory."""

import json
import os
import subprocess
import sys

from conftest import ROOT

# Runs the CLI in-process in a fresh interpreter and fails if torch was imported: bad input must be caught first.
NO_TORCH = (
    "import sys; from orchestration.cli import main; rc = main(sys.argv[1:]); "
    "assert 'torch' not in sys.modules and 'ray' not in sys.modules, 'framework imported'; sys.exit(rc)"
)


def _bad_inputs(tmp):
    (tmp / "empty").mkdir()
    for i in range(3):
        (tmp / "empty" / f"e{i}.txt").write_text("")
    (tmp / "binary").mkdir()
    for i in range(3):
        (tmp / "binary" / f"b{i}.txt").write_text("text\n" * 50)
    (tmp / "binary" / "b1.txt").write_bytes(bytes(range(256)) * 40)  # NUL bytes among the text files
    (tmp / "busy").mkdir()
    (tmp / "busy" / "file").write_text("x")
    return {
        "unknown scale": ["--scale", "xxl"],
        "unknown family": ["--family", "seq2seq"],
        "heads too many for a wide head": ["--heads", "40", "--head-dim", "auto"],
        "seq len beyond max_seq_len": ["--seq-len", "1000"],
        "missing data path": ["--data", f"path:{tmp}/nowhere/*.txt"],
        "empty corpus": ["--data", f"path:{tmp}/empty/*.txt"],
        "binary file in the corpus": ["--data", f"path:{tmp}/binary/*.txt"],
        "unknown data source": ["--data", "ftp://example"],
        "missing hf directory": ["--data", f"hf:{tmp}/no-dataset"],
        "missing tokenizer directory": ["--tokenizer", f"pretrained:{tmp}/no-tokenizer"],
        "zero steps": ["--steps", "0"],
        "non-integer heads": ["--heads", "four"],
        "unknown flag": ["--bogus"],
        "out dir not empty": ["--out", str(tmp / "busy")],
    }


def test_bad_input_one_line_exit_2_nothing_started(tmp_path):
    cases = _bad_inputs(tmp_path)
    for name, args in cases.items():
        out = tmp_path / f"out-{abs(hash(name))}"
        argv = ["train", "--out", str(out), *args] if "--out" not in args else ["train", *args]
        r = subprocess.run([sys.executable, "-c", NO_TORCH, *argv], cwd=ROOT, capture_output=True, text=True,
                           timeout=120)
        lines = r.stderr.strip().splitlines()
        assert r.returncode == 2, (name, r.returncode, r.stderr[-1500:])
        assert len(lines) == 1 and lines[0].startswith("headroom: error:"), (name, r.stderr)
        assert not out.exists(), name
        assert not list(tmp_path.glob(".out-*.partial-*")), name
    assert (tmp_path / "busy" / "file").read_text() == "x"


def test_missing_command_and_missing_out(tmp_path):
    for argv in ([], ["train"]):
        r = subprocess.run([sys.executable, "-c", NO_TORCH, *argv], cwd=ROOT, capture_output=True, text=True)
        assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_console_script_help():
    exe = os.path.join(os.path.dirname(sys.executable), "headroom")
    r = subprocess.run([exe, "train", "--help"], capture_output=True, text=True)
    assert r.returncode == 0 and "--heads" in r.stdout and "--head-dim" in r.stdout


def test_train_writes_a_complete_run(xs_decoder_run, xs_decoder_metrics):
    assert sorted(p.name for p in xs_decoder_run.iterdir()) == ["last.ckpt", "metrics.json", "model"]
    m = xs_decoder_metrics
    for key in ("final", "tokens_per_s", "params", "flops_per_token", "corpus_hash", "steps", "model_config"):
        assert key in m, key
    assert set(m["final"]) == {"val", "id", "shift"}
    assert all(v["loss"] > 0 and v["ppl"] > 1 for v in m["final"].values())
    # no staging directories left beside it
    assert not list(xs_decoder_run.parent.glob(".run.partial-*"))


def test_scratch_e_and_wide_architectures_train(tmp_path):
    """--heads keeps the preset head_dim (Scratch-E); --head-dim auto is the wide control, also where the heads do
    not divide d_model (6 heads of d_model 64: 10 dimensions each), for both families."""
    cases = ((["--heads", "4"], 4, 8), (["--heads", "4", "--head-dim", "auto"], 4, 16),
             (["--heads", "6", "--head-dim", "auto"], 6, 10),
             (["--heads", "6", "--head-dim", "auto", "--family", "encoder"], 6, 10))
    from orchestration.cli import main

    for args, heads, hd in cases:
        out = tmp_path / f"h{heads}-{hd}-{len(args)}"
        # the CLI in this process (test_train_writes_a_complete_run runs it as a user would)
        assert main(["train", "--scale", "xs", "--steps", "3", "--val-every", "3", "--eval-batches", "1", "--quiet",
                     "--out", str(out), *args]) == 0
        cfg = json.loads((out / "metrics.json").read_text())["model_config"]
        assert (cfg["n_heads"], cfg["head_dim"]) == (heads, hd)
        hf = json.loads((out / "model" / "config.json").read_text())
        assert hf["headroom"]["layers"][0]["heads"] == heads and hf["headroom"]["head_dim"] == hd
