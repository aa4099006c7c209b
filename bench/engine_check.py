"""Engine files on the GPU (issue 23): build, save, load, bit-identity, load time, and speed against
an older kiln, for the benchmark models, in one device call.

    python3 bench/engine_check.py --kiln .gpu/kiln [--old .gpu/kiln-old] [--models resnet50,bert]
        [--batch 1|large] [--rounds 3] [--iters 200] [--out DIR]

Per model (exported as peers.py exports it: same weights, same ONNX) and batch:
  1. `kiln build --fp16 --batch B -o m.kiln` with an empty timing cache (cold build) and again with
     the cache it filled (warm build): wall times, and whether both chose the same kernels (the
     placement reports, timings stripped, are compared).
  2. `kiln run m.kiln` in a fresh process, twice: "load" (read, check, the device plan bound:
     weights uploaded, descriptors made; session and graph ready) and the first
     inference's time, as the CLI prints them, plus the whole process's wall time.
  3. `kiln run m.onnx` (built in that process) and `kiln run m.kiln` on the same seeded inputs:
     outputs compared byte for byte.
  4. `kiln bench` of the ONNX model with the older kiln, the ONNX model and the engine file with this
     kiln, alternating for --rounds rounds: median and p99 per round.
Prints a markdown table; writes OUT/engine_check.json.
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peers  # noqa: E402  (the exporter and models of the peer benchmark)


def sh(cmd, env=None, timeout=900):
    t0 = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
    return p.returncode, p.stdout + p.stderr, time.perf_counter() - t0


def export(name, out):
    import torch
    model, names, vocab = peers.build_model(name)
    inputs = peers.make_inputs(names, vocab, 2)
    path = os.path.join(out, f"{name}.onnx")
    peers.export_onnx(model, inputs, path)
    with torch.inference_mode():
        shape = model(**inputs).shape
    peers.pin_output_dims(path, shape[1:])
    return path


def placements(report):
    """The report's node lines with timings stripped: which kernel each node got."""
    lines = [l for l in report.splitlines() if l.startswith("  ") and ("cuda" in l or "cpu" in l)]
    return [re.sub(r"[0-9.]+ us|compiled by NVRTC|from the disk cache", "", l) for l in lines]


