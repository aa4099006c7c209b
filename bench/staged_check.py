"""Models whose shapes depend on values they compute (NonZero, NonMaxSuppression, Unique, a TopK
with a computed k, a Range to a computed limit), on the GPU as staged engines, in one device call:

    python3 bench/staged_check.py --kiln BIN/kiln [--out DIR] [--device cuda] [--time] [--ssd]

Per case (a small ONNX model made with onnx.helper and one or more input sets): `kiln build m.onnx
--device D -o m.kiln` (its report must say the engine is staged on a GPU), then the saved engine
run in a fresh process on each input set, and the .onnx run directly in fp16, each output compared
with onnxruntime (CPU, fp32; kiln's cpu-ref where onnxruntime is missing). --time: `kiln bench` of
the larger model on the device and on the CPU (where the whole model ran before staged engines).
--ssd: a torchvision detector's post-processing (ssd_check).
Prints one line per check; exits non-zero on any failure.
"""
import argparse
import os
import re
import subprocess
import sys
import tempfile

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = [helper.make_opsetid("", 17)]


def vi(name, dt, shape):
    return helper.make_tensor_value_info(name, dt, shape)


def const(name, arr):
    return numpy_helper.from_array(np.asarray(arr), name)


def nonzero_model(n=2, c=16, hw=32):
    # A convolution's per-channel means, the channels over a threshold picked by NonZero and their
    # means gathered; the feature map scaled by their sum (a static shape after the cut).
    rng = np.random.default_rng(0)
    inits = [const("w", (rng.standard_normal((32, c, 3, 3)) * 0.2).astype(np.float32))]
    nodes = [helper.make_node("Conv", ["x", "w"], ["cv"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["cv"], ["r"]),
             helper.make_node("ReduceMean", ["r"], ["m"], axes=[2, 3], keepdims=0),
             helper.make_node("Greater", ["m", "thr"], ["g"]),
             helper.make_node("NonZero", ["g"], ["nz"]),
             helper.make_node("Transpose", ["nz"], ["t"], perm=[1, 0]),
             helper.make_node("GatherND", ["m", "t"], ["sel"]),
             helper.make_node("ReduceSum", ["sel"], ["s"], keepdims=0),
             helper.make_node("Mul", ["r", "s"], ["y"])]
    g = helper.make_graph(nodes, "nonzero", [vi("x", TensorProto.FLOAT, [n, c, hw, hw]), vi("thr", TensorProto.FLOAT, [])],
                          [vi("y", TensorProto.FLOAT, None), vi("sel", TensorProto.FLOAT, None), vi("nz", TensorProto.INT64, None)],
                          initializer=inits)
    return helper.make_model(g, opset_imports=OPSET, ir_version=8)


def topk_model():
    # k = 1 + how many scores exceed 2 (a data-dependent k), then a softmax over the k kept.
    inits = [const("two", np.array(2.0, np.float32)), const("one", np.array([1], np.int64))]
    nodes = [helper.make_node("Greater", ["x", "two"], ["g"]),
             helper.make_node("Cast", ["g"], ["c"], to=TensorProto.INT64),
             helper.make_node("ReduceSum", ["c"], ["n"], keepdims=1),
             helper.make_node("Reshape", ["n", "one"], ["n1"]),
             helper.make_node("Add", ["n1", "one"], ["k"]),
             helper.make_node("TopK", ["x", "k"], ["v", "i"], axis=1),
             helper.make_node("Softmax", ["v"], ["p"], axis=1)]
    g = helper.make_graph(nodes, "topk", [vi("x", TensorProto.FLOAT, [4, 1000])],
                          [vi("p", TensorProto.FLOAT, None), vi("i", TensorProto.INT64, None)], initializer=inits)
    return helper.make_model(g, opset_imports=OPSET, ir_version=8)


def nms_model():
    # Boxes kept by NonMaxSuppression, gathered and scaled.
    inits = [const("maxo", np.array([40], np.int64)), const("iou", np.array([0.5], np.float32)),
             const("sthr", np.array([0.2], np.float32)), const("two", np.array([2], np.int64)),
             const("k", np.array(3.0, np.float32)), const("flat", np.array([-1], np.int64))]
    nodes = [helper.make_node("Sigmoid", ["logits"], ["scores"]),
             helper.make_node("NonMaxSuppression", ["boxes", "scores", "maxo", "iou", "sthr"], ["sel"]),
             helper.make_node("Gather", ["sel", "two"], ["bi"], axis=1),
             helper.make_node("Squeeze", ["boxes"], ["b0"]),
             helper.make_node("Reshape", ["bi", "flat"], ["bif"]),
             helper.make_node("Gather", ["b0", "bif"], ["kept"], axis=0),
             helper.make_node("Mul", ["kept", "k"], ["y"])]
    g = helper.make_graph(nodes, "nms", [vi("boxes", TensorProto.FLOAT, [1, 200, 4]), vi("logits", TensorProto.FLOAT, [1, 1, 200])],
                          [vi("y", TensorProto.FLOAT, None), vi("sel", TensorProto.INT64, None)], initializer=inits)
    return helper.make_model(g, opset_imports=OPSET, ir_version=8)


def unique_model():
    inits = [const("half", np.array(0.5, np.float32))]
    nodes = [helper.make_node("Unique", ["x"], ["u", "idx", "inv", "cnt"], sorted=1),
             helper.make_node("Cast", ["cnt"], ["cf"], to=TensorProto.FLOAT),
             helper.make_node("Mul", ["cf", "half"], ["y"])]
    g = helper.make_graph(nodes, "unique", [vi("x", TensorProto.INT64, [64])],
                          [vi("u", TensorProto.INT64, None), vi("y", TensorProto.FLOAT, None)], initializer=inits)
    return helper.make_model(g, opset_imports=OPSET, ir_version=8)


def range_model():
    # Range(0, n) as floats, n the count of positives in x's first row, added to x's first n columns.
    inits = [const("zero", np.array(0, np.int64)), const("one", np.array(1, np.int64)),
             const("z", np.array(0.0, np.float32)), const("s0", np.array([0], np.int64)), const("ax", np.array([1], np.int64))]
    nodes = [helper.make_node("Gather", ["x", "zero"], ["row"], axis=0),
             helper.make_node("Greater", ["row", "z"], ["g"]),
             helper.make_node("Cast", ["g"], ["c"], to=TensorProto.INT64),
             helper.make_node("ReduceSum", ["c"], ["n"], keepdims=0),
             helper.make_node("Range", ["zero", "n", "one"], ["rg"]),
             helper.make_node("Cast", ["rg"], ["rf"], to=TensorProto.FLOAT),
             helper.make_node("Tanh", ["x"], ["tx"]),
             helper.make_node("Unsqueeze", ["n", "s0"], ["n1"]),
             helper.make_node("Slice", ["tx", "s0", "n1", "ax"], ["sl"]),
             helper.make_node("Add", ["sl", "rf"], ["y"])]
    g = helper.make_graph(nodes, "range", [vi("x", TensorProto.FLOAT, [8, 160])], [vi("y", TensorProto.FLOAT, None)],
                          initializer=inits)
    return helper.make_model(g, opset_imports=OPSET, ir_version=8)


def loop_model():
    # A Loop whose trip count is the number of positives in x's first row, each iteration a row of
    # scan output (the running value times 0.5, plus x's second row); after it, a sum over the scans.
    inits = [const("zero", np.array(0, np.int64)), const("one", np.array(1, np.int64)),
             const("z", np.array(0.0, np.float32)), const("t", np.array(True))]
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"]),
         helper.make_node("Mul", ["v_in", "halfb"], ["v_half"]),
         helper.make_node("Add", ["v_half", "row1"], ["v_out"]),
         helper.make_node("Identity", ["v_out"], ["scan"])],
        "body", [vi("i", TensorProto.INT64, []), vi("cond_in", TensorProto.BOOL, []), vi("v_in", TensorProto.FLOAT, [16])],
        [vi("cond_out", TensorProto.BOOL, []), vi("v_out", TensorProto.FLOAT, [16]), vi("scan", TensorProto.FLOAT, [16])],
        initializer=[const("halfb", np.array(0.5, np.float32))])
    nodes = [helper.make_node("Gather", ["x", "zero"], ["row0"], axis=0),
             helper.make_node("Gather", ["x", "one"], ["row1"], axis=0),
             helper.make_node("Greater", ["row0", "z"], ["g"]),
             helper.make_node("Cast", ["g"], ["c"], to=TensorProto.INT64),
             helper.make_node("ReduceSum", ["c"], ["n"], keepdims=0),
             helper.make_node("Loop", ["n", "t", "row0"], ["v_final", "scans"], body=body),
             helper.make_node("Tanh", ["scans"], ["y"])]
    g = helper.make_graph(nodes, "loop", [vi("x", TensorProto.FLOAT, [4, 16])],
                          [vi("y", TensorProto.FLOAT, None), vi("v_final", TensorProto.FLOAT, None)], initializer=inits)
    return helper.make_model(g, opset_imports=OPSET, ir_version=8)


