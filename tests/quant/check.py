#!/usr/bin/env python3
"""The checks behind tests/quant/run.sh: check.py KILN MODEL_DIR TMP.

1. EfficientNet-Lite0, int8 (entropy) and fp8 (minmax, the default): 8 calibration samples (the two
   bundled photos shifted and mirrored), 4 evaluation samples made differently. The written model:
   passes onnx.checker; its Conv weights are stored int8 / float8e4m3fn with a per-channel
   DequantizeLinear; the first Conv and the Gemm (classifier) read float weights; the opset is 13+
   (int8) or 19+ (fp8). onnxruntime (graph optimizations off, so it computes what the graph says)
   and kiln run it on both photos: fp32's class in both top-5s (8 samples of 2 photos calibrate
   coarsely: the cat's top-1 moves between neighbouring cat classes), one top-1 class for both, kiln within 10%
   (relative L2) of onnxruntime. That bound, not exact equality: each QuantizeLinear rounds, and
   a value within float rounding of a step boundary (the two convolutions' sums differ in the
   last bits) lands one step apart; over 48 layers such flips grow to a few percent (measured:
   2.6% int8, 5% fp8) while quantization itself moves the logits by 10-35%.
   The report (JSON) names every layer and why the float ones are float.
2. The accuracy budget on a 3-layer MLP: with a budget just under the all-quantized error, the
   most sensitive layer is kept in float and the error meets the budget; an impossible budget is
   an error.
3. `kiln build --int8 --calib` on that MLP: the QDQ model it keeps (--qdq-output) is the one `kiln
   quantize` writes, its engine computes exactly what that model does, and a missing --calib,
   --int8 with --fp8, --calib alone and a missing folder are one-line errors.
"""
import json
import os
import subprocess
import sys

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

KILN, MODEL_DIR, TMP = sys.argv[1:4]
MODEL = os.path.join(MODEL_DIR, "model.onnx")
failures = []


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what, flush=True)
    if not cond:
        failures.append(what)


def kiln(*args):
    r = subprocess.run([KILN, *args], capture_output=True, text=True)
    return r.returncode, r.stdout, r.stderr


def ort_run(path, feeds, optimize=False):
    so = ort.SessionOptions()
    if not optimize:
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(path, so, providers=["CPUExecutionProvider"]).run(None, feeds)


