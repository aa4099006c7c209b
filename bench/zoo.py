#!/usr/bin/env python3
"""The zoo (issue 27 item 6): kiln on architectures beyond the five benchmark models.

Per model (bench/zoo_models.py): seeded random weights -> ONNX export (dim 0 of every input "batch")
-> onnxruntime fp32 vs torch (the export's own sanity) -> kiln's build report (nodes on the CPU,
steps per forward) -> kiln's output vs torch fp32 -> timings. On a GPU (--device cuda): kiln fp16
against torch fp16 eager and each torch.compile mode asked for, at batch 1 and the model's large
batch, in the same process. Here without a GPU (--device cpu): kiln's fast CPU backend (fp32)
against onnxruntime.

Writes OUT/zoo.json and OUT/zoo.md after every model (a run cut off keeps what it finished).
Exit code 0 when every model exported, ran wholly on the device, and passed its check.
"""
import argparse, datetime, inspect, json, os, re, shlex, sys, time, traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import zoo_models  # noqa: E402
from peers import describe, percentile, rel_l2, run_cmd  # noqa: E402

TOL = {"cuda": 2e-2, "cpu": 1e-3}  # rel-L2 vs torch fp32: fp16 storage on the GPU, fp32 on the CPU
PEAK_FLOPS, PEAK_BYTES = 800e12, 3.0e12  # H100 dense fp16 and achievable HBM3 (bench/peers.py's)


# ---- export ---------------------------------------------------------------------------------------

def export(model, arch, inputs, path, exporter):
    """fp32 ONNX with dim 0 of every input named "batch". exporter: torchscript (opset 17) or dynamo
    (opset 18); "auto" tries TorchScript, then dynamo. Returns the exporter used."""
    import torch
    names, args = list(inputs), tuple(inputs.values())
    if exporter in ("auto", "torchscript"):
        try:
            torch.onnx.export(model, args, path, input_names=names, output_names=arch.outputs, opset_version=17,
                              dynamic_axes={n: {0: "batch"} for n in names}, do_constant_folding=True, dynamo=False)
            return "torchscript-17"
        except Exception as e:
            if exporter == "torchscript":
                raise
            print(f"  torchscript export failed ({describe(e)}); trying dynamo")
    batch = torch.export.Dim("batch", min=1, max=1024)
    shapes = tuple({0: batch} for _ in names)
    # forward(*args) (zoo_models.hf): torch.export sees one argument, the tuple of them all.
    params = inspect.signature(model.forward).parameters.values()
    if any(p.kind == inspect.Parameter.VAR_POSITIONAL for p in params):
        shapes = (shapes,)
    torch.onnx.export(model, args, path, input_names=names, output_names=arch.outputs, opset_version=18,
                      dynamic_shapes=shapes, dynamo=True, external_data=False)
    return "dynamo-18"


def flat_outputs(y):
    import torch
    ys = y if isinstance(y, (tuple, list)) else (y,)
    return [t.float().cpu().numpy() for t in ys if isinstance(t, torch.Tensor)]


def onnx_ops(path):
    import onnx
    m = onnx.load(path, load_external_data=False)
    return sorted({n.op_type for n in m.graph.node})


def ort_outputs(path, inputs):
    import onnxruntime as ort
    s = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    return s.run(None, {k: v.numpy() for k, v in inputs.items()})


# ---- kiln -----------------------------------------------------------------------------------------

def parse_report(text):
    """The build report's summary: nodes per placement, steps per forward, and the nodes on the CPU."""
    r = {}
    m = re.search(r"nodes: (\d+) on cuda, (\d+) on cpu, (\d+) folded", text)
    if m:
        r["nodes_device"], r["nodes_cpu"], r["nodes_folded"] = map(int, m.groups())
    m = re.search(r"steps per forward: (\d+) \((\d+) on the host\)", text)
    if m:
        r["steps"], r["host_steps"] = map(int, m.groups())
    r["cpu_nodes"] = [l.strip() for l in text.splitlines() if re.match(r"\s+cpu\s", l)][:20]
    return r


