#!/usr/bin/env python3
"""The same model as two exporters write it (issue 27, "exports as users make them").

    python3 bench/exporters.py --kiln build/kiln [--models t5,gpt2_kv,...] [--device cpu-ref|cuda] [--out DIR]

For each of bench/zoo_models.py's architectures (seeded random weights, batch 2 example inputs):
  torchscript-17  torch.onnx.export(..., dynamo=False, opset 17), batch dim dynamic
  dynamo-18       torch.onnx.export(..., dynamo=True, opset 18), batch dim dynamic; when torch.export
                  cannot trace a dynamic batch, the same with static shapes (reported as dynamo-static-18)
Each export is built by kiln (`kiln build --report`, batch 2 where the batch is dynamic) and its steps
counted ("steps: N host steps" on the CPU, "steps per forward" on the GPU); its outputs (`kiln run`) are
checked against onnxruntime's on the same inputs: relative L2 per output at most 1e-4 on the CPU, 2e-2
in fp16 on the GPU. The target:
both exports of a model reach the same step count within 3%, and with --bench (GPU) the same speed
within 3% (`kiln bench` of each engine: median and p99 ms of CUDA-graph replays). Prints one table;
exits 1 when an export kiln builds does not match onnxruntime or fails to build.

Needs torch (with onnxscript for the dynamo exporter), transformers, torchvision, onnx, onnxruntime.
"""
import argparse
import os
import re
import subprocess
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import zoo_models  # noqa: E402

DEFAULT = "roberta,gpt2_kv,llama_gqa,t5,whisper_encoder,wav2vec2,mobilevit,swin_t,yolo_neck,unet_diffusion"


def export(model, arch, inputs, path, kind):
    import torch
    names, args = list(inputs), tuple(inputs.values())
    if kind == "torchscript-17":
        torch.onnx.export(model, args, path, input_names=names, output_names=arch.outputs, opset_version=17,
                          dynamic_axes={n: {0: "batch"} for n in names}, do_constant_folding=True, dynamo=False)
        return kind
    try:
        batch = torch.export.Dim("batch", min=1, max=1024)
        torch.onnx.export(model, args, path, input_names=names, output_names=arch.outputs, opset_version=18,
                          dynamic_shapes=tuple({0: batch} for _ in names), dynamo=True, external_data=False)
        return kind
    except Exception:  # noqa: BLE001 - torch.export could not trace a dynamic batch: try static
        torch.onnx.export(model, args, path, input_names=names, output_names=arch.outputs, opset_version=18,
                          dynamo=True, external_data=False)
        return "dynamo-static-18"


def steps_of(report, device):
    m = re.search(r"steps per forward: (\d+)" if device == "cuda" else r"steps: (\d+) host steps", report)
    return int(m.group(1)) if m else None


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kiln", required=True)
    ap.add_argument("--models", default=DEFAULT)
    ap.add_argument("--device", default="cpu-ref", choices=["cpu-ref", "cpu", "cuda"])
    ap.add_argument("--out", default="/tmp/kiln-exporters")
    ap.add_argument("--bench", action="store_true", help="also time each engine (`kiln bench`, 10 warm-up + 50 timed)")
    args = ap.parse_args()
    import onnx
    import onnxruntime as ort
    os.makedirs(args.out, exist_ok=True)
    rows, failed = [], False
    for name in args.models.split(","):
        arch = zoo_models.BY_NAME[name]
        model, vocab = zoo_models.build(arch)
        inputs = zoo_models.make_inputs(arch, vocab, 2)
        for kind in ("torchscript-17", "dynamo-18"):
            path = os.path.join(args.out, f"{name}_{kind}.onnx")
            try:
                got = export(model, arch, inputs, path, kind)
            except Exception as e:  # noqa: BLE001 - reported as a row
                rows.append((name, kind, "-", "-", "-", f"export failed: {str(e).splitlines()[0][:80]}"))
                continue
            nodes = len(onnx.load(path, load_external_data=False).graph.node)
            feeds = {k: v.numpy() for k, v in inputs.items()}
            sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
            io = os.path.join(args.out, f"{name}_{kind}_io")
            for sub in ("in", "ref"):
                os.makedirs(os.path.join(io, sub), exist_ok=True)
            for k, v in feeds.items():
                np.save(os.path.join(io, "in", f"{k}.npy"), v)
            for o, w in zip(sess.get_outputs(), sess.run(None, feeds)):
                np.save(os.path.join(io, "ref", f"{o.name}.npy"), w)
            build = [args.kiln, "build", path, "--device", args.device, "--report", "-o", os.path.join(args.out, "t.kiln")]
            if args.device == "cuda":
                build.append("--fp16")
            if got != "dynamo-static-18":
                build += ["--batch", "2"]
            b = subprocess.run(build, capture_output=True, text=True)
            steps = steps_of(b.stdout, args.device)
            # kiln's outputs against onnxruntime's: relative L2 over each whole output (a deep network's
            # fp32 sums in another order move a few elements past an elementwise tolerance).
            run = [args.kiln, "run", path, "--device", args.device, "--output-dir", os.path.join(io, "kiln")]
            run += [f"--input={k}={os.path.join(io, 'in', k + '.npy')}" for k in feeds]
            if args.device == "cuda":
                run.append("--fp16")
            c = subprocess.run(run, capture_output=True, text=True)
            timing = "-"
            if args.bench and b.returncode == 0:
                jf = os.path.join(args.out, "bench.json")
                t = subprocess.run([args.kiln, "bench", os.path.join(args.out, "t.kiln"), "--warmup", "10",
                                    "--iterations", "50", "--json", jf], capture_output=True, text=True)
                if t.returncode == 0:
                    import json
                    r = json.load(open(jf))
                    timing = f"{r['median_ms']:.3f} ({r['p99_ms']:.3f})"
                else:
                    timing = "bench failed: " + (t.stderr.strip().splitlines() or ["?"])[-1][:80]
            worst = 0.0
            for o in sess.get_outputs() if c.returncode == 0 else []:
                want = np.load(os.path.join(io, "ref", o.name + ".npy")).astype(np.float64)
                have = np.load(os.path.join(io, "kiln", o.name + ".npy")).astype(np.float64)
                worst = max(worst, float(np.linalg.norm(have - want) / max(np.linalg.norm(want), 1e-30)))
            tol = 2e-2 if args.device == "cuda" else 1e-4
            ok = b.returncode == 0 and c.returncode == 0 and worst <= tol
            failed |= not ok
            verdict = f"rel-L2 {worst:.1e}" if ok else "FAIL: " + (
                f"rel-L2 {worst:.1e} > {tol}" if c.returncode == 0 and b.returncode == 0
                else ((b.stderr or c.stderr).strip().splitlines() or ["?"])[-1][:100])
            rows.append((name, got, nodes, steps if steps is not None else "-", timing, verdict))
            print(rows[-1], flush=True)
    print(f"\n| model | export | ONNX nodes | kiln steps ({args.device}) | kiln ms (p99) | vs onnxruntime |\n|---|---|---|---|---|---|")
    for r in rows:
        print("| " + " | ".join(str(x) for x in r) + " |")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
