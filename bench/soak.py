#!/usr/bin/env python3
"""Memory that never grows (issue 30): continuous inference and session churn, resident memory sampled.

    PYTHONPATH=build/python-site python3 bench/soak.py [--minutes 30] [--device cpu] [--model M.onnx]

1. Churn: 1,000 sessions created, run once and destroyed, then 50 engines built and destroyed;
   resident memory (VmRSS) before and after each, after a warm-up of the same.
2. Soak: one session runs the model back to back for --minutes; VmRSS sampled every 15 s. Growth is
   judged on the second half (allocators and caches settle in the first): the least-squares slope and
   the largest minus the first sample of that half.
Prints a table and exits 1 when the churn grew by more than 16 MiB or the soak's second half by more than
8 MiB (the bounds are a few allocator arenas: a leak of one output per run would pass them within minutes).
On a GPU, --device cuda adds the device memory in use (nvidia-smi) to each sample.
"""
import argparse
import os
import subprocess
import sys
import time

import numpy as np

import kiln

HERE = os.path.dirname(os.path.abspath(__file__))


def rss_mib():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def gpu_mib():
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=10).stdout
        return float(out.split()[0])
    except Exception:  # noqa: BLE001 - no GPU tools: not measured
        return float("nan")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=os.path.join(HERE, "..", "models", "efficientnet-lite0", "model.onnx"))
    ap.add_argument("--minutes", type=float, default=30)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--sessions", type=int, default=1000)
    ap.add_argument("--engines", type=int, default=50)
    a = ap.parse_args()
    engine = kiln.build(a.model, device=a.device)
    x = np.random.default_rng(0).uniform(-1, 1, engine.inputs[0].shape).astype(np.float32)
    feed = {engine.inputs[0].name: x}
    ok = True

    def churn(n, make):
        for _ in range(min(50, n)):
            make()
        before = rss_mib()
        t0 = time.time()
        for _ in range(n):
            make()
        return before, rss_mib(), time.time() - t0

    def one_session():
        engine.create_session().run(None, feed)
    b, e, s = churn(a.sessions, one_session)
    print(f"churn: {a.sessions} sessions created, run, destroyed in {s:.0f} s: VmRSS {b:.1f} -> {e:.1f} MiB ({e - b:+.1f})")
    ok &= e - b <= 16
    b, e, s = churn(a.engines, lambda: kiln.build(a.model, device=a.device).create_session().run(None, feed))
    print(f"churn: {a.engines} engines built, run, destroyed in {s:.0f} s: VmRSS {b:.1f} -> {e:.1f} MiB ({e - b:+.1f})")
    ok &= e - b <= 16

    session = engine.create_session()
    samples, runs = [], 0
    t0 = time.time()
    next_sample = t0
    while True:
        now = time.time()
        if now >= next_sample:
            samples.append((now - t0, rss_mib(), gpu_mib() if a.device == "cuda" else float("nan"), runs))
            print(f"  {samples[-1][0] / 60:6.1f} min  VmRSS {samples[-1][1]:8.1f} MiB  runs {runs}", flush=True)
            next_sample += 15
            if now - t0 >= a.minutes * 60:
                break
        session.run(None, feed)
        runs += 1
    half = [s for s in samples if s[0] >= samples[-1][0] / 2]
    t = np.array([s[0] / 60 for s in half])
    r = np.array([s[1] for s in half])
    slope = float(np.polyfit(t, r, 1)[0]) if len(half) > 2 else 0.0
    grow = float(r.max() - r[0])
    print(f"soak: {runs} forwards in {samples[-1][0] / 60:.1f} min on {engine.device}; VmRSS first {samples[0][1]:.1f}, "
          f"last {samples[-1][1]:.1f} MiB; second half: slope {slope:+.3f} MiB/min, largest - first {grow:+.1f} MiB")
    if a.device == "cuda":
        g = [s[2] for s in half]
        print(f"soak: GPU memory used, second half: {min(g):.0f}..{max(g):.0f} MiB")
    ok &= grow <= 8
    print("soak: PASS" if ok else "soak: FAIL")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