def kiln_engine(args, arch, path, batch, tag):
    """kiln build at one batch (fp16 on the GPU): (engine path, report dict) or raises."""
    eng = os.path.join(args.out, f"{arch.name}_b{batch}.kiln")
    cmd = [args.kiln, "build", path, "--batch", str(batch), "--device", args.device, "--report", "-o", eng]
    cmd += ["--fp16"] if args.device == "cuda" else []
    err, out = run_cmd(cmd, args.kiln_timeout)
    if err:
        raise RuntimeError(f"kiln build b{batch}: {err}")
    rep = parse_report(out)
    m = re.search(r"build: ([\d.]+) ms", out)
    rep["build_ms"] = float(m.group(1)) if m else None
    with open(os.path.join(args.out, f"{arch.name}_b{batch}_{tag}report.txt"), "w") as f:
        f.write(out)
    return eng, rep


def kiln_outputs(args, arch, eng, inputs):
    import numpy as np
    d = os.path.join(args.out, f"{arch.name}_check")
    os.makedirs(d, exist_ok=True)
    cmd = [args.kiln, "run", eng, "--output-dir", d]
    for n, t in inputs.items():
        f = os.path.join(d, f"in_{n}.npy")
        np.save(f, t.numpy())
        cmd += ["--input", f"{n}={f}"]
    err, _ = run_cmd(cmd, args.kiln_timeout)
    if err:
        raise RuntimeError(f"kiln run: {err}")
    return [np.load(os.path.join(d, f"{o}.npy")) for o in arch.outputs]


def kiln_bench(args, arch, eng, batch):
    jf = os.path.join(args.out, f"{arch.name}_b{batch}_bench.json")
    cmd = [args.kiln, "bench", eng, "--warmup", str(args.warmup), "--iterations", str(args.iters), "--json", jf]
    err, _ = run_cmd(cmd, args.kiln_timeout)
    if err:
        return {"error": err}
    with open(jf) as f:
        j = json.load(f)
    return {k: j[k] for k in ("median_ms", "p99_ms", "backend", "precision", "gpu_memory_bytes") if k in j}


def kiln_profile(args, arch, eng, batch):
    """kiln bench --profile's per-node table, kept as OUT/<arch>_b<batch>_profile.txt."""
    cmd = [args.kiln, "bench", eng, "--profile", "--top", "30", "--iterations", str(args.iters)]
    err, out = run_cmd(cmd, args.kiln_timeout)
    with open(os.path.join(args.out, f"{arch.name}_b{batch}_profile.txt"), "w") as f:
        f.write(out + (f"\nkiln bench --profile failed: {err}\n" if err else ""))


# ---- peers ----------------------------------------------------------------------------------------

def time_torch(model16, inputs, mode, args):
    """torch fp16 on the GPU: eager or torch.compile(mode) (fresh, static shapes), CUDA events."""
    import torch
    from peers import time_cuda
    vals = tuple(inputs.values())
    with torch.inference_mode():
        fn, res = model16, {}
        if mode != "eager":
            import torch._dynamo
            torch._dynamo.reset()
            fn = torch.compile(model16, mode=None if mode == "default" else mode, dynamic=False)
            t0 = time.perf_counter()
            fn(*vals)
            torch.cuda.synchronize()
            res["compile_s"] = round(time.perf_counter() - t0, 1)
        t = time_cuda(lambda: fn(*vals), 1, args.warmup, args.iters)
    res.update(median_ms=t["median_ms"], p99_ms=t["p99_ms"])
    return res


def time_ort(path, inputs, args):
    import onnxruntime as ort
    s = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    feed = {k: v.numpy() for k, v in inputs.items()}
    for _ in range(args.warmup):
        s.run(None, feed)
    ms = []
    for _ in range(args.iters):
        t0 = time.perf_counter()
        s.run(None, feed)
        ms.append((time.perf_counter() - t0) * 1e3)
    return {"median_ms": percentile(ms, 50), "p99_ms": percentile(ms, 99)}


def floor_ms(flops, params, batch):
    """max(compute at the fp16 peak, fp16 weights at the HBM rate): a lower bound, activations aside."""
    return max(flops * batch / PEAK_FLOPS, 2 * params / PEAK_BYTES) * 1e3


# ---- per model ------------------------------------------------------------------------------------

def compare(got, ref, tol):
    """Worst rel-L2 over the outputs; NaN anywhere the reference has none fails."""
    import numpy as np
    worst = 0.0
    for g, r in zip(got, ref):
        if np.isnan(g).any() and not np.isnan(r).any():
            return float("nan")
        worst = max(worst, rel_l2(g, r))
    return worst


