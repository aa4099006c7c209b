#!/usr/bin/env python3
"""Quantized models on the GPU (issue 25): QDQ ONNX from onnxruntime's quantize_static and from
`kiln quantize`, built by kiln (--fp16) and timed against the same model's 16-bit engine.

On the GPU machine (torch, transformers, onnx and onnxruntime there):
    python3 bench/quant_gpu.py --kiln BIN/kiln --out DIR [--models bert,resnet50] [--batches 1,64]
Per model (seeded random weights, bench/peers.py's export): fp32 ONNX -> QDQ variants
  ort-s8s8:  quantize_static(QDQ, QInt8 activations and weights, per channel)
  ort-u8s8:  quantize_static(QDQ, QUInt8 activations, QInt8 weights, per channel) (its default types)
  kiln-int8 / kiln-fp8: kiln quantize --precision int8|fp8
calibrated on 8 random inputs. Each variant: `kiln run --fp16` at batch 2 against onnxruntime CPU
running that same QDQ model (rel-L2: the GPU's fp16 quantized kernels against the reference
semantics), how many quantized products kiln placed on int8/fp8 GEMMs and how many it kept in 16 bits
(where its timing found the 8-bit form slower), and `kiln bench --fp16` median/p99.
Prints one table; writes DIR/quant_gpu.json. Exit code 1 when a check fails or anything errors.
"""
import argparse, json, os, re, subprocess, sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peers  # noqa: E402



def calib_inputs(names, vocab, n, batch=1):
    """n samples of bench/peers.py's inputs, each with its own random token ids or image."""
    import numpy as np
    out = []
    for i in range(n):
        t = {k: v.numpy() for k, v in peers.make_inputs(names, vocab, batch).items()}
        rng = np.random.default_rng(100 + i)
        if "input_ids" in t:
            t["input_ids"] = rng.integers(0, vocab, t["input_ids"].shape).astype(np.int64)
        if "pixel_values" in t:
            t["pixel_values"] = rng.standard_normal(t["pixel_values"].shape).astype(np.float32)
        out.append(t)
    return out


def ort_quantize(src, dst, samples, act_type):
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.it = iter(samples)

        def get_next(self):
            return next(self.it, None)

    quantize_static(src, dst, Reader(), quant_format=QuantFormat.QDQ, activation_type=act_type,
                    weight_type=QuantType.QInt8, per_channel=True)


def kiln_quantize(args, src, dst, samples, precision):
    import numpy as np
    cdir = os.path.join(args.out, "calib")
    os.makedirs(cdir, exist_ok=True)
    for i, s in enumerate(samples):  # a folder per sample, a file per input
        os.makedirs(os.path.join(cdir, f"s{i}"), exist_ok=True)
        for k, v in s.items():
            np.save(os.path.join(cdir, f"s{i}", f"{k}.npy"), v)
    err, _ = peers.run_cmd([args.kiln, "quantize", src, "--calib", cdir, "--precision", precision, "--max-calib",
                            str(args.kiln_calib), "-o", dst], 1200)
    return err


def ort_cpu(path, inputs):
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL  # the QDQ semantics as written
    return ort.InferenceSession(path, so, providers=["CPUExecutionProvider"]).run(None, {k: v.numpy() for k, v in inputs.items()})[0]


def check(args, name, path, fp32_path, inputs):
    """kiln --fp16 on the GPU against onnxruntime CPU running the same QDQ model and against the fp32
    model: PASS when kiln's error against fp32 is at most 1.5x onnxruntime's own (quantized kernels
    as accurate as the reference implementation of the quantized model)."""
    import numpy as np
    ref_q, ref32 = ort_cpu(path, inputs), ort_cpu(fp32_path, inputs)
    r = peers.kiln_check(args, name, path, inputs, ref_q)
    if "rel_l2" in r:
        got = np.load(os.path.join(args.out, f"{name}_b2_out", "output.npy"))
        r["rel_l2_vs_fp32"] = peers.rel_l2(got, ref32)
        r["ort_rel_l2_vs_fp32"] = peers.rel_l2(ref_q, ref32)
        r["status"] = "PASS" if r["rel_l2_vs_fp32"] <= 1.5 * r["ort_rel_l2_vs_fp32"] + 1e-3 else "FAIL"
    return r