def feeds_nonzero(seed, frac):
    # The threshold in the widest gap between the channel means near the `frac` quantile, so that fp16
    # rounding cannot move a mean across it (None: above them all).
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((2, 16, 32, 32)).astype(np.float32)
    if frac is None:
        return {"x": x, "thr": np.array(1e9, np.float32)}
    w = nonzero_model().graph.initializer[0]
    r = np.maximum(conv3x3(x, numpy_helper.to_array(w)), 0)
    m = np.sort(r.mean(axis=(2, 3)).ravel())
    lo, hi = int(len(m) * (frac - 0.15)), int(len(m) * (frac + 0.15))
    k = lo + int(np.argmax(np.diff(m[lo:hi])))
    return {"x": x, "thr": np.array((m[k] + m[k + 1]) / 2, np.float32)}


def conv3x3(x, w):
    n, c, h, wd = x.shape
    p = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    out = np.zeros((n, w.shape[0], h, wd), np.float64)
    for i in range(3):
        for j in range(3):
            out += np.einsum("nchw,oc->nohw", p[:, :, i:i + h, j:j + wd], w[:, :, i, j])
    return out


def feeds_nms(seed):
    rng = np.random.default_rng(seed)
    xy = rng.uniform(0, 100, (1, 200, 2)).astype(np.float32)
    wh = rng.uniform(5, 30, (1, 200, 2)).astype(np.float32)
    return {"boxes": np.concatenate([xy, xy + wh], axis=2), "logits": rng.standard_normal((1, 1, 200)).astype(np.float32)}


