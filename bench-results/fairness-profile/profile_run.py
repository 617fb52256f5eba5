"""Profiling driver for `bench fairness` (not part of the repo).

usage: python profile_run.py OUT [--pyspy]   (cwd/PYTHONPATH: a checkout with the probe patch,
GPU_BINDER_PROBE_NS=tenant-b in the environment)

Adds to one bench.fairness.run: an audit log of tenant-b's VMI creates (RequestReceived /
ResponseComplete timestamps), wall-clock send/answer times of B's creates, full API-server
/metrics scrapes before the flood, at B's first create + 60 ms and after, APF dump_requests
polled every 40 ms during B's first three creates, and with --pyspy: py-spy record of both
replicas over the flood phase (raw + speedscope, --idle, nonblocking) and py-spy dumps of
both at B's first create + 40 ms / + 120 ms.
"""
import json
import os
import signal
import ssl
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import anyio

import bench.fairness as bf
import localcluster.controlplane as cpmod

OUT = Path(sys.argv[1]).resolve()
PYSPY = "--pyspy" in sys.argv
SPY = "/work/wt/pyspy/bin/py-spy"
OUT.mkdir(parents=True, exist_ok=True)
STATE: dict = {"lc": None, "calls": 0, "b_wall": {}, "events": []}

POLICY = """apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: []
rules:
- level: Metadata
  namespaces: ["tenant-b"]
  verbs: ["create"]
  resources:
  - group: kubevirt.io
    resources: ["virtualmachineinstances"]
- level: None
"""

_orig_spawn = cpmod.ControlPlane._spawn


def _spawn(self, name, args):
    if name == "kube-apiserver":
        pol = self.dir / "audit-policy.yaml"
        pol.write_text(POLICY)
        args = [*args, f"--audit-policy-file={pol}", f"--audit-log-path={OUT / 'audit.log'}",
                "--audit-log-format=json"]
    return _orig_spawn(self, name, args)


cpmod.ControlPlane._spawn = _spawn


def _ctx(cp):
    d = cp.dir / "pki"
    ctx = ssl.create_default_context(cafile=str(d / "ca.crt"))
    ctx.load_cert_chain(str(d / "admin.crt"), str(d / "admin.key"))
    return ctx


def _get(cp, path, timeout=5):
    with urllib.request.urlopen(f"{cp.server}{path}", timeout=timeout, context=_ctx(cp)) as r:
        return r.read().decode()


def _scrape(tag):
    lc = STATE["lc"]
    t = time.time()
    text = _get(lc.cp, "/metrics")
    keep = [line for line in text.splitlines()
            if line.startswith(("apiserver_flowcontrol_", "apiserver_admission_webhook_",
                                "apiserver_request_duration_seconds_bucket{component=\"apiserver\",dry_run=\"\",group=\"kubevirt.io\"",
                                "apiserver_request_duration_seconds_count{component=\"apiserver\",dry_run=\"\",group=\"kubevirt.io\"",
                                "apiserver_webhooks_"))]
    (OUT / f"metrics-{tag}.txt").write_text("\n".join(keep))
    STATE["events"].append((tag + " scraped", t, time.time()))


_orig_create = bf._create


async def _create(api, ns, body):
    name = body["metadata"]["name"]
    sent = time.time()
    out = await _orig_create(api, ns, body)
    STATE["b_wall"][name] = (sent, time.time(), out[0])
    return out


bf._create = _create


def _dump(tag):
    lc = STATE["lc"]
    procs = [subprocess.Popen([SPY, "dump", "--pid", str(r.proc.pid)], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for r in lc.replicas]
    t = time.time()
    outs = [p.communicate()[0] for p in procs]
    for i, o in enumerate(outs):
        (OUT / f"dump-{tag}-replica{i}.txt").write_text(f"# started {t:.4f}\n{o}")


def _poll_apf(stop: threading.Event):
    lc = STATE["lc"]
    rows = []
    while not stop.is_set():
        t = time.time()
        try:
            text = _get(lc.cp, "/debug/api_priority_and_fairness/dump_requests?includeRequestDetails=1", 2)
        except Exception as exc:  # noqa: BLE001
            text = f"error {exc}"
        rows.append({"t": t, "t_done": time.time(), "text": text})
        stop.wait(0.04)
    (OUT / "apf-dump-requests.json").write_text(json.dumps(rows))


_orig_obo = bf._one_by_one


async def _one_by_one(api, ns, prefix):
    STATE["calls"] += 1
    lc = STATE["lc"]
    if STATE["calls"] == 1:
        out = await _orig_obo(api, ns, prefix)
        await anyio.to_thread.run_sync(_scrape, "before")
        if PYSPY:
            STATE["rec"] = [subprocess.Popen(
                [SPY, "record", "--pid", str(r.proc.pid), "--rate", "250", "--nonblocking",
                 "--idle", "--format", fmt, "-o", str(OUT / f"record-replica{i}.{ext}")],
                stdout=subprocess.DEVNULL, stderr=open(OUT / f"record-replica{i}-{ext}.err", "w"))
                for i, r in enumerate(lc.replicas)
                for fmt, ext in (("raw", "txt"),)]
            STATE["rec_started"] = time.time()
            await anyio.sleep(1.0)  # py-spy attaches before the flood child starts
        return out
    STATE["flood_phase_start"] = time.time()
    stop = threading.Event()
    poller = threading.Thread(target=_poll_apf, args=(stop,), daemon=True)
    poller.start()
    results = []

    async def side():
        await anyio.sleep(0.04)
        if PYSPY:
            await anyio.to_thread.run_sync(_dump, "b1+40ms")
        await anyio.sleep(0.02)
        await anyio.to_thread.run_sync(_scrape, "during")
        if PYSPY:
            await anyio.to_thread.run_sync(_dump, "b1+later")

    async with anyio.create_task_group() as tg:
        tg.start_soon(side)
        for i in range(bf.B_VMIS):
            results.append(await bf._create(api, ns, bf._vmi(f"{prefix}-{i}", f"{bf.CLS}=1")))
            if i == 2:
                stop.set()
    poller.join()
    await anyio.sleep(0.5)
    await anyio.to_thread.run_sync(_scrape, "after")
    if PYSPY:
        for p in STATE["rec"]:
            p.send_signal(signal.SIGINT)
        for p in STATE["rec"]:
            p.wait(timeout=30)
        STATE["rec_stopped"] = time.time()
    return results


bf._one_by_one = _one_by_one

_orig_measure = bf._measure


async def _measure(lc, workdir, report):
    STATE["lc"] = lc
    await _orig_measure(lc, workdir, report)


bf._measure = _measure

if __name__ == "__main__":
    report = bf.run(OUT)
    for line in bf.summary(report):
        print(line)
    side = {k: v for k, v in STATE.items() if k not in ("lc", "rec")}
    (OUT / "probe-driver.json").write_text(json.dumps(side, indent=1, default=str))
