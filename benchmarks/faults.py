"""Fault campaign: a sweep on the production stack (benchmarks/stack.py: PostgreSQL, S3, MLflow with basic auth,
a Ray head and worker with token auth), submitted with `ray job submit` on s3:// storage, with faults injected at
random points, then an audit of what MLflow holds.

Faults (kinds drawn so that each appears before any repeats, times drawn at random):
  worker    kill -9 of a Ray worker process that is running a trial (Tune retries it from its checkpoint)
  driver    kill -9 of the sweep's driver, then `headroom sweep --resume` submitted as a new job
  mlflow    the MLflow server stopped and started again
  postgres  PostgreSQL stopped (fast shutdown) and started again
  s3        the S3 server stopped and started again (its state kept, as MinIO's volume keeps it)
  head      kill -9 of every process of the Ray head and worker nodes (GCS, raylets, dashboard, job agent, the
            driver, the trials), both nodes started again on the same address and token, and the sweep submitted
            again with `--resume`: what KubeRay does when a head pod dies without GCS fault tolerance (the head
            restarts, the workers' raylets fail with it and their pods restart, and the job's state is gone)

The audit, against the sweep's plan (`headroom sweep FILE --plan`): units expected, finished, lost; runs sharing a
unit key (duplicate_runs); a stepped metric logged twice at one step (duplicate_steps); train/loss and train/lr at
every optimizer step 1..T of a training run and val/loss at every validation step (missing_steps); each finished unit's
artifacts listed and readable through the server (missing_artifacts); and per fault the seconds until the sweep
made progress again (another trial finished, or the sweep ended). An lr-search candidate running when its
driver is killed is closed KILLED and the resumed study samples another rate in its place (its Optuna trial never
completed); the JSON counts those as lr_candidates_replaced, not as lost.

    python benchmarks/faults.py [--tiny] [--faults N] [--kinds K,..] [--seed S] [--sweep FILE] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

from fault_audit import FULL_FAULTS, audit, judge  # noqa: E402
from measure import summarize  # noqa: E402
from stack import ROOT, Stack, missing  # noqa: E402

from orchestration.running.runstore import mlflow_client  # noqa: E402

KINDS = ("worker", "driver", "mlflow", "postgres", "s3", "head")
TINY = ("worker", "postgres", "s3")  # CI's: a driver kill costs a minute (test_resume.py has one), MLflow 50 s
PROGRESS = re.compile(r"^\[headroom\]\s+\d+/\d+ ", re.MULTILINE)  # the driver's line per finished trial


def planned(sweep_file: Path) -> list[dict]:
    r = subprocess.run([sys.executable, "-m", "orchestration.cli", "sweep", str(sweep_file), "--plan", "--json"],
                       cwd=ROOT, capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        raise SystemExit(r.stderr.strip().splitlines()[-1] if r.stderr.strip() else "--plan failed")
    return json.loads(r.stdout)


def schedule(n: int, rng: random.Random, kinds: tuple[str, ...] = KINDS) -> list[str]:
    """n fault kinds: every kind once (in random order) before any repeats."""
    out: list[str] = []
    while len(out) < n:
        batch = list(kinds)
        rng.shuffle(batch)
        out += batch
    return out[:n]


class Campaign:
    def __init__(self, stack: Stack, sweep_file: Path, n_faults: int, seed: int, say=print,
                 kinds: tuple[str, ...] = KINDS, gap: tuple[float, float] = (5.0, 25.0)):
        import psutil  # noqa: F401  (fail early where it is missing)

        self.stack, self.sweep_file, self.say = stack, Path(sweep_file), say
        self.rng = random.Random(seed)
        self.kinds = schedule(n_faults, self.rng, kinds)
        self.gap = gap  # seconds of normal running between one fault's recovery and the next fault
        self.prefix = f"s3://headroom-tune/faults-{secrets.token_hex(4)}"
        self.jobs: list[str] = []
        self.faults: list[dict] = []
        self._done_counts: dict[str, int] = {}  # job -> trials its log reports, once the job is over

    # ------------------------------------------------------------------------------------------- the job
    def _entry(self, resume: bool) -> list[str]:
        argv = ["headroom", "sweep", str(self.sweep_file.relative_to(ROOT)), "--tracking-uri",
                self.stack.values[("mlflow-sweep-credentials", "tracking-uri")], "--storage", self.prefix]
        return argv + (["--resume"] if resume else [])

    def submit(self, resume: bool) -> str:
        ray = self.stack.ray
        sid = f"faults-{len(self.jobs)}-{secrets.token_hex(3)}"
        deadline = time.time() + 900  # a loaded head's job agent may take minutes to come up: "try again later"
        while True:
            r = ray.ray("job", "submit", "--address", ray.dashboard, "--submission-id", sid, "--no-wait",
                        "--working-dir", str(ROOT), "--", *self._entry(resume), timeout=300)
            if r.returncode == 0 or "No available agent" not in r.stderr or time.time() > deadline:
                break
            time.sleep(5)
        if r.returncode != 0:  # still no agent after the deadline, or another refusal
            raise RuntimeError(f"ray job submit failed: {r.stderr[-2000:]}")
        self.jobs.append(sid)
        self.say(f"[faults] submitted {sid}{' (--resume)' if resume else ''}")
        return sid

    def _jobs(self):
        from ray.job_submission import JobSubmissionClient

        ray = self.stack.ray
        return JobSubmissionClient(ray.dashboard, headers={"Authorization": f"Bearer {ray.token}"})

    def status(self, sid: str) -> str:
        try:
            return str(self._jobs().get_job_status(sid).value)
        except Exception:
            return "UNKNOWN"

    def logs(self, sid: str) -> str:
        return self._jobs().get_job_logs(sid)

    # ------------------------------------------------------------------------------------------- progress
    @contextmanager
    def _login(self, **extra):
        """The sweep user's MLflow login in this process's environment (MLflow's client reads it there), and back."""
        user, password = self.stack.sweep_login
        vars_ = {"MLFLOW_TRACKING_USERNAME": user, "MLFLOW_TRACKING_PASSWORD": password,
                 "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false", **extra}
        saved = {k: os.environ.get(k) for k in vars_}
        os.environ.update(vars_)
        try:
            yield mlflow_client(self.stack.mlflow.url)
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v

    def progress(self) -> int:
        """Trials finished so far, as the drivers' job logs say (one `[headroom]   n/N` line each). Read from Ray,
        not MLflow: every request to a basic-auth server checks a password hash, and polling would steal the CPU
        the trials run on."""
        total = 0
        for sid in self.jobs:
            if sid not in self._done_counts:
                try:
                    n = len(PROGRESS.findall(self.logs(sid)))
                except Exception:
                    continue
                if sid != self.jobs[-1]:
                    self._done_counts[sid] = n
                total += n
            else:
                total += self._done_counts[sid]
        return total

    # ------------------------------------------------------------------------------------------- faults
    def _processes(self, match) -> list:
        import psutil

        out = []
        for p in self.stack.ray.processes():
            try:
                if match(p.cmdline()):
                    out.append(p)
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
        return out

    def _trial_workers(self) -> list:
        return self._processes(lambda argv: bool(argv) and argv[0].startswith("ray::ImplicitFunc.train"))

    def _drivers(self) -> list:
        return self._processes(lambda argv: any(a.endswith("headroom") for a in argv[:2]) and "sweep" in argv
                               and self.prefix in argv)

    def inject(self, kind: str, sid: str) -> dict:
        st = self.stack
        down = round(self.rng.uniform(1.0, 5.0), 1)
        t = time.time()
        detail = ""
        if kind == "worker":
            procs = []
            deadline = time.time() + 120
            while not procs and time.time() < deadline and self.status(sid) in ("RUNNING", "PENDING"):
                procs = self._trial_workers()
                if not procs:
                    time.sleep(0.5)
            if not procs:
                return {}
            p = self.rng.choice(procs)
            t = time.time()
            detail = " ".join(p.cmdline()[:1])
            os.kill(p.pid, signal.SIGKILL)
        elif kind == "driver":
            procs = self._drivers()
            if not procs:
                return {}
            t = time.time()
            for p in procs:
                os.kill(p.pid, signal.SIGKILL)
            detail = f"pid {procs[0].pid}"
        elif kind == "mlflow":
            st.mlflow.stop()
            time.sleep(down)
            st.mlflow.start()
        elif kind == "postgres":
            st.postgres.stop("fast")
            time.sleep(down)
            st.postgres.start()
        elif kind == "s3":
            st.s3.stop()
            time.sleep(down)
            st.s3.start()
        elif kind == "head":
            try:  # its log goes with the head: what it said so far is counted now
                self._done_counts[sid] = len(PROGRESS.findall(self.logs(sid)))
            except Exception:  # the dashboard did not answer: nothing to hit right now, try again later
                return {}
            t = time.time()
            st.ray.kill()
            time.sleep(down)
            st.ray.start()
            detail = "both nodes restarted"
        self.say(f"[faults] {kind} at {time.strftime('%H:%M:%S', time.localtime(t))} {detail}")
        return {"kind": kind, "at": t, "down_s": down if kind in ("mlflow", "postgres", "s3", "head") else 0.0,
                **({"job_lost": True} if kind == "head" else {})}

    # ------------------------------------------------------------------------------------------- the run
    def run(self, timeout: float = 7200) -> dict:
        from orchestration.design.spec import load_sweep

        sweep = load_sweep(self.sweep_file)[0]
        self.sweep_name, self.log_models = sweep.name, sweep.log_models
        plan = planned(self.sweep_file)
        t0 = time.time()
        sid = self.submit(resume=False)
        pending = list(self.kinds)
        resubmits = 0
        while time.time() - t0 < timeout:
            state = self.status(sid)
            if state == "SUCCEEDED":
                break
            if state in ("FAILED", "STOPPED"):
                if resubmits >= 3 * len(self.kinds) + 2:
                    raise RuntimeError(f"the sweep did not finish after {resubmits} resubmissions:\n"
                                       + self.logs(sid)[-4000:])
                resubmits += 1
                sid = self.submit(resume=True)
                continue
            if pending and state == "RUNNING":
                time.sleep(self.rng.uniform(*self.gap))
                if self.status(sid) != "RUNNING":
                    continue
                before = self.progress()
                fault = self.inject(pending[0], sid)
                if not fault:
                    continue  # nothing to hit right now (between stages): try again later
                pending.pop(0)
                if fault.pop("job_lost", False):  # a new head knows no jobs: submit the sweep again
                    before = self.progress()  # the lost job's trials, as counted before the kill
                    resubmits += 1
                    sid = self.submit(resume=True)
                # recovered: another trial finishes, or the sweep ends (resubmitting after a driver kill)
                while self.progress() <= before:
                    state = self.status(sid)
                    if state == "SUCCEEDED":
                        break
                    if time.time() - t0 > timeout:
                        raise RuntimeError(f"the campaign ran past {timeout} s waiting to recover from {fault}")
                    if state in ("FAILED", "STOPPED"):
                        if resubmits >= 3 * len(self.kinds) + 2:
                            raise RuntimeError(f"the sweep did not recover after {resubmits} resubmissions:\n"
                                               + self.logs(sid)[-4000:])
                        resubmits += 1
                        sid = self.submit(resume=True)
                    time.sleep(2.0)
                fault["recovery_s"] = round(time.time() - fault.pop("at"), 1)
                self.faults.append(fault)
                continue
            time.sleep(2.0)
        else:
            raise RuntimeError(f"the campaign ran past {timeout} s")
        wall = time.time() - t0
        out = {"benchmark": "faults", "sweep": self.sweep_name, "storage": self.prefix, "seed_kinds": self.kinds,
               "faults_injected": len(self.faults), "faults": self.faults, "jobs": self.jobs,
               "resubmissions": len(self.jobs) - 1, "wall_s": round(wall, 1)}
        with self._login() as c:
            out.update(audit(c, self.sweep_name, plan, models=self.log_models))
        # counts are exact; the recovery times are samples of a noisy machine: their median and spread
        recovery = summarize([f["recovery_s"] for f in self.faults]) if self.faults else None
        out["samples"] = [{"kind": f.get("kind"), "recovery_s": f["recovery_s"]} for f in self.faults]
        out["median_recovery_s"] = recovery and recovery["median"]
        out["spread"] = recovery and recovery["spread"]
        return judge(out, self.kinds, KINDS)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Fault campaign on the production stack; writes JSON.")
    ap.add_argument("--tiny", action="store_true", help=f"CI size: {len(TINY)} faults, one each of {', '.join(TINY)} "
                    "(tests/test_resume.py kills and resumes a driver; the full campaign does all kinds)")
    ap.add_argument("--faults", type=int, default=None,
                    help=f"how many faults (default {FULL_FAULTS}, the full goal; --tiny {len(TINY)})")
    ap.add_argument("--kinds", default=None, help=f"comma-separated fault kinds (default all: {','.join(KINDS)})")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--sweep", default=None,
                    help="the sweep file (default sweeps/faults.yaml, long enough for 20 faults; --tiny: smoke.yaml)")
    ap.add_argument("--out", default="benchmarks/results/faults.json")
    a = ap.parse_args(argv)
    n = a.faults if a.faults is not None else (len(TINY) if a.tiny else FULL_FAULTS)
    kinds = tuple(a.kinds.split(",")) if a.kinds else TINY if a.tiny else KINDS
    a.sweep = a.sweep or str(ROOT / "sweeps" / ("smoke.yaml" if a.tiny else "faults.yaml"))
    sweep = Path(a.sweep).resolve()
    unknown = [k for k in kinds if k not in KINDS]
    problem = (f"--kinds: unknown {', '.join(unknown)} (choose from {', '.join(KINDS)})" if unknown else
               "--faults: at least 1" if n < 1 else f"--sweep {a.sweep}: not a file" if not sweep.is_file()
               else f"--sweep {a.sweep}: must lie inside the repository (the job's working directory)"
               if not sweep.is_relative_to(ROOT) else None)
    if problem:
        print(f"faults: {problem}", file=sys.stderr)
        return 2
    why = missing()
    if why:
        print(f"faults: cannot run the stack here: {why}", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stop the stack on the way out
    stack = Stack(Path(tempfile.mkdtemp(prefix="headroom-faults-")))
    try:
        stack.start()
        stack.start_ray()
        res = Campaign(stack, sweep, n, a.seed, say=lambda m: print(m, flush=True), kinds=kinds,
                       gap=(3.0, 10.0) if a.tiny else (5.0, 25.0)).run()
    finally:
        stack.stop()
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=2) + "\n")
    print(json.dumps({k: res[k] for k in ("faults_requested", "faults_injected", "units_expected", "units_finished",
                                          "units_lost", "duplicate_runs", "duplicate_steps", "missing_steps",
                                          "missing_artifacts", "meets_goal", "meets_full_goal")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
