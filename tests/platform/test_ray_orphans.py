"""Ray processes left by a killed local session are stopped; those of a live raylet are not."""
import os
import subprocess
import sys
import time

import pytest

from dptune.platform.sweep.ray_orphans import orphaned_ray_processes, stop_orphans

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def titled(pid_file, title: str) -> bool:
    """The process whose pid ``pid_file`` holds runs under ``title`` (its exec has happened)."""
    try:
        with open(f"/proc/{int(pid_file.read_text())}/cmdline", "rb") as f:
            return f.read().split(b"\0")[0].decode() == title
    except (OSError, ValueError):
        return False


def wait_for(condition) -> None:
    """Poll until ``condition()`` holds: a synchronisation point, not a deadline (a process that never
    starts leaves the test to the suite's time limit)."""
    while not condition():
        time.sleep(0.02)


def test_an_agent_whose_raylet_died_is_stopped_and_one_of_a_live_raylet_is_not(tmp_path):
    def raylet(script: str) -> subprocess.Popen:   # bash running ``script``, titled as a raylet
        return subprocess.Popen(["/fake/ray/raylet", "-c", script], executable="/bin/bash", cwd=tmp_path)

    # an agent left behind: started by a "raylet" that is then killed (it is reparented to init)
    dead = raylet("(exec -a ray::DashboardAgent sleep 300) & echo $! > orphan; wait")
    # a process forked by a worker of a raylet that is alive (a data loader keeps the worker's title)
    (tmp_path / "worker.sh").write_text("(exec -a ray::IDLE sleep 300) & echo $! > kept; wait\n")
    live = raylet("(exec -a ray::IDLE bash worker.sh) & wait")
    try:
        wait_for(lambda: titled(tmp_path / "orphan", "ray::DashboardAgent") and titled(tmp_path / "kept", "ray::IDLE"))
        orphan, kept = int((tmp_path / "orphan").read_text()), int((tmp_path / "kept").read_text())
        assert orphan not in orphaned_ray_processes() and kept not in orphaned_ray_processes()
        dead.kill()
        dead.wait()
        found = orphaned_ray_processes()
        stopped = stop_orphans(grace_s=2.0)
        # found and stopped: here, or by a Ray that another test process (the suite runs in two
        # workers) started meanwhile, with this same code; nothing else ends it
        assert not alive(orphan)
        assert kept not in found and kept not in stopped and alive(kept)
    finally:
        live.kill()
        for name in ("orphan", "kept"):
            try:
                os.kill(int((tmp_path / name).read_text()), 9)
            except (OSError, ValueError):
                pass