def rel(a, b):
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def efficientnet():
    cat, cup = (np.load(os.path.join(MODEL_DIR, f)) for f in ("chelsea.npy", "coffee.npy"))
    calib, ev = os.path.join(TMP, "calib"), os.path.join(TMP, "eval")
    os.makedirs(calib)
    os.makedirs(ev)
    for i, (img, s) in enumerate([(cat, 0), (cup, 0), (cat, 9), (cup, -13), (cat, 31), (cup, 17), (cat, -40), (cup, 44)]):
        x = np.roll(img, s, axis=3)
        np.save(os.path.join(calib, f"{i}.npy"), np.ascontiguousarray(x[..., ::-1] if i % 3 == 1 else x))
    for i, img in enumerate([cat, cup, np.roll(cat, 5, axis=2), np.roll(cup, -7, axis=2)]):
        np.save(os.path.join(ev, f"{i}.npy"), img)
    ref = {n: ort_run(MODEL, {"input": x})[0] for n, x in (("cat", cat), ("cup", cup))}
    for prec, method, qtype, opset in (("int8", "entropy", TensorProto.INT8, 13), ("fp8", None, TensorProto.FLOAT8E4M3FN, 19)):
        out, rep = os.path.join(TMP, f"{prec}.onnx"), os.path.join(TMP, f"{prec}.json")
        args = ["quantize", MODEL, "--calib", calib, "--eval", ev, "--precision", prec, "-o", out, "--report", rep]
        if method:
            args += ["--method", method]
        rc, so, se = kiln(*args)
        check(rc == 0, f"{prec}: kiln quantize exits 0 ({se.strip()[:300]})")
        if rc:
            continue
        m = onnx.load(out)
        try:
            onnx.checker.check_model(m, full_check=True)
            check(True, f"{prec}: onnx.checker accepts the QDQ model")
        except Exception as e:  # noqa: BLE001 - the checker's message is the failure
            check(False, f"{prec}: onnx.checker: {e}")
        version = max(o.version for o in m.opset_import if o.domain in ("", "ai.onnx"))
        check(version >= opset, f"{prec}: opset {version} >= {opset}")
        inits = {t.name: t for t in m.graph.initializer}
        producers = {o: n for n in m.graph.node for o in n.output}
        convs = [n for n in m.graph.node if n.op_type in ("Conv", "Gemm")]
        quantized = 0
        for n in convs:
            p = producers.get(n.input[1])
            if p is not None and p.op_type == "DequantizeLinear":
                w, s = inits[p.input[0]], inits[p.input[1]]
                ok = w.data_type == qtype and list(s.dims) == [w.dims[0]] and p.attribute[0].i == 0
                quantized += ok
            else:
                check(n.input[1] in inits and inits[n.input[1]].data_type == TensorProto.FLOAT,
                      f"{prec}: {n.name} keeps a float weight")
        check(quantized == 48, f"{prec}: 48 of 50 Conv/Gemm weights stored {prec} per output channel (got {quantized})")
        check(convs[0].input[1] in inits and convs[-1].op_type == "Gemm" and convs[-1].input[1] in inits,
              f"{prec}: the first Conv and the classifier stay float")
        check(sum(n.op_type == "QuantizeLinear" for n in m.graph.node) == 48, f"{prec}: 48 activation QuantizeLinear nodes")
        check(os.path.getsize(out) < 0.6 * os.path.getsize(MODEL), f"{prec}: the file shrinks (quantized weights)")
        r = json.load(open(rep))
        check(len(r["layers"]) == 50 and sum(l["quantized"] for l in r["layers"]) == 48,
              f"{prec}: the report lists 50 layers, 48 quantized")
        check(all(l.get("why_float") for l in r["layers"] if not l["quantized"]), f"{prec}: every float layer says why")
        o = r["outputs"][0]
        check(o["name"] == "logits" and 0 <= o["top1_agreement"] <= 100 and 0 < o["cosine"] <= 1.0000001,
              f"{prec}: the report measures logits (top-1 {o['top1_agreement']}, cosine {o['cosine']:.4f})")
        for name, x in (("cat", cat), ("cup", cup)):
            q = ort_run(out, {"input": x})[0]
            np.save(os.path.join(TMP, "x.npy"), x)
            od = os.path.join(TMP, f"out_{prec}_{name}")
            rc, _, se = kiln("run", out, "--input", f"input={os.path.join(TMP, 'x.npy')}", "--output-dir", od, "--device", "cpu")
            check(rc == 0, f"{prec} {name}: kiln runs the QDQ model ({se.strip()[:200]})")
            if rc:
                continue
            k = np.load(os.path.join(od, "logits.npy"))
            want = int(ref[name].argmax())
            top5 = lambda v: set(np.argsort(-v.ravel())[:5].tolist())  # noqa: E731
            check(want in top5(q) and want in top5(k) and int(q.argmax()) == int(k.argmax()),
                  f"{prec} {name}: fp32's class {want} is in onnxruntime's and kiln's top 5, and their top-1 is one "
                  f"class (got {int(q.argmax())}, {int(k.argmax())})")
            d = rel(k, q)
            check(d < 0.10, f"{prec} {name}: kiln within 10% of onnxruntime (rel-L2 {d:.4f}; quantization error {rel(q, ref[name]):.4f})")
        if prec == "int8":  # onnxruntime's own int8 kernels (QDQ fused into QLinearConv) take the model too
            q = ort_run(out, {"input": cat}, optimize=True)[0]
            check(int(ref["cat"].argmax()) in set(np.argsort(-q.ravel())[:5].tolist()),
                  "int8: onnxruntime with its int8 kernels has fp32's class in its top 5")


