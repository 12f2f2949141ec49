#!/usr/bin/env python3
"""Issue 29, item 3: is restoring a checkpointed, preloaded interpreter cheaper than
importing numpy, pandas and matplotlib in each new sandbox? Measured under runc (criu) and
gVisor (`runsc checkpoint` / `runsc restore`), with the sandbox image's own root file
system (its layers mounted read-only, as a container sees them), outside Docker: Docker's
`checkpoint` commands need an experimental daemon, which this host's shared daemon is not.

    sudo scripts/bench-checkpoint.py [IMAGE] [ROUNDS]

Per runtime, ROUNDS times each (medians printed):
- cold plain: start a sandbox whose Python imports nothing, until it says ready;
- cold preload: the same, importing numpy, pandas and matplotlib.pyplot first (what a
  preloading pool refill does today);
- restore: a new sandbox restored from a checkpoint of a ready preloading one, until the
  restore returns; then one job (a pandas call) runs in it, to show it is usable.
Wall ms and CPU ms (the container's cgroup for cold starts; the restore tool's own CPU,
criu or runsc, for restores). Needs root, runc, criu and runsc. Leaves nothing behind.
"""

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

IMAGE = sys.argv[1] if len(sys.argv) > 1 else None
ROUNDS = int(sys.argv[2]) if len(sys.argv) > 2 else 5

PROGRAM = r"""
import os, sys, time
if sys.argv[1] == "preload":
    import numpy, pandas, matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot
open("/mnt/ready", "w").close()
while not os.path.exists("/mnt/go"):
    time.sleep(0.01)
import pandas as pd
df = pd.DataFrame({"a": range(100)})
open("/mnt/done.tmp", "w").write(str(int(df.a.sum())))
os.rename("/mnt/done.tmp", "/mnt/done")
"""


def sh(*args, check=True, **kw):
    return subprocess.run(args, check=check, capture_output=True, text=True, **kw)


def image_name():
    if IMAGE:
        return IMAGE
    out = sh("docker", "images", "--format", "{{.Repository}}:{{.Tag}}").stdout.split()
    return next(i for i in out if i.startswith("mcp-code-executor/sandbox:"))


def mount_rootfs(image, target):
    """The image's layers, mounted read-only (an overlay of lower layers only)."""
    data = json.loads(sh("docker", "image", "inspect", image).stdout)[0]["GraphDriver"]["Data"]
    layers = [data["UpperDir"]] + [d for d in data.get("LowerDir", "").split(":") if d]
    os.makedirs(target)
    sh("mount", "-t", "overlay", "overlay", "-o", "lowerdir=" + ":".join(layers), target)


def bundle(work, rootfs, sig, mode, gvisor):
    b = os.path.join(work, "bundle-%s-%s" % ("runsc" if gvisor else "runc", mode))
    os.makedirs(b)
    sh("runc", "spec", cwd=b)
    with open(os.path.join(b, "config.json")) as f:
        spec = json.load(f)
    spec["root"] = {"path": rootfs, "readonly": True}
    p = spec["process"]
    p["terminal"] = False
    p["args"] = ["/usr/bin/python3", "-c", PROGRAM, mode]
    p["cwd"] = "/tmp"
    p["user"] = {"uid": 65534, "gid": 65534}
    p["env"] = ["PATH=/usr/bin:/bin", "MPLCONFIGDIR=/tmp", "HOME=/tmp"]
    spec["mounts"].append(
        {"destination": "/tmp", "type": "tmpfs", "source": "tmpfs",
         "options": ["nosuid", "nodev", "size=64m"]})
    spec["mounts"].append(
        {"destination": "/mnt", "type": "bind", "source": sig, "options": ["rbind", "rw"]})
    if gvisor:
        spec["linux"].pop("seccomp", None)
    with open(os.path.join(b, "config.json"), "w") as f:
        json.dump(spec, f)
    return b


