#!/usr/bin/env python3
"""The fast CPU backend against the reference kernels on a folder of ONNX models, one seeded input
each: `--device cpu` (oneDNN) vs `--device cpu-ref`, the worst output's relative L2 error and the
fast engine's median latency (5 runs, host clock). Symbolic batch dims are bound to 1.

    PYTHONPATH=build/python-site python3 bench/cpu_fast_check.py /tmp/zoo-cpu
"""
import glob
import os
import sys
import time

import numpy as np

import kiln


def feed_for(engine, seed=2):
    rng = np.random.default_rng(seed)
    feed = {}
    for i in engine.inputs:
        shape = [d if d >= 0 else 1 for d in i.shape]
        if "int" in i.dtype:
            feed[i.name] = rng.integers(0, 100, shape).astype(i.dtype)
        else:
            feed[i.name] = rng.standard_normal(shape).astype(np.float32)
    return feed


def main():
    folder = sys.argv[1] if len(sys.argv) > 1 else "/tmp/zoo-cpu"
    failed = 0
    for path in sorted(glob.glob(os.path.join(folder, "*.onnx"))):
        name = os.path.basename(path)[:-5]
        try:
            outs, ms = {}, 0.0
            for dev in ("cpu", "cpu-ref"):
                e = kiln.build(path, device=dev, batch=1)
                s = e.create_session()
                feed = feed_for(e)
                outs[dev] = s.run(None, feed)
                if dev == "cpu":
                    t = []
                    for _ in range(5):
                        a = time.perf_counter()
                        s.run(None, feed)
                        t.append((time.perf_counter() - a) * 1e3)
                    ms = float(np.median(t))
            worst = max(float(np.linalg.norm(a.astype(np.float64) - b) / max(np.linalg.norm(b), 1e-30))
                        for a, b in zip(outs["cpu"], outs["cpu-ref"]))
            print(f"{name:22s} fast {ms:8.2f} ms  rel-L2 vs reference {worst:.1e}", flush=True)
        except Exception as ex:  # noqa: BLE001 - reported per model
            failed += 1
            print(f"{name:22s} ERROR {str(ex)[:200]}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