def run_model(args, arch):
    import torch
    rec = {"model": arch.name, "family": arch.family, "what": arch.what, "errors": [], "rows": []}
    model, vocab = zoo_models.build(arch)
    rec["params"] = sum(p.numel() for p in model.parameters())
    path = os.path.join(args.out, f"{arch.name}.onnx")
    x1, x2 = (zoo_models.make_inputs(arch, vocab, b) for b in (1, 2))
    dev = "cuda" if args.device == "cuda" else "cpu"
    if dev == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
        model = model.cuda()
    with torch.inference_mode():  # before the export: an exporter may leave the module changed
        ref = flat_outputs(model(*[v.to(dev) for v in x1.values()]))
    t0 = time.perf_counter()
    rec["exporter"] = export(model.cpu(), arch, x2, path, args.exporter)
    model = model.to(dev)
    rec["export_s"] = round(time.perf_counter() - t0, 1)
    rec["onnx_nodes"] = len(__import__("onnx").load(path, load_external_data=False).graph.node)
    rec["ops"] = onnx_ops(path)
    if len(ref) != len(arch.outputs):
        raise RuntimeError(f"{len(ref)} outputs, the registry names {len(arch.outputs)}")
    try:
        rec["ort_rel_l2"] = compare(ort_outputs(path, x1), ref, 1.0)
    except Exception as e:
        rec["ort_rel_l2"] = None
        rec["errors"].append("onnxruntime: " + describe(e))
    from torch.utils.flop_counter import FlopCounterMode
    with torch.inference_mode(), FlopCounterMode(display=False) as fc:
        model(*[v.to(dev) for v in x1.values()])
    rec["gflops_b1"] = fc.get_total_flops() / 1e9
    print(f"  {rec['exporter']} in {rec['export_s']} s, {rec['onnx_nodes']} nodes, {rec['params'] / 1e6:.1f} M params, "
          f"{rec['gflops_b1']:.2f} GFLOP, onnxruntime rel-L2 {rec['ort_rel_l2']}")

    batches = [1] if args.batch1_only else [arch.large] if args.large_only else [1, arch.large]
    model16 = None
    if dev == "cuda":  # torch's own fp16 error: the yardstick for kiln's
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
        model16 = model.half()
        with torch.inference_mode():
            rec["torch_fp16_rel_l2"] = compare(flat_outputs(model16(*[
                (v.half() if v.is_floating_point() else v).cuda() for v in x1.values()])), ref, 1.0)
    for b in batches:
        row = {"batch": b}
        rec["rows"].append(row)
        if dev == "cuda":
            row["floor_ms"] = floor_ms(rec["gflops_b1"] * 1e9, rec["params"], b)
        try:
            eng, rep = kiln_engine(args, arch, path, b, "")
            row["kiln_report"] = rep
            if rep.get("nodes_cpu"):
                rec["errors"].append(f"b{b}: {rep['nodes_cpu']} node(s) on the CPU: " + "; ".join(rep["cpu_nodes"][:3]))
            if b == 1:
                got = kiln_outputs(args, arch, eng, x1)
                rec["check_rel_l2"] = compare(got, ref, 1.0)
                ok = rec["check_rel_l2"] < max(TOL[dev], 2 * rec.get("torch_fp16_rel_l2", 0))
                rec["check"] = "PASS" if ok else "FAIL"
                if not ok:
                    rec["errors"].append(f"check: rel-L2 {rec['check_rel_l2']:.3g} (torch fp16: "
                                         f"{rec.get('torch_fp16_rel_l2', float('nan')):.3g})")
            row["kiln"] = kiln_bench(args, arch, eng, b)
            if args.profile:
                kiln_profile(args, arch, eng, b)
            os.remove(eng)
        except Exception as e:
            row["kiln"] = {"error": describe(e)}
            rec["errors"].append(f"b{b} kiln: {describe(e)}")
            rec.setdefault("check", "ERROR")
        xb = zoo_models.make_inputs(arch, vocab, b)
        if dev == "cpu":
            row["onnxruntime"] = time_ort(path, xb, args)
        elif args.modes:
            x16 = {k: (v.half() if v.is_floating_point() else v).cuda() for k, v in xb.items()}
            for mode in args.modes:
                try:
                    row[mode] = time_torch(model16, x16, mode, args)
                except Exception as e:
                    row[mode] = {"error": describe(e)}
                    rec["errors"].append(f"b{b} torch {mode}: {describe(e)}")
            del x16
            torch.cuda.empty_cache()
        print("  b%d: " % b + ", ".join(f"{k} {v.get('median_ms', float('nan')):.3f} ms" for k, v in row.items()
                                          if isinstance(v, dict) and "median_ms" in v))
    return rec