class Runtime:
    def __init__(self, work, gvisor):
        self.gvisor = gvisor
        self.root = os.path.join(work, "root-" + ("runsc" if gvisor else "runc"))
        os.makedirs(self.root)

    def cmd(self, *args):
        if self.gvisor:
            return ["runsc", "--root", self.root, "--platform=ptrace", "--network=none",
                    "--ignore-cgroups"] + list(args)
        return ["runc", "--root", self.root] + list(args)

    def run(self, *args, check=True):
        # No pipe: a detached sandbox keeps its stdio open, and the wait would never end.
        with open(os.devnull, "rb") as null_in, open(os.devnull, "wb") as null_out, \
                tempfile.TemporaryFile() as err:
            r = subprocess.run(self.cmd(*args), stdin=null_in, stdout=null_out, stderr=err)
            err.seek(0)
            r.stderr = err.read().decode(errors="replace")
        if check and r.returncode != 0:
            raise subprocess.CalledProcessError(r.returncode, r.args, stderr=r.stderr)
        return r

    def cpu_ms(self, cid):
        """CPU the sandbox used so far: its cgroup (runc), its process tree (gVisor)."""
        if not self.gvisor:
            return container_cpu_ms(cid)
        r = subprocess.run(self.cmd("state", cid), capture_output=True, text=True)
        try:
            return tree_cpu_ms(json.loads(r.stdout)["pid"])
        except (ValueError, KeyError):
            return None

    def delete(self, cid):
        self.run("kill", cid, "KILL", check=False)
        self.run("delete", "--force", cid, check=False)


def children_cpu_ms():
    r = os.times()
    return (r.children_user + r.children_system) * 1000


def container_cpu_ms(cid):
    for f in ("/sys/fs/cgroup/cpuacct/%s/cpuacct.usage" % cid,
              "/sys/fs/cgroup/cpu,cpuacct/%s/cpuacct.usage" % cid):
        try:
            return int(open(f).read()) / 1e6
        except OSError:
            pass
    return None


def tree_cpu_ms(pid):
    """CPU of process `pid` and its descendants (a gVisor sandbox: its sentry and stubs)."""
    parent = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                f = open("/proc/%s/stat" % d).read().rsplit(")", 1)[1].split()
                parent[int(d)] = (int(f[1]), int(f[11]) + int(f[12]))
            except (OSError, IndexError, ValueError):
                pass
    tick = os.sysconf("SC_CLK_TCK")

    def under(p):
        while p > 1:
            if p == pid:
                return True
            p = parent.get(p, (0, 0))[0]
        return False

    return sum(t for p, (_, t) in parent.items() if under(p)) * 1000 / tick


def wait_for(path, limit=60):
    t = time.monotonic()
    while not os.path.exists(path):
        if time.monotonic() - t > limit:
            raise TimeoutError(path)
        time.sleep(0.001)


def clear(sig):
    for n in os.listdir(sig):
        os.remove(os.path.join(sig, n))


def cold(rt, b, sig, cid):
    clear(sig)
    c0, t = children_cpu_ms(), time.monotonic()
    rt.run("run", "--detach", "--bundle", b, cid)
    wait_for(os.path.join(sig, "ready"))
    wall = (time.monotonic() - t) * 1000
    cpu = rt.cpu_ms(cid)
    tool = children_cpu_ms() - c0
    return wall, cpu, tool


def job(sig):
    """One pandas call in a ready sandbox: ms until its answer."""
    t = time.monotonic()
    open(os.path.join(sig, "go"), "w").close()
    wait_for(os.path.join(sig, "done"))
    assert open(os.path.join(sig, "done")).read() == "4950"
    return (time.monotonic() - t) * 1000