def mlp():
    rng = np.random.default_rng(3)
    ws = [rng.standard_normal(s).astype(np.float32) * 0.5 for s in ((16, 32), (32, 32), (32, 8))]
    nodes = [helper.make_node("MatMul", ["x", "w0"], ["h0"]), helper.make_node("Relu", ["h0"], ["a0"]),
             helper.make_node("MatMul", ["a0", "w1"], ["h1"]), helper.make_node("Tanh", ["h1"], ["a1"]),
             helper.make_node("MatMul", ["a1", "w2"], ["y"])]
    g = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 16])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 8])],
                          [numpy_helper.from_array(w, f"w{i}") for i, w in enumerate(ws)])
    path = os.path.join(TMP, "mlp.onnx")
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
    np.save(os.path.join(TMP, "mlp_x.npy"), rng.standard_normal((64, 1, 16)).astype(np.float32))  # 64 stacked samples
    d = os.path.join(TMP, "mlp_calib")
    os.makedirs(d)
    os.replace(os.path.join(TMP, "mlp_x.npy"), os.path.join(d, "x.npy"))
    base = ["quantize", path, "--calib", d, "--quantize-sensitive", "--method", "minmax"]
    rc, _, se = kiln(*base, "-o", os.path.join(TMP, "mlp_all.onnx"), "--sensitivity", "--report", os.path.join(TMP, "all.json"))
    check(rc == 0, f"mlp: quantize with --sensitivity ({se.strip()[:200]})")
    if rc:
        return
    r = json.load(open(os.path.join(TMP, "all.json")))
    sens = {l["node"]: l["sensitivity"] for l in r["layers"]}
    check(r["metric"] == "relative L2 %" and len(sens) == 3 and all(s > 0 for s in sens.values()),
          f"mlp: three layers, each with a measured sensitivity ({sens})")
    budget = r["error"] * 0.999
    rc, _, se = kiln(*base, "-o", os.path.join(TMP, "mlp_b.onnx"), "--accuracy-budget", str(budget), "--report",
                     os.path.join(TMP, "b.json"))
    check(rc == 0, f"mlp: quantize within a {budget:.4f}% budget ({se.strip()[:200]})")
    if rc == 0:
        b = json.load(open(os.path.join(TMP, "b.json")))
        most = max(sens, key=sens.get)
        check(b["error"] <= budget and b["budget_kept"] and b["budget_kept"][0] == most,
              f"mlp: the budget keeps the most sensitive layer first ({b['budget_kept']}) and meets it ({b['error']:.4f})")
    rc, _, se = kiln(*base, "-o", os.path.join(TMP, "mlp_cos.onnx"), "--metric", "cosine", "--sensitivity", "--report",
                     os.path.join(TMP, "cos.json"))
    if rc == 0:
        c = json.load(open(os.path.join(TMP, "cos.json")))
        o = c["outputs"][0]
        check(c["metric"] == "1 - row cosine %" and abs(c["error"] - 100 * (1 - o["row_cosine_mean"])) < 1e-9
              and o["row_cosine_min"] <= o["row_cosine_mean"] <= 1,
              f"mlp: --metric cosine measures 1 - the mean row cosine ({c['error']:.5f}%)")
    else:
        check(False, f"mlp: --metric cosine ({se.strip()[:200]})")
    rc, _, se = kiln(*base, "-o", os.path.join(TMP, "mlp_c.onnx"), "--accuracy-budget", "0.0000001")
    check(rc != 0 and "accuracy budget" in se and not os.path.exists(os.path.join(TMP, "mlp_c.onnx")),
          f"mlp: an impossible budget is an error and writes nothing ({se.strip()[:200]})")