# ---- report ---------------------------------------------------------------------------------------

def fmt(x, spec=".3f"):
    return "-" if x is None else ("nan" if x != x else format(x, spec))


def table(records, modes, device):
    peers = modes if device == "cuda" else ["onnxruntime"]
    cols = ["model", "family", "batch", "kiln ms", "kiln p99"] + [f"{m} ms" for m in peers] + [
        "best peer / kiln", "check rel-L2", "nodes on CPU", "steps"] + (["floor ms"] if device == "cuda" else [])
    out = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in records:
        for row in r.get("rows") or [{"batch": "-"}]:
            k = (row.get("kiln") or {}).get("median_ms")
            times = [(row.get(m) or {}).get("median_ms") for m in peers]
            best = min((t for t in times if t), default=None)
            rep = row.get("kiln_report") or {}
            cells = [r["model"], r.get("family", ""), str(row["batch"]), fmt(k), fmt((row.get("kiln") or {}).get("p99_ms"))]
            cells += [fmt(t) for t in times]
            cells += [fmt(best / k, ".2f") + "x" if best and k else "-",
                      fmt(r.get("check_rel_l2"), ".1e") if row["batch"] == 1 else "",
                      str(rep.get("nodes_cpu", "-")), str(rep.get("steps", "-"))]
            cells += [fmt(row.get("floor_ms"))] if device == "cuda" else []
            out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out)


def write(args, hdr, records):
    with open(os.path.join(args.out, "zoo.json"), "w") as f:
        json.dump({"header": hdr, "models": records}, f, indent=1, default=str)
    md = ["# kiln zoo", ""] + [f"- {k}: {v}" for k, v in hdr.items()] + ["", table(records, args.modes, args.device), ""]
    md += [f"- {r['model']}: {e}" for r in records for e in r["errors"]]
    with open(os.path.join(args.out, "zoo.md"), "w") as f:
        f.write("\n".join(md) + "\n")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--kiln", default="build/kiln")
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    p.add_argument("--models", default="all", help="comma list from: " + ",".join(zoo_models.BY_NAME))
    p.add_argument("--out", default="/tmp/kiln-zoo")
    p.add_argument("--modes", default="eager,default,reduce-overhead",
                   help="torch modes timed on the GPU: eager, default, reduce-overhead, max-autotune ('' for none)")
    p.add_argument("--exporter", choices=["auto", "torchscript", "dynamo"], default="auto")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--batch1-only", action="store_true")
    g.add_argument("--large-only", action="store_true", help="only each model's large batch")
    p.add_argument("--iters", type=int, default=100)
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--kiln-timeout", type=int, default=600)
    p.add_argument("--commit", default=None)
    p.add_argument("--profile", action="store_true", help="also keep kiln bench --profile's table per engine")
    args = p.parse_args(argv)
    args.modes = [m for m in args.modes.split(",") if m]
    names = list(zoo_models.BY_NAME) if args.models == "all" else args.models.split(",")
    bad = [n for n in names if n not in zoo_models.BY_NAME]
    if bad:
        p.error(f"unknown model(s) {bad}")
    os.makedirs(args.out, exist_ok=True)
    args.kiln = os.path.abspath(args.kiln)
    import torch
    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("zoo.py --device cuda needs a CUDA GPU")
    hdr = {"device": torch.cuda.get_device_name() if args.device == "cuda" else f"cpu ({os.cpu_count()} cores)",
           "date_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
           "commit": args.commit, "torch": torch.__version__, "command": shlex.join([sys.executable] + sys.argv),
           "precision": "kiln fp16, torch fp16; check vs torch fp32 (TF32 off)" if args.device == "cuda" else "fp32"}
    records = []
    for n in names:
        print(f"== {n}", flush=True)
        try:
            rec = run_model(args, zoo_models.BY_NAME[n])
        except Exception as e:
            traceback.print_exc()
            rec = {"model": n, "family": zoo_models.BY_NAME[n].family, "rows": [], "errors": [describe(e)]}
        records.append(rec)
        write(args, hdr, records)
        if args.device == "cuda":
            torch.cuda.empty_cache()
    print(table(records, args.modes, args.device))
    for r in records:
        for e in r["errors"]:
            print(f"error: {r['model']}: {e}")
    return 1 if any(r["errors"] for r in records) else 0


if __name__ == "__main__":
    sys.exit(main())