def measure(work, rootfs, gvisor):
    name = "runsc" if gvisor else "runc"
    sig = os.path.join(work, "sig-" + name)
    os.makedirs(sig)
    os.chmod(sig, 0o777)
    rt = Runtime(work, gvisor)
    rows = {}
    for mode in ("plain", "preload"):
        b = bundle(work, rootfs, sig, mode, gvisor)
        walls, cpus, jobs = [], [], []
        for i in range(ROUNDS):
            cid = "mcpx-ckpt-%s-%s-%d-%d" % (name, mode, os.getpid(), i)
            try:
                wall, cpu, tool = cold(rt, b, sig, cid)
                jobs.append(job(sig))
            finally:
                rt.delete(cid)
            walls.append(wall)
            cpus.append(cpu if cpu is not None else tool)
        rows["cold " + mode] = (walls, cpus, jobs)
    # Checkpoint one ready preloading sandbox, then restore it ROUNDS times.
    b = os.path.join(work, "bundle-%s-preload" % name)
    image = os.path.join(work, "image-" + name)
    cid = "mcpx-ckpt-%s-src-%d" % (name, os.getpid())
    try:
        cold(rt, b, sig, cid)
        t = time.monotonic()
        if gvisor:
            rt.run("checkpoint", "--image-path", image, cid)
        else:
            rt.run("checkpoint", "--image-path", image, "--work-path", image + "-work", cid)
        ckpt_ms = (time.monotonic() - t) * 1000
    except subprocess.CalledProcessError as e:
        why = e.stderr.strip().replace("\n", " ")[-300:]
        for d, _, fs in os.walk(image + "-work"):
            for f in fs:
                for line in open(os.path.join(d, f), errors="replace"):
                    if "Error" in line:
                        why += " | " + line.strip()
                        break
        rows["checkpoint failed: " + why[:600]] = ([], [], [])
        return rows, float("nan"), 0
    finally:
        rt.delete(cid)
    size = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(image) for f in fs)
    walls, cpus, jobs = [], [], []
    for i in range(ROUNDS):
        clear(sig)
        open(os.path.join(sig, "ready"), "w").close()
        cid = "mcpx-ckpt-%s-restored-%d-%d" % (name, os.getpid(), i)
        try:
            c0, t = children_cpu_ms(), time.monotonic()
            if gvisor:
                rt.run("restore", "--image-path", image, "--bundle", b, "--detach", cid)
            else:
                rt.run("restore", "--image-path", image, "--work-path", image + "-work-%d" % i,
                       "--bundle", b, "--detach", cid)
            walls.append((time.monotonic() - t) * 1000)
            tool = children_cpu_ms() - c0
            cpu = rt.cpu_ms(cid)
            cpus.append(tool + (cpu or 0))
            jobs.append(job(sig))
        except subprocess.CalledProcessError as e:
            print("%s restore failed: %s" % (name, e.stderr.strip()[-400:]))
            break
        finally:
            rt.delete(cid)
    rows["restore preload"] = (walls, cpus, jobs)
    return rows, ckpt_ms, size


def med(v):
    return "%.0f" % statistics.median(v) if v else "n/a"


def main():
    if os.geteuid() != 0:
        sys.exit("bench-checkpoint: needs root (runc, criu, mounts)")
    for tool in ("runc", "criu", "runsc", "docker"):
        if not shutil.which(tool):
            sys.exit("bench-checkpoint: %s is missing" % tool)
    image = image_name()
    work = tempfile.mkdtemp(prefix="mcpx-ckpt-", dir="/var/tmp")
    rootfs = os.path.join(work, "rootfs")
    try:
        mount_rootfs(image, rootfs)
        print("image %s, %d rounds, medians\n" % (image, ROUNDS))
        print("| runtime | sandbox | wall ms | CPU ms | pandas job ms after |")
        print("| --- | --- | --- | --- | --- |")
        notes = []
        for gvisor in (False, True):
            name = "gVisor" if gvisor else "runc"
            try:
                rows, ckpt_ms, size = measure(work, rootfs, gvisor)
            except Exception as e:  # report what ran, and why the rest did not
                why = getattr(e, "stderr", None) or repr(e)
                for d, _, fs in os.walk(work):
                    for f in fs:
                        if f.endswith(".log") and os.environ.get("KEEP_LOGS"):
                            shutil.copy(os.path.join(d, f), os.environ["KEEP_LOGS"])
                print("| %s | failed: %s | | | |" % (name, why.strip()[-300:].replace("\n", " ")))
                continue
            for what, (walls, cpus, jobs) in rows.items():
                print("| %s | %s | %s | %s | %s |" % (name, what, med(walls), med(cpus), med(jobs)))
            notes.append("%s: checkpoint took %.0f ms, image %.1f MiB" % (name, ckpt_ms, size / 2**20))
        print()
        for n in notes:
            print(n)
    finally:
        subprocess.run(["umount", rootfs], check=False)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
