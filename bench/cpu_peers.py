#!/usr/bin/env python3
"""CPU side-by-side (issue 29): kiln's CPU backend vs its reference backend vs onnxruntime, fp32.

    python3 bench/cpu_peers.py --kiln build/kiln --models DIR [--only NAME,...] [--iterations N] [--warmup N]
                               [--out results.json]

Models: efficientnet-lite0 (the bundled models/efficientnet-lite0/model.onnx) and, from DIR,
resnet50, mobilenetv2 and bert-base-s128 (written by bench/cpu_models.py first when missing).
Per model, on one fixed random input set (numpy, seed 0: N(0,1) images; BERT: token ids uniform in
[0, 30522), attention_mask ones but the last 16 positions, token_type_ids zeros), saved as
<input name>.npy in a temporary folder:

  1. kiln run MODEL --device cpu --input NAME=FILE.npy ... --warmup W --iterations N --output-dir D1
  2. the same with --device cpu-ref (the reference backend), 1 warm-up and 3 iterations, into D2;
     latency is read from kiln's line "latency: median X ms, p99 Y ms, min Z ms over ...";
  3. onnxruntime (CPUExecutionProvider, default session options and thread count) on the same
     inputs, W warm-ups and N timed runs, each timed with time.perf_counter; then --rounds more
     rounds of (kiln cpu, onnxruntime), each W + N runs: on a shared machine whose speed drifts
     between runs, the median of the per-round ratios is the one to quote;
  4. kiln cpu's outputs (one .npy per output in D1) against kiln cpu-ref's and onnxruntime's:
     max |difference| and relative L2 error ||a - b|| / ||b||.

Medians and p99s are nearest-rank (kiln's rule). A model FAILS when kiln does not run, an output
is missing or has another shape, any output holds NaN / Inf, or rel-L2 vs cpu-ref exceeds 1e-4.
Prints a markdown table with the machine's facts and the command line, writes the same to --out
(JSON, rewritten after every model), and exits 1 when any model failed.
"""
import argparse
import datetime
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
BUNDLED = {"efficientnet-lite0": os.path.join(ROOT, "models", "efficientnet-lite0", "model.onnx")}
GENERATED = ("resnet50", "mobilenetv2", "bert-base-s128")  # by cpu_models.py
MODELS = tuple(BUNDLED) + GENERATED
REF_WARMUP, REF_ITERATIONS = 1, 3
REL_L2_LIMIT = 1e-4
BERT_SEQ, BERT_VOCAB, BERT_PADDING = 128, 30522, 16
LATENCY = re.compile(r"latency: median ([0-9.]+) ms, p99 ([0-9.]+) ms, min ([0-9.]+) ms")
BUILD = re.compile(r"import \+ build: ([0-9.]+) ms")


def npy_stem(name):
    """kiln's file name for a tensor (npy_file_stem): characters other than [A-Za-z0-9._-] become '_'."""
    stem = re.sub(r"[^A-Za-z0-9._-]", "_", name)
    return "_" + stem if stem in ("", ".", "..") else stem


def nearest_rank(times, p):
    ordered = sorted(times)
    return ordered[min(len(ordered), max(1, int(np.ceil(p / 100 * len(ordered))))) - 1]


def make_inputs(name):
    rng = np.random.default_rng(0)
    if name.startswith("bert"):
        mask = np.ones((1, BERT_SEQ), np.int64)
        mask[:, -BERT_PADDING:] = 0
        return {"input_ids": rng.integers(0, BERT_VOCAB, (1, BERT_SEQ), dtype=np.int64), "attention_mask": mask,
                "token_type_ids": np.zeros((1, BERT_SEQ), np.int64)}
    return {"input": rng.standard_normal((1, 3, 224, 224), dtype=np.float32)}


