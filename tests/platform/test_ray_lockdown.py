"""The embedded local Ray, locked down (issue 17, item 5), checked on a real local Ray started by
dptune in a fresh process with its own HOME (so the user's ~/.ray is never touched):

- the authentication token file is readable by its owner alone (0600) in a 0700 folder, also when
  an earlier, world-readable token was there;
- no dashboard, and nothing but Ray's own core servers listens on a non-loopback address. Ray 2.60
  binds its gRPC servers (GCS, raylet, workers, the driver, the per-node agent ``ray::DashboardAgent``)
  to every interface and its runtime-env agent and the dashboard agent's HTTP server to the detected
  node address, with no setting to change that: the README's security note says so, and this test
  fails if anything else (a dashboard, another process's server) appears.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

PROBE = r"""
import json, os, stat, psutil, ray
from dptune.platform.sweep.launcher import ray_token_file, start_ray
start_ray(num_cpus=1)
@ray.remote
def f():
    return os.getpid()
ray.get(f.remote())
token = ray_token_file()
me = psutil.Process()
listeners = []
for p in [me, *me.children(recursive=True)]:
    try:
        name = p.name()
        for c in p.net_connections(kind="inet"):
            if c.status == psutil.CONN_LISTEN:
                listeners.append([name, c.laddr.ip, c.laddr.port])
    except psutil.Error:
        pass
names = []
for p in me.children(recursive=True):
    try:
        names.append(" ".join(p.cmdline()))
    except psutil.Error:
        pass
print("PROBE " + json.dumps({"token": oct(stat.S_IMODE(os.stat(token).st_mode)),
                             "folder": oct(stat.S_IMODE(os.stat(token.parent).st_mode)),
                             "token_path": str(token), "listeners": listeners, "processes": names}))
ray.shutdown()
"""
LOOPBACK = {"127.0.0.1", "::1"}
#: Ray's core servers, which Ray 2.60 cannot bind to loopback (README, "Security").
RAY_CORE = ("gcs_server", "raylet", "ray::", "python", "RuntimeEnvAgent")


def probe(home) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH")}
    proc = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=180,
                          env={**env, "HOME": str(home)})
    line = [l for l in proc.stdout.splitlines() if l.startswith("PROBE ")]
    assert proc.returncode == 0 and line, proc.stderr[-3000:]
    return json.loads(line[-1][len("PROBE "):])


def test_local_ray_token_is_private_and_no_dashboard_or_other_server_listens_outside(tmp_path):
    old = tmp_path / ".ray" / "auth_token"  # what Ray 2.60 leaves behind: world-readable
    old.parent.mkdir(mode=0o755)
    old.write_text("0123456789abcdef" * 4)
    old.chmod(0o644)
    old.parent.chmod(0o755)
    found = probe(tmp_path)
    assert found["token_path"] == str(old)
    assert (found["token"], found["folder"]) == ("0o600", "0o700")
    # the web dashboard is off: Ray may still run its head process without the frontend and
    # without an HTTP port (in minimal mode without ray[default]; with it, its modules run behind
    # no web server), and its per-node agent, which hosts the runtime-env agent
    heads = [cmd for cmd in found["processes"] if "dashboard/dashboard.py" in cmd]
    assert all("--disable-frontend" in cmd for cmd in heads), heads
    assert not any(port == 8265 for _, _, port in found["listeners"])
    outside = [l for l in found["listeners"] if l[1] not in LOOPBACK]
    unexpected = [l for l in outside if not l[0].startswith(RAY_CORE)]
    assert unexpected == [], f"non-loopback listeners besides Ray's core servers: {unexpected}"


def test_a_new_token_is_created_private(tmp_path):
    found = probe(tmp_path)
    assert (found["token"], found["folder"]) == ("0o600", "0o700")
    assert (tmp_path / ".ray" / "auth_token").read_text().strip()