CASES = {
    # name: (model, [input sets], fp16 tolerance or None: no fp16 run)
    "nonzero_gather": (nonzero_model, [feeds_nonzero(1, 0.5), feeds_nonzero(2, 0.8), feeds_nonzero(3, None)], 3e-2),
    "topk_computed_k": (topk_model, [{"x": np.random.default_rng(s).standard_normal((4, 1000)).astype(np.float32)} for s in (4, 5)], None),
    "nms": (nms_model, [feeds_nms(6), feeds_nms(7)], None),
    "unique": (unique_model, [{"x": np.random.default_rng(s).integers(0, hi, 64).astype(np.int64)} for s, hi in ((8, 10), (9, 40))], None),
    "loop_computed_trips": (loop_model, [{"x": np.random.default_rng(s).standard_normal((4, 16)).astype(np.float32)} for s in (12, 13)], None),
    "range_computed": (range_model, [{"x": np.random.default_rng(s).standard_normal((8, 160)).astype(np.float32)} for s in (10, 11)], None),
}


def sh(cmd, timeout=600):
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    return p.returncode, p.stdout + p.stderr


def reference(path, feeds, kiln, d):
    try:
        import onnxruntime as ort
        s = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
        return [np.asarray(o) for o in s.run(None, feeds)], "onnxruntime"
    except ImportError:
        return run_kiln([kiln, "run", path, "--device", "cpu-ref"], feeds, d), "kiln cpu-ref"


def run_kiln(cmd, feeds, d, names=None):
    os.makedirs(d, exist_ok=True)
    args = list(cmd)
    for k, v in feeds.items():
        f = os.path.join(d, f"in_{k}.npy")
        np.save(f, v)
        args += ["--input", f"{k}={f}"]
    rc, text = sh(args + ["--output-dir", d])
    if rc != 0:
        raise RuntimeError(f"rc={rc}: {text.strip().splitlines()[-1] if text.strip() else ''}")
    return [np.load(os.path.join(d, f"{n}.npy")) for n in names] if names else text


def compare(got, want, tol):
    if len(got) != len(want):
        return f"{len(got)} outputs, want {len(want)}"
    worst = 0.0
    for g, w in zip(got, want):
        if g.shape != w.shape:
            return f"shape {g.shape}, want {w.shape}"
        if w.size == 0:
            continue
        if w.dtype.kind in "iub":
            if not np.array_equal(g, w):
                return "integer outputs differ"
            continue
        if np.isnan(g).any() != np.isnan(w).any():
            return "NaN where the reference has none"
        scale = max(1.0, float(np.abs(w).max()))
        worst = max(worst, float(np.abs(g.astype(np.float64) - w).max()) / scale)
    return None if worst <= tol else f"max rel diff {worst:.2e} > {tol:.0e}"


