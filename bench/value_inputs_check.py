"""Value inputs on the GPU (inputs whose values the plan needs: a TopK's k, Slice bounds, a Reshape
target, an If's condition), end to end through the CLI, in one device call:

    python3 bench/value_inputs_check.py --kiln BIN/kiln [--out DIR]

Builds a small ONNX model per case (onnx.helper), saves a GPU engine (`kiln build --device cuda`),
then for several values of the value input runs the saved engine in a fresh process (`kiln run
m.kiln --input NAME=FILE.npy --output-dir D`) and compares every output with onnxruntime (CPU,
fp32). A value the model cannot take (k larger than the axis) must be a one-line error with a
non-zero exit. Prints one line per check and exits non-zero on any failure.
"""
import argparse
import os
import subprocess
import sys
import tempfile

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper


def topk_model():
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 50])
    k = helper.make_tensor_value_info("k", TensorProto.INT64, [1])
    v = helper.make_tensor_value_info("v", TensorProto.FLOAT, None)
    i = helper.make_tensor_value_info("i", TensorProto.INT64, None)
    node = helper.make_node("TopK", ["x", "k"], ["v", "i"], axis=1)
    return helper.make_model(helper.make_graph([node], "topk", [x, k], [v, i]), opset_imports=[helper.make_opsetid("", 17)])


def slice_reshape_model():
    # y = Reshape(Slice(x, 0, end, axis 1) * 2, shape): the slice end and the target are fed.
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [6, 40])
    end = helper.make_tensor_value_info("end", TensorProto.INT64, [1])
    shape = helper.make_tensor_value_info("shape", TensorProto.INT64, [2])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    inits = [helper.make_tensor("zero", TensorProto.INT64, [1], [0]), helper.make_tensor("one", TensorProto.INT64, [1], [1]),
             helper.make_tensor("two", TensorProto.FLOAT, [], [2.0])]
    nodes = [helper.make_node("Slice", ["x", "zero", "end", "one"], ["s"]), helper.make_node("Mul", ["s", "two"], ["m"]),
             helper.make_node("Reshape", ["m", "shape"], ["y"])]
    g = helper.make_graph(nodes, "slice_reshape", [x, end, shape], [y], initializer=inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def if_model():
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 8])
    c = helper.make_tensor_value_info("c", TensorProto.BOOL, [])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 8])
    then_g = helper.make_graph([helper.make_node("Sigmoid", ["x"], ["t"])], "then", [],
                               [helper.make_tensor_value_info("t", TensorProto.FLOAT, [3, 8])])
    else_g = helper.make_graph([helper.make_node("Neg", ["x"], ["e"])], "else", [],
                               [helper.make_tensor_value_info("e", TensorProto.FLOAT, [3, 8])])
    node = helper.make_node("If", ["c"], ["y"], then_branch=then_g, else_branch=else_g)
    return helper.make_model(helper.make_graph([node], "if", [x, c], [y]), opset_imports=[helper.make_opsetid("", 17)])


CASES = {
    "topk": (topk_model, [{"k": np.array([1], np.int64)}, {"k": np.array([7], np.int64)}, {"k": np.array([50], np.int64)},
                          {"k": np.array([7], np.int64)}], {"k": np.array([51], np.int64)}),
    "slice_reshape": (slice_reshape_model, [{"end": np.array([10], np.int64), "shape": np.array([3, 20], np.int64)},
                                            {"end": np.array([40], np.int64), "shape": np.array([-1, 60], np.int64)},
                                            {"end": np.array([-5], np.int64), "shape": np.array([35, 6], np.int64)}],
                      {"end": np.array([10], np.int64), "shape": np.array([7, 7], np.int64)}),
    "if": (if_model, [{"c": np.array(True)}, {"c": np.array(False)}], None),
}


def run(cmd):
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    return p.returncode, p.stdout + p.stderr


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kiln", required=True)
    ap.add_argument("--out", default=None)
    ap.add_argument("--device", default="cuda", help="cpu checks the script itself on a machine without a GPU")
    a = ap.parse_args()
    work = a.out or tempfile.mkdtemp(prefix="kiln-values-")
    os.makedirs(work, exist_ok=True)
    rng = np.random.default_rng(0)
    failures = 0
    for name, (make, values, bad) in CASES.items():
        model = make()
        model.ir_version = 8  # what every onnxruntime reads (a newer onnx writes a newer one)
        path = os.path.join(work, name + ".onnx")
        onnx.save(model, path)
        engine = os.path.join(work, name + ".kiln")
        rc, out = run([a.kiln, "build", path, "--device", a.device, "-o", engine, "--report"])
        report = [line for line in out.splitlines() if "value inputs" in line]
        print(f"{name}: build rc {rc}; {report[0].strip() if report else 'no value-input line in the report'}")
        if rc != 0:
            print(out[-2000:])
            failures += 1
            continue
        sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
        x = rng.standard_normal(tuple(d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim)).astype(np.float32)
        for k, feed in enumerate(values + ([bad] if bad else [])):
            feed = dict(feed, x=x)
            d = os.path.join(work, f"{name}_{k}")
            os.makedirs(d, exist_ok=True)
            args = [a.kiln, "run", engine, "--output-dir", d]
            for n, v in feed.items():
                np.save(os.path.join(d, f"in_{n}.npy"), v)
                args += ["--input", f"{n}={os.path.join(d, f'in_{n}.npy')}"]
            rc, out = run(args)
            shown = {n: v.tolist() for n, v in feed.items() if n != "x"}
            if bad is not None and k == len(values):
                ok = rc != 0 and len(out.strip().splitlines()) >= 1 and "Traceback" not in out and "Segmentation" not in out
                print(f"  {shown}: {'ok' if ok else 'FAIL'} (expected an error) rc {rc}: {out.strip().splitlines()[-1] if out.strip() else ''}")
                failures += not ok
                continue
            if rc != 0:
                print(f"  {shown}: FAIL rc {rc}: {out.strip()[-500:]}")
                failures += 1
                continue
            want = sess.run(None, feed)
            worst = 0.0
            for o, w in zip(sess.get_outputs(), want):
                got = np.load(os.path.join(d, o.name + ".npy"))
                if got.shape != w.shape:
                    worst = float("inf")
                    break
                scale = max(1.0, float(np.max(np.abs(w)))) if w.size else 1.0
                worst = max(worst, float(np.max(np.abs(got.astype(np.float64) - w))) / scale if w.size else 0.0)
            ok = worst <= 1e-5
            failures += not ok
            print(f"  {shown}: {'ok' if ok else 'FAIL'} max rel err {worst:.2e}")
    print(f"value inputs: {failures} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
