"""The MLflow UI and the report as a user sees them: headless Chromium (Debian's `chromium` and `chromium-driver`,
driven by Selenium) opens `mlflow ui` served over the smoke sweep's store and the smoke report's `report.html`,
saves screenshots, and checks the rendered pages. Skips, saying why, where Chromium is not installed."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from loopback import free_port, wait_http
from test_sweep import client, runs_of, split

pytestmark = pytest.mark.slow

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
DRIVER = shutil.which("chromedriver") or ("/usr/bin/chromedriver" if os.path.exists("/usr/bin/chromedriver") else None)
SHOTS = Path(os.environ.get("HEADROOM_SCREENSHOTS", Path(__file__).resolve().parents[1] / ".screenshots"))
COLUMNS = ("headroom.arm", "headroom.method", "headroom.ratio", "headroom.seed", "headroom.steps")
WINDOW = "--window-size=2600,2400"  # every row and column of the smoke sweep in view (the table renders only those)


@pytest.fixture(scope="module")
def browser():
    if not (CHROMIUM and DRIVER):
        pytest.skip("headless Chromium not installed (apt-get install chromium chromium-driver)")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for a in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", WINDOW):
        opts.add_argument(a)
    driver = webdriver.Chrome(service=Service(DRIVER), options=opts)
    driver.set_page_load_timeout(60)
    SHOTS.mkdir(parents=True, exist_ok=True)
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture(scope="module")
def ui(smoke, tmp_path_factory):
    """`mlflow ui` over the smoke sweep's store, on loopback."""
    port, log = free_port(), tmp_path_factory.mktemp("mlflow-ui") / "server.log"
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    with open(log, "w") as out:
        proc = subprocess.Popen([str(Path(sys.executable).parent / "mlflow"), "ui", "--backend-store-uri",
                                 f"sqlite:///{smoke['cwd'] / 'mlflow.db'}", "--host", "127.0.0.1", "--port",
                                 str(port)], cwd=smoke["cwd"], env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_http(f"http://127.0.0.1:{port}/health", 120, proc, log)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(30)


def _wait_text(driver, needles, timeout=60.0) -> str:
    """The page's visible text once it holds every needle (or the last text, for the failure message)."""
    deadline, text = time.time() + timeout, ""
    while time.time() < deadline:
        text = driver.find_element("tag name", "body").text
        if all(n in text for n in needles):
            return text
        time.sleep(0.5)
    raise AssertionError(f"not on the page after {timeout:.0f} s: {[n for n in needles if n not in text]}\n"
                         + text[:3000])


def test_the_mlflow_ui_opens_on_the_runs_and_lists_the_children_with_headroom_columns(browser, ui, smoke):
    c = client(smoke["cwd"])
    exp = c.get_experiment_by_name("smoke")
    parents, children = split(runs_of(c, "smoke"))
    parent = parents[0]
    # the link the sweep printed, on this server: the runs table (MLflow 3.17 opens GenAI pages without it)
    link = re.search(r"MLflow UI: .*?(#/experiments/\S+)", smoke["stdout"]).group(1)
    assert link == f"#/experiments/{exp.experiment_id}/runs?workflowType=machine_learning"
    browser.get(f"{ui}/{link}")
    text = _wait_text(browser, [parent.info.run_name, "Run Name", "Tests whether attention heads"])  # + description
    browser.save_screenshot(str(SHOTS / "mlflow-experiment.png"))
    assert "Traces 0" not in text and "No data available" not in text
    # the parent expanded and the headroom tags as columns, as the UI saves a user's choice of them
    state = {"runsExpanded": {parent.info.run_id: True},
             "selectedColumns": [f"tags.`{t}`" for t in COLUMNS] + ["attributes.`Models`"]}
    browser.get(f"{ui}/health")  # the same origin, without the app (which would write its own state back)
    browser.execute_script("window.localStorage.setItem(arguments[0], arguments[1]);",
                           f'MLflowLocalStorage-1.1-ExperimentPage-["{exp.experiment_id}"]-ReactComponentState',
                           json.dumps(state))
    browser.get(f"{ui}/{link}")
    trained = [r for r in children if r.data.tags["headroom.stage"] != "lr_search"]
    text = _wait_text(browser, list(COLUMNS) + ["scratch_e", "scratch_b", "gradient", "pruned_model"])
    browser.save_screenshot(str(SHOTS / "mlflow-runs-table.png"))
    rows = browser.find_elements("css selector", "[role=row]")
    assert len(rows) >= len(children) + 1, len(rows)  # every child under its parent (the header row aside)
    names = " ".join(r.text for r in rows)
    # run names are cut to the column's width in the table: their start, and each arm's tag value in a cell
    assert all(r.info.run_name[:12] in names for r in trained)
    for arm in ("dense", "pruned", "scratch_e", "scratch_b"):
        assert sum(f" {arm} " in f" {r.text.replace(chr(10), ' ')} " for r in rows) == sum(
            x.data.tags["headroom.arm"] == arm for x in children), arm
    # the parent run's page shows its description: the verdict
    browser.get(f"{ui}/#/experiments/{exp.experiment_id}/runs/{parent.info.run_id}?workflowType=machine_learning")
    v = json.loads((smoke["cwd"] / "reports" / "smoke" / "verdict.json").read_text())
    _wait_text(browser, ["Verdict of sweep smoke"] + [h["headline"][:40] for h in v["headline"]])
    browser.save_screenshot(str(SHOTS / "mlflow-parent-run.png"))


def test_the_report_renders_its_images_and_names_the_verdict(browser, smoke):
    html = smoke["cwd"] / "reports" / "smoke" / "report.html"
    browser.get(html.as_uri())
    v = json.loads((smoke["cwd"] / "reports" / "smoke" / "verdict.json").read_text())
    text = _wait_text(browser, ["verdict"])
    images = browser.find_elements("tag name", "img")
    assert images
    broken = [i.get_attribute("alt") or i.get_attribute("src")[:60] for i in images
              if not browser.execute_script("return arguments[0].complete && arguments[0].naturalWidth > 0", i)]
    assert not broken, broken
    for h in v["headline"]:
        assert h["headline"].split(":")[0] in text  # the verdict word (or "untrustworthy") of every scale
    browser.save_screenshot(str(SHOTS / "report.png"))