def quant_steps(args, path, shapes):
    """How many steps `kiln build --report` places on 8-bit GEMMs, and how many nodes on the CPU."""
    cmd = [args.kiln, "build", path, "--fp16", "-o", os.path.join(args.out, "tmp.kiln"), "--report"]
    for n, s in shapes.items():
        cmd += ["--shapes", f"{n}:" + "x".join(str(d) for d in s)]
    err, out = peers.run_cmd(cmd, 1200)
    if err:
        return {"error": err}
    with open(os.path.join(args.out, os.path.basename(path) + ".report.txt"), "w") as f:
        f.write(out)
    # One line per product: the QuantizedMatMul node's own (the nodes fused into it repeat its
    # kernels' text and name it at the end of their lines).
    products = [line for line in out.splitlines() if re.match(r"\s*cuda\s+node '[^']*' \(QuantizedMatMul,", line)]
    int8 = sum(1 for line in products if "cublasLt int8" in line or "gemm_sm90_q8 int8" in line)
    fp8 = sum(1 for line in products if "cublasLt fp8" in line or "gemm_sm90_q8 fp8" in line)
    return {"int8_gemms": int8, "fp8_gemms": fp8, "16bit_gemms": len(products) - int8 - fp8,
            "cpu_nodes": out.count("cpu kernel")}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kiln", required=True)
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/kiln-quant"))
    ap.add_argument("--models", default="bert,resnet50")
    ap.add_argument("--batches", default="1,64")
    ap.add_argument("--variants", default="fp16,ort-s8s8,ort-u8s8,kiln-int8,kiln-fp8")
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--iters", type=int, default=200)
    ap.add_argument("--kiln-timeout", type=int, default=1200)
    ap.add_argument("--kiln-calib", type=int, default=8, help="calibration samples kiln quantize uses (its CPU reference is slow)")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    from onnxruntime.quantization import QuantType
    rows, failed = [], False
    for name in args.models.split(","):
        model, names, vocab = peers.build_model(name)
        src = os.path.join(args.out, f"{name}.onnx")
        peers.export_onnx(model, peers.make_inputs(names, vocab, 2), src)
        samples = calib_inputs(names, vocab, 8)
        paths = {"fp16": src}
        for v in args.variants.split(","):
            dst = os.path.join(args.out, f"{name}_{v}.onnx")
            try:
                if v == "ort-s8s8":
                    ort_quantize(src, dst, samples, QuantType.QInt8)
                elif v == "ort-u8s8":
                    ort_quantize(src, dst, samples, QuantType.QUInt8)
                elif v.startswith("kiln-"):
                    err = kiln_quantize(args, src, dst, samples, v[5:])
                    if err:
                        raise RuntimeError(err)
                if v != "fp16":
                    paths[v] = dst
            except Exception as e:  # noqa: BLE001 - reported, the next variant runs
                rows.append({"model": name, "variant": v, "error": peers.describe(e)})
                failed = True
        inputs2 = peers.make_inputs(names, vocab, 2)
        for v, path in paths.items():
            row = {"model": name, "variant": v}
            if v != "fp16":
                row["check"] = check(args, f"{name}_{v}", path, src, inputs2)
                failed |= row["check"].get("status") != "PASS"
                row["placement"] = quant_steps(args, path, {n: (1,) + tuple(t.shape[1:]) for n, t in inputs2.items()})
            for b in [int(x) for x in args.batches.split(",")]:
                row[f"b{b}"] = peers.kiln_bench(args, f"{name}_{v}", path, b)
                failed |= "error" in row[f"b{b}"]
            rows.append(row)
            print(json.dumps(row), flush=True)
    with open(os.path.join(args.out, "quant_gpu.json"), "w") as f:
        json.dump(rows, f, indent=1)
    print("\n| model | variant | rel-L2 vs ORT CPU (same QDQ) / vs fp32 (ORT's vs fp32) | int8/fp8/16-bit GEMMs | CPU nodes | " +
          " | ".join(f"b{b} ms (p99)" for b in args.batches.split(",")) + " |")
    for r in rows:
        chk = r.get("check", {})
        pl = r.get("placement", {})
        cells = [r["model"], r["variant"], r.get("error", "") or
                 (f"{chk.get('rel_l2', float('nan')):.2e} / {chk.get('rel_l2_vs_fp32', float('nan')):.2e} "
                  f"({chk.get('ort_rel_l2_vs_fp32', float('nan')):.2e}) {chk.get('status', '')}" if chk else "-"),
                 f"{pl.get('int8_gemms', '-')}/{pl.get('fp8_gemms', '-')}/{pl.get('16bit_gemms', '-')}",
                 str(pl.get("cpu_nodes", "-"))]
        for b in args.batches.split(","):
            t = r.get(f"b{b}", {})
            cells.append(t.get("error", "")[:60] if "error" in t else
                         f"{t.get('median_ms', float('nan')):.3f} ({t.get('p99_ms', float('nan')):.3f})" if t else "-")
        print("| " + " | ".join(cells) + " |")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