def build_int8():
    """`kiln build --int8 --calib`: quantize and build in one step, on the MLP of mlp()."""
    path, d = os.path.join(TMP, "mlp.onnx"), os.path.join(TMP, "mlp_calib")
    qdq, eng, ref = (os.path.join(TMP, f) for f in ("mlp_built.qdq.onnx", "mlp_int8.kiln", "mlp_ref.qdq.onnx"))
    rc, so, se = kiln("build", path, "--int8", "--calib", d, "--qdq-output", qdq, "-o", eng, "--device", "cpu")
    check(rc == 0 and "int8" in so and os.path.exists(eng) and os.path.exists(qdq),
          f"mlp: kiln build --int8 --calib prints the quantization report and writes the engine ({se.strip()[:200]})")
    if rc:
        return
    rc, _, se = kiln("quantize", path, "--calib", d, "--method", "minmax", "--precision", "int8", "-o", ref)
    a, b = onnx.load(qdq), onnx.load(ref)
    same = rc == 0 and [n.op_type for n in a.graph.node] == [n.op_type for n in b.graph.node] and all(
        np.array_equal(numpy_helper.to_array(x), numpy_helper.to_array(y)) for x, y in zip(a.graph.initializer, b.graph.initializer))
    check(same and len(a.graph.initializer) == len(b.graph.initializer),
          "mlp: build --int8 quantizes as kiln quantize --precision int8 does (same nodes and initializers)")
    check(sum(n.op_type == "QuantizeLinear" for n in a.graph.node) == 2,
          "mlp: two of the three products quantized (the classifier stays float)")
    x = np.random.default_rng(9).standard_normal((4, 16)).astype(np.float32)
    xf = os.path.join(TMP, "mlp_run_x.npy")
    np.save(xf, x)
    outs = []
    for model in (eng, qdq):
        od = os.path.join(TMP, "out_" + os.path.basename(model))
        rc, _, se = kiln("run", model, "--input", f"x={xf}", "--output-dir", od, "--device", "cpu")
        check(rc == 0, f"mlp: kiln run {os.path.basename(model)} ({se.strip()[:200]})")
        outs.append(np.load(os.path.join(od, "y.npy")) if rc == 0 else None)
    if outs[0] is not None and outs[1] is not None:
        check(np.array_equal(outs[0], outs[1]), "mlp: the built engine computes exactly what its QDQ model does")
        want = ort_run(qdq, {"x": x})[0]
        check(rel(outs[1], want) < 1e-3, f"mlp: kiln's CPU run of the QDQ model matches onnxruntime's (rel-L2 {rel(outs[1], want):.2e})")
    # A CPU engine runs the QDQ products as fp32 products of the dequantized weights (oneDNN), not the
    # fused QuantizedMatMul's body on the reference kernels.
    rc, so, se = kiln("build", qdq, "--device", "cpu", "--shapes", "x:4x16", "--report")
    ref_line = next((l for l in so.splitlines() if l.startswith("reference kernels:")), "")
    check(rc == 0 and "QuantizedMatMul" not in so and "MatMul" in so.split("oneDNN:", 1)[-1].split("\n", 1)[0],
          f"mlp: the CPU engine's products run on oneDNN ({ref_line.strip()[:160]})")
    for args, want in ((["--int8"], "--calib"), (["--int8", "--fp8", "--calib", d], "give one"),
                       (["--calib", d], "--int8 or --fp8"), (["--int8", "--calib", os.path.join(TMP, "nowhere")], "nowhere")):
        rc, _, se = kiln("build", path, *args, "--device", "cpu")
        check(rc != 0 and want in se and len(se.strip().splitlines()) == 1,
              f"mlp: kiln build {' '.join(a if a != d else 'DIR' for a in args)} is a one-line error naming {want!r} ({se.strip()[:160]})")


efficientnet()
mlp()
build_int8()
print(f"quant: {len(failures)} failed")
sys.exit(1 if failures else 0)