def run_kiln(kiln, model, device, input_files, warmup, iterations, out_dir, timeout):
    """One `kiln run`; returns its timings and outputs ({file stem: array}), or an "error" entry."""
    cmd = [kiln, "run", model, "--device", device]
    for name, path in input_files.items():
        cmd += ["--input", f"{name}={path}"]
    cmd += ["--warmup", str(warmup), "--iterations", str(iterations), "--output-dir", out_dir]
    result = {"command": shlex.join(cmd)}
    print("  $ " + result["command"], flush=True)
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return dict(result, error=f"timed out after {timeout} s")
    result.update(stdout=p.stdout, stderr=p.stderr, returncode=p.returncode)
    if p.stderr.strip():
        print("  kiln stderr:\n" + "\n".join("    " + line for line in p.stderr.strip().splitlines()), flush=True)
    latency = LATENCY.search(p.stdout)
    if p.returncode != 0 or not latency:
        return dict(result, error=f"kiln exited {p.returncode}" + ("" if latency else ", no latency line"))
    result.update(median_ms=float(latency[1]), p99_ms=float(latency[2]), min_ms=float(latency[3]))
    build, backend = BUILD.search(p.stdout), re.search(r"^backend: (.*)$", p.stdout, re.M)
    result["build_ms"] = float(build[1]) if build else None
    result["backend"] = backend[1] if backend else None  # what kiln says ran, to catch a silent fallback
    result["outputs"] = {f[:-4]: np.load(os.path.join(out_dir, f)) for f in sorted(os.listdir(out_dir)) if f.endswith(".npy")}
    return result


def time_onnxruntime(model, feeds, warmup, iterations):
    import onnxruntime as ort
    t0 = time.perf_counter()
    session = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    result = {"session_ms": (time.perf_counter() - t0) * 1e3}
    names = [o.name for o in session.get_outputs()]
    for _ in range(warmup):
        session.run(names, feeds)
    times = []
    for _ in range(iterations):
        t0 = time.perf_counter()
        outputs = session.run(names, feeds)
        times.append((time.perf_counter() - t0) * 1e3)
    result.update(median_ms=nearest_rank(times, 50), p99_ms=nearest_rank(times, 99), min_ms=min(times),
                  outputs={npy_stem(n): o for n, o in zip(names, outputs)})
    return result


def time_rounds(args, model, files, feeds, work):
    """Rounds of kiln (the CLI, its own process) then onnxruntime (this process), each its warm-up
    and timed runs: on a shared machine whose speed drifts, the median over rounds of each round's
    ratio compares the two at the same moment. Two thread pools never run in one process (each
    would spin on the two cores while the other works)."""
    ratios, pooled = [], {"kiln": [], "onnxruntime": []}
    for r in range(args.rounds):
        k = run_kiln(args.kiln, model, "cpu", files, args.warmup, args.iterations, os.path.join(work, f"round{r}"),
                     args.kiln_timeout)
        o = time_onnxruntime(model, feeds, args.warmup, args.iterations)
        if "median_ms" not in k:
            return {"error": k.get("error", "no latency")}
        pooled["kiln"].append(k["median_ms"])
        pooled["onnxruntime"].append(o["median_ms"])
        ratios.append(k["median_ms"] / o["median_ms"])
    return {"rounds": args.rounds, "kiln_round_medians_ms": pooled["kiln"], "onnxruntime_round_medians_ms": pooled["onnxruntime"],
            "ratio_median": nearest_rank(ratios, 50), "ratio_min": min(ratios), "ratio_max": max(ratios)}


def compare(outputs, reference, label, failures):
    """Max |a - b| and rel-L2 over the reference's outputs; a missing output or shape mismatch is a failure."""
    report = {}
    for name, ref in reference.items():
        got = outputs.get(name)
        if got is None or got.shape != ref.shape:
            failures.append(f"output {name}: " + ("missing" if got is None else f"shape {got.shape} vs {ref.shape} ({label})"))
            continue
        diff = got.astype(np.float64) - ref.astype(np.float64)
        report[name] = {"max_abs": float(np.abs(diff).max()),
                        "rel_l2": float(np.linalg.norm(diff) / max(np.linalg.norm(ref.astype(np.float64)), 1e-30))}
    return {"per_output": report,
            "max_abs": max((r["max_abs"] for r in report.values()), default=None),
            "rel_l2": max((r["rel_l2"] for r in report.values()), default=None)}