def bench(kiln, model, batch, iters, env, out_json, is_engine):
    cmd = [kiln, "bench", model, "--warmup", "50", "--iterations", str(iters), "--json", out_json]
    if not is_engine:
        cmd += ["--fp16", "--batch", str(batch)]
    rc, log, _ = sh(cmd, env)
    if rc != 0:
        return {"error": log.strip().splitlines()[-1] if log.strip() else f"exit {rc}"}
    j = json.load(open(out_json))
    return {"median_ms": j["median_ms"], "p99_ms": j["p99_ms"]}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kiln", required=True)
    ap.add_argument("--old", default=None)
    ap.add_argument("--models", default="resnet50,mobilenet_v2,vit_b_16,bert,gpt2")
    ap.add_argument("--batch", default="1", help="1, or 'large' (peers.py's large batch per model)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--iters", type=int, default=200)
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/engine-check"))
    args = ap.parse_args()
    work = "/tmp/engine-check-work"
    os.makedirs(work, exist_ok=True)
    os.makedirs(args.out, exist_ok=True)
    env = dict(os.environ, KILN_CACHE_DIR=os.path.join(work, "cache"))
    results = []
    for name in args.models.split(","):
        b = peers.LARGE_BATCH[name] if args.batch == "large" else int(args.batch)
        r = {"model": name, "batch": b}
        results.append(r)
        try:
            onnx = export(name, work)
            eng = os.path.join(work, f"{name}_b{b}.kiln")
            shutil.rmtree(env["KILN_CACHE_DIR"], ignore_errors=True)
            rc, log1, t_cold = sh([args.kiln, "build", onnx, "--fp16", "--batch", str(b), "--report", "-o", eng], env)
            if rc != 0:
                raise RuntimeError("build: " + log1.strip().splitlines()[-1])
            rc, log2, t_warm = sh([args.kiln, "build", onnx, "--fp16", "--batch", str(b), "--report", "-o", eng + ".2"], env)
            with open(os.path.join(args.out, f"reports_{args.batch}.txt"), "a") as f:
                for tag, log in (("cold", log1), ("warm", log2)):
                    f.write(f"==== {name} b{b} {tag} build\n{log}\n")
            r.update(build_cold_s=t_cold, build_warm_s=t_warm, same_kernels=placements(log1) == placements(log2),
                     engine_mib=os.path.getsize(eng) / 2**20,
                     cache_line=next((l for l in log2.splitlines() if l.startswith("timing cache")), ""))
            loads = []
            for i in range(2):
                rc, log, wall = sh([args.kiln, "run", eng, "--random-inputs", "--seed", "1"], env)
                m1 = re.search(r"load: ([0-9.]+) ms", log)
                m2 = re.search(r"latency: median ([0-9.]+) ms", log)
                if rc != 0 or not m1 or not m2:
                    raise RuntimeError("run engine: " + log.strip()[-300:])
                m3 = re.search(r"loaded in .*", log)
                loads.append({"load_ms": float(m1.group(1)), "first_run_ms": float(m2.group(1)), "process_s": wall,
                              "phases": m3.group(0) if m3 else ""})
            r["loads"] = loads
            a, bdir = os.path.join(work, f"{name}_onnx_out"), os.path.join(work, f"{name}_engine_out")
            for d in (a, bdir):
                shutil.rmtree(d, ignore_errors=True)
            rc1, l1, _ = sh([args.kiln, "run", onnx, "--fp16", "--batch", str(b), "--random-inputs", "--seed", "1",
                             "--output-dir", a], env)
            rc2, l2, _ = sh([args.kiln, "run", eng, "--random-inputs", "--seed", "1", "--output-dir", bdir], env)
            if rc1 or rc2:
                raise RuntimeError("run for identity: " + (l1 if rc1 else l2).strip()[-300:])
            r["bit_identical"] = all(open(os.path.join(a, f), "rb").read() == open(os.path.join(bdir, f), "rb").read()
                                     for f in os.listdir(a))
            r["rounds"] = []
            for k in range(args.rounds):
                row = {}
                if args.old:
                    row["old_onnx"] = bench(args.old, onnx, b, args.iters, env, os.path.join(work, "o.json"), False)
                row["new_onnx"] = bench(args.kiln, onnx, b, args.iters, env, os.path.join(work, "n.json"), False)
                row["new_engine"] = bench(args.kiln, eng, b, args.iters, env, os.path.join(work, "e.json"), True)
                r["rounds"].append(row)
        except Exception as e:  # keep the other models' rows
            r["error"] = str(e)[-400:]
        print(json.dumps(r), flush=True)
        json.dump(results, open(os.path.join(args.out, f"engine_check_{args.batch}.json"), "w"), indent=1)

    print("\n| model | batch | build cold / warm s | same kernels | engine MiB | load + 1st run ms (1st, 2nd process) "
          "| bit-identical | old .onnx median/p99 | new .onnx | new .kiln |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in results:
        if "error" in r:
            print(f"| {r['model']} | {r['batch']} | error: {r['error'][:200]} |")
            continue
        def col(key):
            v = [x[key] for x in r["rounds"] if key in x and "error" not in x[key]]
            if not v:
                errs = [x[key]["error"] for x in r["rounds"] if key in x]
                return errs[0][:80] if errs else "-"
            return " ".join(f"{x['median_ms']:.3f}/{x['p99_ms']:.3f}" for x in v)
        lo = " ; ".join(f"{x['load_ms']:.0f}+{x['first_run_ms']:.1f}" for x in r["loads"])
        print(f"| {r['model']} | {r['batch']} | {r['build_cold_s']:.1f} / {r['build_warm_s']:.1f} | {r['same_kernels']} | "
              f"{r['engine_mib']:.0f} | {lo} | {r['bit_identical']} | {col('old_onnx')} | {col('new_onnx')} | "
              f"{col('new_engine')} |")


if __name__ == "__main__":
    main()