def ssd_check(kiln, work):
    """SSDlite320-MobileNetV3 (torchvision, random weights) exported by torch.onnx (TorchScript, opset 17):
    90 NonZero and a NonMaxSuppression in its post-processing. kiln fp32 on the device against
    onnxruntime, then `kiln bench` fp16 on the device and on the CPU, and onnxruntime's time."""
    import time
    import onnxruntime as ort
    import torch
    import torchvision
    torch.manual_seed(0)
    m = torchvision.models.detection.ssdlite320_mobilenet_v3_large(weights=None, weights_backbone=None).eval()
    img = torch.rand(3, 320, 320)
    path = os.path.join(work, "ssd.onnx")
    torch.onnx.export(m, ([img],), path, opset_version=17, dynamo=False, input_names=["images"],
                      output_names=["boxes", "scores", "labels"])
    feeds = {"images": img.numpy()}
    s = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    want = [np.asarray(o) for o in s.run(None, feeds)]
    t0 = time.perf_counter()
    for _ in range(10):
        s.run(None, feeds)
    print(f"time ssd onnxruntime cpu: {1000 * (time.perf_counter() - t0) / 10:.1f} ms a run", flush=True)
    try:
        got = run_kiln([kiln, "run", path, "--device", "cuda"], feeds, os.path.join(work, "ssd_out"), ["boxes", "scores", "labels"])
        err = compare(got, want, 1e-4)
    except RuntimeError as e:
        err = str(e)
    print(f"{'ok  ' if err is None else 'FAIL'} ssd fp32 on the GPU vs onnxruntime{'' if err is None else ': ' + err}", flush=True)
    for dev in ("cuda", "cpu"):
        rc, text = sh([kiln, "bench", path, "--device", dev, "--iterations", "20", "--warmup", "3"] +
                      (["--fp16"] if dev == "cuda" else []), timeout=900)
        line = [ln for ln in text.splitlines() if "median" in ln]
        print(f"time ssd on {dev}: rc={rc} {line[-1] if line else text[-300:]}", flush=True)
    return err is not None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kiln", required=True)
    ap.add_argument("--out", default=None)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--time", action="store_true")
    ap.add_argument("--ssd", action="store_true", help="also SSDlite320-MobileNetV3 from torchvision (needs torch)")
    a = ap.parse_args()
    work = a.out or tempfile.mkdtemp()
    os.makedirs(work, exist_ok=True)
    failures = 0

    def check(label, err):
        nonlocal failures
        failures += err is not None
        print(f"{'ok  ' if err is None else 'FAIL'} {label}{'' if err is None else ': ' + err}", flush=True)

    for name, (make, feed_sets, tol16) in CASES.items():
        path = os.path.join(work, f"{name}.onnx")
        m = make()
        onnx.save(m, path)
        outs = [o.name for o in m.graph.output]
        eng = os.path.join(work, f"{name}.kiln")
        rc, text = sh([a.kiln, "build", path, "--device", a.device, "-o", eng, "--report"])
        staged = "staged GPU engine" in text
        check(f"{name}: build, staged", None if rc == 0 and (staged or a.device != "cuda") else
              f"rc={rc}, staged={staged}: {text.strip().splitlines()[-1] if text.strip() else ''}")
        if rc != 0:
            continue
        for i, feeds in enumerate(feed_sets):
            d = os.path.join(work, f"{name}_{i}")
            want, ref = reference(path, feeds, a.kiln, d + "_ref")
            try:
                got = run_kiln([a.kiln, "run", eng], feeds, d, outs)
                err = compare(got, want, 1e-4)
                shapes = " ".join("x".join(map(str, g.shape)) or "scalar" for g in got)
            except RuntimeError as e:
                err, shapes = str(e), "-"
            check(f"{name} input {i}: saved engine vs {ref} (outputs {shapes})", err)
            if tol16 is not None:
                try:
                    got = run_kiln([a.kiln, "run", path, "--device", a.device, "--fp16"], feeds, d + "_fp16", outs)
                    err = compare(got, want, tol16)
                except RuntimeError as e:
                    err = str(e)
                check(f"{name} input {i}: fp16 vs {ref}", err)
    # A run whose input has the wrong shape: a one-line error, non-zero exit.
    bad = {"x": np.zeros((4, 999), np.float32)}
    try:
        run_kiln([a.kiln, "run", os.path.join(work, "topk_computed_k.kiln")], bad, os.path.join(work, "bad"), ["p"])
        check("wrong input shape is an error", "it ran")
    except RuntimeError as e:
        check(f"wrong input shape is an error ({e})", None if "x" in str(e) else "the message names no input")

    if a.ssd:
        failures += ssd_check(a.kiln, work)
    if a.time:
        path = os.path.join(work, "nonzero_big.onnx")
        onnx.save(nonzero_model(n=16, c=64, hw=128), path)
        for dev in (a.device, "cpu"):
            cmd = [a.kiln, "bench", path, "--device", dev, "--iterations", "30", "--warmup", "5"]
            rc, text = sh(cmd + (["--fp16"] if dev == "cuda" else []), timeout=900)
            line = [ln for ln in text.splitlines() if re.search(r"median|p99", ln)]
            print(f"time nonzero_big (16x64x128x128) on {dev}: rc={rc} {line[-1] if line else text[-300:]}", flush=True)
    print(f"{failures} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