def bench_model(name, model, args, work):
    """Runs the three timings and the checks for one model; returns its JSON entry."""
    entry = {"model": name, "path": model, "failures": []}
    failures = entry["failures"]
    in_dir = os.path.join(work, name, "inputs")
    os.makedirs(in_dir)
    feeds = make_inputs(name)
    files = {}
    for input_name, value in feeds.items():
        files[input_name] = os.path.join(in_dir, npy_stem(input_name) + ".npy")
        np.save(files[input_name], value)

    runs = {}
    for device, warmup, iterations in (("cpu", args.warmup, args.iterations), ("cpu-ref", REF_WARMUP, REF_ITERATIONS)):
        run = run_kiln(args.kiln, model, device, files, warmup, iterations, os.path.join(work, name, device),
                       args.kiln_timeout)
        if "error" in run:
            failures.append(f"kiln --device {device}: {run['error']}")
        runs[device] = run
    runs["onnxruntime"] = time_onnxruntime(model, feeds, args.warmup, args.iterations)
    if args.rounds > 0:
        entry["rounds"] = time_rounds(args, model, files, feeds, os.path.join(work, name, "rounds"))

    for label, run in runs.items():
        for out_name, value in run.get("outputs", {}).items():
            if np.issubdtype(value.dtype, np.floating) and not np.isfinite(value).all():
                failures.append(f"{label} output {out_name} has non-finite values")
    cpu = runs["cpu"].get("outputs")
    if cpu is not None:
        entry["vs_onnxruntime"] = compare(cpu, runs["onnxruntime"]["outputs"], "vs onnxruntime", failures)
        if "outputs" in runs["cpu-ref"]:
            entry["vs_cpu_ref"] = compare(cpu, runs["cpu-ref"]["outputs"], "vs cpu-ref", failures)
            rel = entry["vs_cpu_ref"]["rel_l2"]
            if rel is not None and rel > REL_L2_LIMIT:
                failures.append(f"rel-L2 vs cpu-ref {rel:.3g} > {REL_L2_LIMIT:g}")
    for run in runs.values():
        run.pop("outputs", None)
    entry.update(kiln_cpu=runs["cpu"], kiln_cpu_ref=runs["cpu-ref"], onnxruntime=runs["onnxruntime"])
    return entry


def machine_facts(kiln):
    import onnxruntime as ort
    cpu = "unknown"
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break

    def output_of(cmd):
        try:
            return subprocess.run(cmd, capture_output=True, text=True, timeout=60).stdout.strip() or None
        except OSError:
            return None
    return {"nproc": len(os.sched_getaffinity(0)), "cpu": cpu, "onnxruntime": ort.__version__,
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "kiln_version": output_of([kiln, "--version"]),
            "commit": output_of(["git", "-C", ROOT, "describe", "--always", "--dirty"])}


def fmt(x, spec=".2f"):
    return "-" if x is None else format(x, spec)


