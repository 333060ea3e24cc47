"""The README's cluster flow, rehearsed on 127.0.0.1: `ray start --head` (dashboard and job server
on loopback, 2 CPUs, token authentication with a private token), the README's
`dptune sweep … --address auto --storage s3://…` submitted as a Ray job (JobSubmissionClient,
working_dir = a folder holding the spec), the store checked on the local S3 server, Ray stopped.

The head is stopped by killing the processes of its own temporary folder, not by `ray stop`,
which stops every Ray instance of the user on the machine."""
import asyncio
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest
import yaml

from dptune.platform.sweep.launcher import _token_mode, private_ray_token
from dptune.platform.store.results_store import ResultsStore
from s3_server import free_ports
from test_s3_sweep import N_TRIALS, SMALL

README = Path(__file__).resolve().parents[2] / "README.md"
#: What Ray's job server (the dashboard) imports beyond `ray[tune]`: it comes with `ray[default]`.
DASHBOARD_MODULES = ("aiohttp", "aiohttp_cors", "opencensus", "prometheus_client", "colorful")


def installed(module: str) -> bool:
    """Whether ``module`` can be imported (colorful replaces its own entry in sys.modules with an
    object without ``__spec__`` when imported, so find_spec raises once it is loaded)."""
    return module in sys.modules or importlib.util.find_spec(module) is not None


MISSING = [m for m in DASHBOARD_MODULES if not installed(m)]
pytestmark = pytest.mark.skipif(bool(MISSING), reason=f"Ray's job server needs ray[default] (missing: "
                                f"{', '.join(MISSING)}): pip install 'ray[default]'")


def readme_submit_command() -> str:
    """The `dptune sweep …` command that the README's cluster section submits with `ray job submit`."""
    block = re.search(r"ray job submit [^\n]*--working-dir \. -- \\\n\s*(dptune sweep [^\n]+)", README.read_text())
    assert block, "README: no `ray job submit … --working-dir . -- dptune sweep …` command"
    return block.group(1).strip()


def stop_head(temp_dir: str) -> None:
    """Kill every process of this Ray head (they all name its temporary folder)."""
    for proc in psutil.process_iter(["cmdline"]):
        try:
            if temp_dir in " ".join(proc.info["cmdline"] or []):
                proc.kill()
        except psutil.Error:
            pass


#: What an in-process ``ray.init`` (an earlier test) leaves in os.environ for the driver it was;
#: a `ray start` head must not inherit it.
IN_PROCESS_RAY = ("RAY_CLIENT_MODE", "PYTHONBREAKPOINT", "RAY_USAGE_STATS_ENABLED", "RAY_ADDRESS")


async def _until_the_job_ends(client, job: str) -> None:
    """Read the job's log stream to its end: Ray closes it when the job stops, however long it ran."""
    async for _ in client.tail_job_logs(job):
        pass


def test_readme_job_submission_on_a_local_head(s3, tmp_path):
    from ray.job_submission import JobStatus, JobSubmissionClient

    command = readme_submit_command()
    assert "--address auto" in command and "--storage s3://" in command
    storage = s3.uri("jobs")
    command = command.replace("s3://YOUR-BUCKET/dptune", storage).replace("examples/vit_transfer.yaml", "spec.yaml")
    command += " --quiet"
    work = tmp_path / "job"
    work.mkdir()
    (work / "spec.yaml").write_text(yaml.safe_dump({**SMALL, "experiment": "job"}))

    temp_dir = tempfile.mkdtemp(prefix="rj")  # short: Ray's socket paths must fit 107 characters
    # the agent's HTTP port too: its default (52365) is held by any other Ray on the machine (another
    # test worker's embedded one), and an agent that cannot bind its port never registers
    gcs, dashboard, client_port, agent_port = free_ports(4)
    env = {**{k: v for k, v in os.environ.items() if k not in IN_PROCESS_RAY}, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(tmp_path / "token" / "auth_token"),
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    saved = {k: os.environ.get(k) for k in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN_PATH")}
    os.environ.update({k: env[k] for k in saved})  # the client's token
    try:
        token = private_ray_token().read_text().strip()  # the token file, 0600, made before Ray could write one
        _token_mode()  # this process (the job client) reads Ray's settings again: token mode, this token
        start = subprocess.run(
            [str(Path(sys.executable).parent / "ray"), "start", "--head", "--node-ip-address", "127.0.0.1",
             "--num-cpus", "2", "--include-dashboard", "true", "--dashboard-host", "127.0.0.1",
             "--port", str(gcs), "--dashboard-port", str(dashboard), "--ray-client-server-port", str(client_port),
             "--dashboard-agent-listen-port", str(agent_port),
             "--temp-dir", temp_dir, "--disable-usage-stats"],
            env=env, capture_output=True, text=True, timeout=90)
        assert start.returncode == 0, start.stdout[-2000:] + start.stderr[-2000:]

        # the token by hand: Ray's token loader is a per-process singleton, so a Ray test earlier in
        # this pytest process would have left it holding another cluster's token
        client = JobSubmissionClient(f"http://127.0.0.1:{dashboard}", headers={"Authorization": f"Bearer {token}"})
        deadline = time.time() + 300   # bounds a hang only: under load the agent took more than 30 s
        while True:  # the head's job agent registers a few seconds after `ray start` returns
            try:
                job = client.submit_job(entrypoint=command, runtime_env={"working_dir": str(work)})
                break
            except RuntimeError as exc:
                if "No available agent" not in str(exc) or time.time() > deadline:
                    raise
                time.sleep(1)
        asyncio.run(_until_the_job_ends(client, job))   # its log stream closes when the job ends
        status = client.get_job_status(job)
        logs = client.get_job_logs(job)
        assert status == JobStatus.SUCCEEDED, f"{status}: {command}\n{logs[-3000:]}"
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        stop_head(temp_dir)
        shutil.rmtree(temp_dir, ignore_errors=True)

    trials = ResultsStore(f"{storage}/job/store").table("trials")
    assert len(trials) == N_TRIALS and trials.trial_id.is_unique and (trials.status == "finished").all()
    assert f"experiment at {storage}/job" in logs
