#!/usr/bin/env python3
"""Accuracy of kiln's post-training quantization on real data, beside onnxruntime's (issue 25).

    python3 bench/quant_data.py /tmp/qdata           # real photos -> calib/ and eval/
    python3 bench/quant_accuracy.py --kiln build/kiln --data /tmp/qdata [--model M.onnx] [--out DIR]

For each configuration, `kiln quantize` calibrates on DATA/calib and reports agreement with the fp32
model on DATA/eval (kiln's CPU reference backend runs both). The peer: onnxruntime's
`quantize_static` on the same model and calibration samples (QDQ, S8S8, per-channel weights, the same
method), its model evaluated by onnxruntime against onnxruntime's fp32 run. Prints a markdown table.
"""
import argparse
import glob
import json
import os
import subprocess
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_MODEL = os.path.join(HERE, "..", "models", "efficientnet-lite0", "model.onnx")
CONFIGS = [("int8", "minmax"), ("int8", "percentile"), ("int8", "entropy"), ("fp8", "minmax"), ("fp8", "percentile")]


def agreement(ref, got):
    top1 = np.mean([r.argmax() == g.argmax() for r, g in zip(ref, got)]) * 100
    top5 = np.mean([len(set(np.argsort(-r)[:5]) & set(np.argsort(-g)[:5])) / 5 for r, g in zip(ref, got)]) * 100
    r, g = np.concatenate(ref), np.concatenate(got)
    return top1, top5, float(np.linalg.norm(g - r) / np.linalg.norm(r))


def ort_peer(model, data, method, out):
    import onnxruntime as ort
    from onnxruntime.quantization import (CalibrationDataReader, CalibrationMethod, QuantFormat, QuantType,
                                          quantize_static)
    name = ort.InferenceSession(model).get_inputs()[0].name

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.files = iter(sorted(glob.glob(os.path.join(data, "calib", "*.npy"))))

        def get_next(self):
            f = next(self.files, None)
            return None if f is None else {name: np.load(f)}

    m = {"minmax": CalibrationMethod.MinMax, "percentile": CalibrationMethod.Percentile,
         "entropy": CalibrationMethod.Entropy}[method]
    qpath = os.path.join(out, f"ort_int8_{method}.onnx")
    t0 = time.time()
    quantize_static(model, qpath, Reader(), quant_format=QuantFormat.QDQ, per_channel=True,
                    activation_type=QuantType.QInt8, weight_type=QuantType.QInt8, calibrate_method=m,
                    extra_options={"ActivationSymmetric": True, "WeightSymmetric": True})
    calib_s = time.time() - t0
    f32, q = ort.InferenceSession(model), ort.InferenceSession(qpath)
    ref, got = [], []
    for f in sorted(glob.glob(os.path.join(data, "eval", "*.npy"))):
        x = np.load(f)
        ref.append(f32.run(None, {name: x})[0].ravel())
        got.append(q.run(None, {name: x})[0].ravel())
    return agreement(ref, got) + (calib_s,)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kiln", default="build/kiln")
    ap.add_argument("--data", required=True)
    ap.add_argument("--model", default=DEFAULT_MODEL)
    ap.add_argument("--out", default="/tmp/kiln-quant")
    ap.add_argument("--no-peer", action="store_true")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    rows = []
    for prec, method in CONFIGS:
        qpath = os.path.join(a.out, f"kiln_{prec}_{method}.onnx")
        rpath = qpath.replace(".onnx", ".json")
        t0 = time.time()
        subprocess.run([a.kiln, "quantize", a.model, "--calib", os.path.join(a.data, "calib"), "--eval",
                        os.path.join(a.data, "eval"), "--precision", prec, "--method", method, "-o", qpath,
                        "--report", rpath], check=True, stdout=subprocess.DEVNULL)
        r = json.load(open(rpath))
        o = r["outputs"][0]
        rows.append((f"kiln {prec} {method}", o.get("top1_agreement", -1), o.get("top5_overlap", -1), o["rel_l2"],
                     r["calibration"]["ms"] / 1e3, time.time() - t0,
                     sum(not l["quantized"] for l in r["layers"]), len(r["layers"])))
        print(rows[-1], flush=True)
        if prec == "int8" and not a.no_peer:
            t1, t5, rel, cs = ort_peer(a.model, a.data, method, a.out)
            rows.append((f"onnxruntime quantize_static int8 {method}", t1, t5, rel, cs, float("nan"), -1, -1))
            print(rows[-1], flush=True)
    n_cal = len(glob.glob(os.path.join(a.data, "calib", "*.npy")))
    n_ev = len(glob.glob(os.path.join(a.data, "eval", "*.npy")))
    print(f"\n{os.path.basename(os.path.dirname(a.model))}: {n_cal} calibration / {n_ev} evaluation samples\n")
    print("| quantizer | top-1 agreement % | top-5 overlap % | logits rel-L2 | calibration s | float layers |")
    print("|---|---|---|---|---|---|")
    for name, t1, t5, rel, cs, _, kept, total in rows:
        layers = f"{kept} of {total}" if total > 0 else "-"
        print(f"| {name} | {t1:.1f} | {t5:.1f} | {rel:.4f} | {cs:.1f} | {layers} |")


if __name__ == "__main__":
    main()