def table(results):
    rows = ["| model | kiln cpu median / p99 ms | onnxruntime median / p99 ms | kiln/ORT | kiln/ORT per round: median (min..max) "
            "| kiln cpu-ref median ms | rel-L2 vs cpu-ref | rel-L2 vs ORT | check |",
            "|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        cpu, ref, ort = r["kiln_cpu"], r["kiln_cpu_ref"], r["onnxruntime"]
        ratio = cpu["median_ms"] / ort["median_ms"] if "median_ms" in cpu else None
        rd = r.get("rounds", {})
        rd_text = (f"{fmt(rd['ratio_median'])}x ({fmt(rd['ratio_min'])}..{fmt(rd['ratio_max'])}, {rd['rounds']} rounds)"
                   if "ratio_median" in rd else "-")
        rows.append(f"| {r['model']} | {fmt(cpu.get('median_ms'))} / {fmt(cpu.get('p99_ms'))} "
                    f"| {fmt(ort['median_ms'])} / {fmt(ort['p99_ms'])} | {fmt(ratio)}x | {rd_text} "
                    f"| {fmt(ref.get('median_ms'), '.1f')} "
                    f"| {fmt(r.get('vs_cpu_ref', {}).get('rel_l2'), '.2e')} | {fmt(r.get('vs_onnxruntime', {}).get('rel_l2'), '.2e')} "
                    f"| {'FAIL' if r['failures'] else 'PASS'} |")
    return "\n".join(rows)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kiln", required=True, help="the kiln binary, e.g. build/kiln")
    ap.add_argument("--models", required=True, help="folder of the generated models (written by cpu_models.py when missing)")
    ap.add_argument("--only", default=",".join(MODELS), help="comma-separated subset of " + ", ".join(MODELS))
    ap.add_argument("--iterations", type=int, default=20, help="timed runs of kiln cpu and onnxruntime (default 20)")
    ap.add_argument("--warmup", type=int, default=5, help="untimed runs before timing (default 5)")
    ap.add_argument("--kiln-timeout", type=int, default=1800, help="seconds one kiln run may take (default 1800)")
    ap.add_argument("--out", help="write the results here as JSON")
    ap.add_argument("--rounds", type=int, default=5,
                    help="rounds of kiln then onnxruntime after the main runs, for the ratio at the same moment (default 5; 0: none)")
    args = ap.parse_args()
    names = [n for n in args.only.split(",") if n]
    unknown = [n for n in names if n not in MODELS]
    if unknown:
        ap.error(f"unknown model(s) {', '.join(unknown)}; choose from {', '.join(MODELS)}")
    if not (os.path.isfile(args.kiln) and os.access(args.kiln, os.X_OK)):
        ap.error(f"--kiln {args.kiln}: not an executable file")
    if args.iterations < 1 or args.warmup < 0:
        ap.error("--iterations must be at least 1 and --warmup not negative")

    paths = {n: BUNDLED.get(n) or os.path.join(args.models, n + ".onnx") for n in names}
    missing = [n for n in names if not os.path.exists(paths[n])]
    if missing:
        subprocess.run([sys.executable, os.path.join(HERE, "cpu_models.py"), "--out", args.models,
                        "--only", ",".join(missing)], check=True)

    report = {"command": shlex.join([sys.executable] + sys.argv), "machine": machine_facts(args.kiln),
              "settings": {"warmup": args.warmup, "iterations": args.iterations, "ref_warmup": REF_WARMUP,
                           "ref_iterations": REF_ITERATIONS, "rel_l2_limit": REL_L2_LIMIT},
              "results": []}
    with tempfile.TemporaryDirectory(prefix="kiln-cpu-peers-") as work:
        for name in names:
            print(f"{name}: {paths[name]}", flush=True)
            report["results"].append(bench_model(name, paths[name], args, work))
            for failure in report["results"][-1]["failures"]:
                print(f"  FAIL: {failure}", flush=True)
            if args.out:
                with open(args.out, "w") as f:
                    json.dump(report, f, indent=2)

    m = report["machine"]
    print(f"\n{m['date']}, {m['cpu']}, nproc {m['nproc']}, onnxruntime {m['onnxruntime']}, "
          f"kiln {m['kiln_version'] or '?'} (commit {m['commit'] or '?'})")
    print(f"command: {report['command']}")
    print(f"kiln cpu and onnxruntime: {args.warmup} warm-up, {args.iterations} timed; kiln cpu-ref: "
          f"{REF_WARMUP} warm-up, {REF_ITERATIONS} timed; FAIL when rel-L2 vs cpu-ref > {REL_L2_LIMIT:g} or non-finite\n")
    print(table(report["results"]))
    report["table"] = table(report["results"])
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=2)
    return 1 if any(r["failures"] for r in report["results"]) else 0


if __name__ == "__main__":
    sys.exit(main())
