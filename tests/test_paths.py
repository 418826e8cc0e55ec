"""Paths a user names: what `orchestration.cli.paths` refuses before any work (one line each, checked against
the system's own limits and the filesystem as it is), what `made_parents` leaves behind when a command fails
(nothing it created), where `~` in a tracking URI points, and `score`'s heatmap path."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from lightning_modules.declarations.config import HeadroomInputError
from orchestration.cli.paths import check_writable, made_parents, user_path
from orchestration.design.spec import resolve_tracking_uri


@pytest.mark.parametrize("path, says", [
    ("", "an empty path"), ("   ", "an empty path"), ("a\0b", "NUL byte"),
    ("~no-such-user-headroom/x", "names no user"),
    ("x" * (os.pathconf("/", "PC_NAME_MAX") + 1), "longer than"),
    ("/" + "/".join(["d" * 200] * (os.pathconf("/", "PC_PATH_MAX") // 200 + 1)), "longer than"),
])
def test_user_path_refuses_what_is_no_path(path, says):
    with pytest.raises(HeadroomInputError) as e:
        user_path(path, "--out")
    assert says in str(e.value) and "\n" not in str(e.value)


def test_user_path_expands_home():
    assert user_path("~/x", "--out") == Path(os.path.expanduser("~")) / "x"


def test_check_writable_against_the_filesystem(tmp_path):
    (tmp_path / "f").write_text("x")
    (tmp_path / "d").mkdir()
    cases = {  # path, kind -> what the one line says; None: accepted
        (str(tmp_path / "new" / "deeper"), "directory"): None,
        (str(tmp_path / "d"), "directory"): None,
        (str(tmp_path / "d" / "out.json"), "file"): None,
        (str(tmp_path / "f"), "directory"): "exists and is not a directory",
        (str(tmp_path / "d"), "file"): "exists and is not a file",
        (str(tmp_path / "f" / "below"), "directory"): "is a file, where a directory is expected",
        ("/proc/headroom", "directory"): "inside /proc",
        ("/sys/kernel/x", "file"): "inside /sys",
        ("/dev/shm-not/x", "directory"): "inside /dev",
    }
    for (path, kind), says in cases.items():
        if says is None:
            assert check_writable(path, kind=kind) == Path(path)
        else:
            with pytest.raises(HeadroomInputError) as e:
                check_writable(path, kind=kind)
            assert says in str(e.value), (path, kind, str(e.value))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d", "f"]  # checking creates nothing


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write into any directory")
def test_check_writable_refuses_a_read_only_directory(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir(mode=0o555)
    with pytest.raises(HeadroomInputError, match="is not writable"):
        check_writable(str(ro / "new"))


def test_made_parents_removes_what_it_created_when_the_block_fails(tmp_path):
    (tmp_path / "had").mkdir()
    target = tmp_path / "had" / "a" / "b" / "c"
    with pytest.raises(ValueError):
        with made_parents(target) as d:
            assert d.is_dir()
            raise ValueError("the command failed")
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*")) == ["had"]
    with made_parents(target):  # success keeps them
        pass
    assert target.is_dir()
    other = tmp_path / "had" / "x" / "y"
    with pytest.raises(KeyboardInterrupt):
        with made_parents(other):
            (tmp_path / "had" / "x" / "kept-by-someone").write_text("x")  # a directory filled meanwhile stays
            raise KeyboardInterrupt
    assert not other.exists() and (tmp_path / "had" / "x" / "kept-by-someone").exists()


def test_relative_sqlite_and_file_uris_resolve_home_and_cwd(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    home = os.path.expanduser("~")
    assert resolve_tracking_uri("sqlite:///~/m.db") == f"sqlite:///{home}/m.db"
    assert resolve_tracking_uri("sqlite:///m.db") == f"sqlite:///{tmp_path.resolve()}/m.db"
    assert resolve_tracking_uri(None) == f"sqlite:///{tmp_path.resolve()}/mlflow.db"
    assert resolve_tracking_uri("sqlite:////abs/m.db") == "sqlite:////abs/m.db"
    assert resolve_tracking_uri("~/store") == Path(home, "store").as_uri()
    assert resolve_tracking_uri("http://127.0.0.1:5000") == "http://127.0.0.1:5000"


def test_score_refuses_an_out_its_heatmap_would_overwrite(xs_decoder_run, tmp_path):
    """`score --out X.png` would write the heatmap over the scores; `--out` whose heatmap path is a directory
    cannot be written: both one line, exit 2, before the checkpoint is scored; nothing written."""
    from conftest import headroom

    (tmp_path / "s.png").mkdir()
    for out, says in ((tmp_path / "scores.png", "the scores' heatmap is written to scores.png"),
                      (tmp_path / "s.json", "--out (its heatmap)")):
        r = headroom("score", xs_decoder_run, "--method", "magnitude", "--out", out)
        assert r.returncode == 2 and says in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert [p.name for p in tmp_path.iterdir()] == ["s.png"] and not any((tmp_path / "s.png").iterdir())


def test_newest_per_step_keeps_the_restarted_attempt():
    """A run restarted from step 0 holds two attempts' rows (MLflow keeps both): one row per step, the newest —
    against the rows written by hand."""
    from mlflow.entities import Metric

    from orchestration.report.read import newest_per_step

    first = [Metric("train/loss", 5.0 - s / 10, 1000 + s, s) for s in range(1, 5)]  # stopped after step 4
    second = [Metric("train/loss", 4.0 - s / 10, 9000 + s, s) for s in range(1, 8)]
    hist = second[3:] + first + second[:3]  # the store's order is not the order of logging
    assert newest_per_step(hist) == [(s, 4.0 - s / 10) for s in range(1, 8)]
    assert newest_per_step(first) == [(s, 5.0 - s / 10) for s in range(1, 5)]
    assert newest_per_step([]) == []
