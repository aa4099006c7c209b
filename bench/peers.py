#!/usr/bin/env python3
"""Peer comparison: kiln vs PyTorch eager vs torch.compile, fp16, on one NVIDIA GPU.

Per model: build (random fp32 weights, seed 0) -> export ONNX (dynamic "batch" dim) -> check kiln's
fp16 output against torch fp32 eager at batch 1 and 2 -> time eager / torch.compile / kiln at batch 1
and a large batch -> one markdown table, plus OUT/results.json and OUT/results.md.
Heavy imports (torch, transformers, onnx) are deferred into functions so --help works without them.
Exit code: 0 when every check PASSes and nothing errored, 1 otherwise.
"""
import argparse, datetime, json, os, shlex, subprocess, sys, time, traceback

MODELS = ("resnet50", "mobilenet_v2", "bert", "gpt2", "vit_b_16", "unet_block", "seg_head", "style_net")
LARGE_BATCH = {"resnet50": 256, "mobilenet_v2": 256, "vit_b_16": 256, "bert": 64, "gpt2": 64, "unet_block": 64,
               "seg_head": 64, "style_net": 64}
# Small image models built from the ops other architectures lean on (issue 27): GroupNorm + SiLU
# and nearest upsampling (diffusion UNets), bilinear Resize (segmentation heads), reflection
# padding + InstanceNorm (style transfer, GAN generators). Not in the default run's table.
ARCH_BLOCKS = ("unet_block", "seg_head", "style_net")
CLASSIFIERS = ("resnet50", "mobilenet_v2", "vit_b_16")
SEQ = 128
REL_L2_PASS = 2e-2        # fp16 threshold vs the fp32 reference
PEAK_FLOPS = 800e12       # H100 dense fp16/bf16, measured
PEAK_BYTES = 3.0e12       # H100 HBM3, achievable


# ---- phase 1: models and inputs -----------------------------------------------------------------

def build_model(name):
    """Returns (fp32 eval module on CPU, input names, vocab or None). Weights are seeded random."""
    import torch

    class Wrapper(torch.nn.Module):  # named inputs (the ONNX input names), one tensor out
        def __init__(self, net):
            super().__init__()
            self.net = net
    torch.manual_seed(0)
    if name in CLASSIFIERS:
        import torchvision
        m = getattr(torchvision.models, name)(weights=None)
        if name == "vit_b_16":  # torchvision zero-initializes the ViT head: the output would be all zeros
            torch.nn.init.normal_(m.heads.head.weight, std=0.02)
            torch.nn.init.normal_(m.heads.head.bias, std=0.02)
        if name == "mobilenet_v2":
            calibrate_bn(m)
        m.eval()

        class Image(Wrapper):
            def forward(self, pixel_values):
                return self.net(pixel_values)
        return Image(m).eval(), ["pixel_values"], None

    if name in ARCH_BLOCKS:
        class Image(Wrapper):
            def forward(self, pixel_values):
                return self.net(pixel_values)
        return Image(arch_block(name)).eval(), ["pixel_values"], None

    import transformers
    # attn_implementation="eager": attention as plain MatMul/Softmax ops in the ONNX export (SDPA
    # would trace into a fused op or a data-dependent mask path), and the same math in every peer.
    def make(model_cls, config_cls):
        cfg = config_cls(attn_implementation="eager")
        hf = model_cls(cfg)
        if getattr(hf.config, "_attn_implementation", "eager") != "eager":
            hf.set_attn_implementation("eager")
        return hf, cfg.vocab_size

    if name == "bert":
        hf, vocab = make(transformers.BertModel, transformers.BertConfig)  # bert-base defaults

        class Bert(Wrapper):
            def forward(self, input_ids, attention_mask):
                return self.net(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        return Bert(hf).eval(), ["input_ids", "attention_mask"], vocab
    if name == "gpt2":
        hf, vocab = make(transformers.GPT2LMHeadModel, transformers.GPT2Config)  # gpt2 (124M) defaults

        class Gpt2(Wrapper):  # one 128-token prefill, no KV cache, logits out
            def forward(self, input_ids):
                # An explicit all-ones mask (same math): with none, transformers 5 probes position_ids for
                # packed sequences with aten::diff, which the TorchScript exporter cannot export.
                mask = torch.ones_like(input_ids)
                return self.net(input_ids=input_ids, attention_mask=mask, use_cache=False).logits
        return Gpt2(hf).eval(), ["input_ids"], vocab
    raise ValueError(f"unknown model {name}")


def arch_block(name):
    import torch
    from torch import nn
    import torch.nn.functional as F

    class UNetBlock(nn.Module):  # GroupNorm(32) -> SiLU -> conv, twice, residual; nearest 2x upsample
        def __init__(self):
            super().__init__()
            self.inp = nn.Conv2d(3, 128, 3, stride=2, padding=1)
            self.n1, self.c1 = nn.GroupNorm(32, 128), nn.Conv2d(128, 128, 3, padding=1)
            self.n2, self.c2 = nn.GroupNorm(32, 128), nn.Conv2d(128, 128, 3, padding=1)
            self.out = nn.Conv2d(128, 3, 3, padding=1)

        def forward(self, x):
            h = self.inp(x)
            r = self.c2(F.silu(self.n2(self.c1(F.silu(self.n1(h))))))
            return self.out(F.interpolate(h + r, scale_factor=2.0, mode="nearest"))

    class SegHead(nn.Module):  # strided convs, 1x1 classifier, bilinear resize back to the input size
        def __init__(self):
            super().__init__()
            self.body = nn.Sequential(nn.Conv2d(3, 64, 3, stride=4, padding=1), nn.BatchNorm2d(64), nn.ReLU(),
                                      nn.Conv2d(64, 128, 3, stride=2, padding=1), nn.ReLU(), nn.Conv2d(128, 21, 1))

        def forward(self, x):
            return F.interpolate(self.body(x), size=x.shape[-2:], mode="bilinear", align_corners=False)

    class StyleNet(nn.Module):  # reflection pads, InstanceNorm(affine) + ReLU, a constant pad
        def __init__(self):
            super().__init__()
            self.c1, self.n1 = nn.Conv2d(3, 32, 9), nn.InstanceNorm2d(32, affine=True)
            self.c2, self.n2 = nn.Conv2d(32, 64, 3, stride=2), nn.InstanceNorm2d(64, affine=True)
            self.c3 = nn.Conv2d(64, 3, 3)

        def forward(self, x):
            h = F.relu(self.n1(self.c1(F.pad(x, (4, 4, 4, 4), mode="reflect"))))
            h = F.relu(self.n2(self.c2(F.pad(h, (1, 1, 1, 1), mode="reflect"))))
            return self.c3(F.pad(h, (1, 1, 1, 1)))

    m = {"unet_block": UNetBlock, "seg_head": SegHead, "style_net": StyleNet}[name]()
    for mod in m.modules():  # non-trivial affine parameters, so a dropped scale or shift shows
        if isinstance(mod, (nn.GroupNorm, nn.InstanceNorm2d, nn.BatchNorm2d)) and mod.weight is not None:
            nn.init.uniform_(mod.weight, 0.5, 1.5)
            nn.init.uniform_(mod.bias, -0.2, 0.2)
    return m


def calibrate_bn(m, batch=16):
    """A fresh BatchNorm is the identity (mean 0, var 1): random MobileNetV2's activations then shrink to
    ~1e-9 and underflow fp16. Set running_var from seeded random images (scale only: running_mean stays 0;
    centering too makes the random net chaotic, fp16 weight rounding alone then moves the logits ~1%)."""
    import torch
    bns = [x for x in m.modules() if isinstance(x, torch.nn.modules.batchnorm._BatchNorm)]
    for bn in bns:
        bn.reset_running_stats()
        bn.momentum = None  # cumulative average over the calibration batch
    m.train()
    with torch.no_grad():
        m(torch.randn(batch, 3, 224, 224, generator=torch.Generator().manual_seed(2)))
    for bn in bns:
        bn.running_mean.zero_()
    m.eval()


def make_inputs(names, vocab, batch):
    """Deterministic CPU inputs (seed 1): images ~ N(0,1), token ids in [0, vocab), all-ones mask."""
    import torch
    g = torch.Generator().manual_seed(1)
    out = {}
    for n in names:
        if n == "pixel_values":
            out[n] = torch.randn(batch, 3, 224, 224, generator=g)
        elif n == "input_ids":
            out[n] = torch.randint(0, vocab, (batch, SEQ), generator=g, dtype=torch.int64)
        else:
            out[n] = torch.ones(batch, SEQ, dtype=torch.int64)
    return out


# ---- phase 2: ONNX export -----------------------------------------------------------------------

def export_onnx(model, inputs, path):
    """fp32 ONNX, opset 17, dim 0 of every input and of "output" named "batch". Returns the exporter used."""
    import torch
    names, args = list(inputs), tuple(inputs.values())  # batch-2 example: no 0/1 specialization
    try:  # TorchScript exporter: widest op compatibility
        torch.onnx.export(model, args, path, input_names=names, output_names=["output"], opset_version=17,
                          dynamic_axes={n: {0: "batch"} for n in names + ["output"]},
                          do_constant_folding=True, dynamo=False)
        return "torchscript"
    except Exception as e:
        print(f"  torchscript export failed ({describe(e)}); trying dynamo=True")
    import onnx
    batch = torch.export.Dim("batch", min=1, max=4096)
    for opset in (17, 18):  # the down-conversion to 17 can yield an invalid model; 18 is native
        torch.onnx.export(model, args, path, input_names=names, output_names=["output"], opset_version=opset,
                          dynamic_shapes={n: {0: batch} for n in names}, do_constant_folding=True,
                          dynamo=True, external_data=False)
        try:
            onnx.checker.check_model(path)
            break
        except Exception as e:
            print(f"  dynamo export at opset {opset} is invalid ({str(e)[:200]})")
    opsets = onnx.load(path, load_external_data=False).opset_import  # the converter may have kept 18
    return "dynamo-opset" + ",".join(str(o.version) for o in opsets if o.domain in ("", "ai.onnx"))


def pin_output_dims(path, shape):
    """Declares the output as [batch, *shape]: the exporter may leave the fixed dims symbolic."""
    import onnx
    m = onnx.load(path)
    dims = m.graph.output[0].type.tensor_type.shape.dim
    del dims[:]
    dims.add().dim_param = "batch"
    for d in shape:
        dims.add().dim_value = int(d)
    onnx.save(m, path)


def ort_rel_l2(path, inputs, ref):
    """Sanity check of the export itself: onnxruntime (CPU, fp32) vs the torch reference."""
    import onnxruntime as ort
    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    got = sess.run(None, {k: v.numpy() for k, v in inputs.items()})[0]
    return rel_l2(got, ref)


# ---- phase 3: correctness -----------------------------------------------------------------------

def describe(e):
    return f"{type(e).__name__}: {' '.join(str(e).split())[:300]}"


def rel_l2(got, ref):
    import numpy as np
    got, ref = np.asarray(got, np.float64), np.asarray(ref, np.float64)
    if got.shape != ref.shape:
        raise ValueError(f"shape {got.shape} != reference {ref.shape}")
    return float(np.linalg.norm(got - ref) / max(np.linalg.norm(ref), 1e-30))


def run_cmd(cmd, timeout):
    """Runs cmd; returns (error or None, stdout): error is stderr's last line (CLI11's hint line skipped)."""
    print("  $ " + shlex.join(cmd))
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return f"timed out after {timeout} s", ""
    except OSError as e:
        return str(e), ""
    if p.returncode != 0:
        lines = [l for l in (p.stderr or p.stdout).splitlines() if l.strip() and not l.startswith("Run with --help")]
        return (lines[-1] if lines else f"exit code {p.returncode}"), p.stdout
    return None, p.stdout


def kiln_check(args, name, onnx_path, inputs, ref):
    """Runs `kiln run --fp16` on one batch of inputs; compares OUTPUT.npy with the fp32 torch output."""
    import numpy as np
    b = next(iter(inputs.values())).shape[0]
    in_dir = os.path.join(args.out, f"{name}_b{b}_in")
    out_dir = os.path.join(args.out, f"{name}_b{b}_out")
    os.makedirs(in_dir, exist_ok=True)
    cmd = [args.kiln, "run", onnx_path]
    for n, t in inputs.items():
        cmd += ["--shapes", f"{n}:" + "x".join(str(d) for d in t.shape)]
    for n, t in inputs.items():
        f = os.path.join(in_dir, f"{n}.npy")
        np.save(f, t.numpy())
        cmd += ["--input", f"{n}={f}"]
    cmd += ["--output-dir", out_dir, "--fp16"]
    err, stdout = run_cmd(cmd, args.kiln_timeout)
    if err:
        return {"batch": b, "status": "ERROR", "error": err}
    got = np.load(os.path.join(out_dir, "output.npy")).astype(np.float64)
    r = {"batch": b, "backend": next((l[8:].strip() for l in stdout.splitlines() if l.startswith("backend:")), "?")}
    try:
        r["rel_l2"] = rel_l2(got, ref)
        r["max_abs"] = float(np.abs(got - ref).max())
        if name in CLASSIFIERS:
            r["top1_agree"] = float((got.argmax(-1) == ref.argmax(-1)).mean())
        r["status"] = "PASS" if r["rel_l2"] < REL_L2_PASS else "FAIL"  # NaN fails
    except ValueError as e:
        r.update(status="FAIL", error=str(e))
    return r


# ---- phase 4: timing ----------------------------------------------------------------------------

def percentile(xs, p):  # nearest rank, as kiln reports it
    import math
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, math.ceil(p / 100 * len(xs)) - 1))]


def time_cuda(fn, batch, warmup, iters):
    """CUDA events around each call; one synchronize at the end."""
    import torch
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(iters)]
    for s, e in ev:
        s.record()
        fn()
        e.record()
    torch.cuda.synchronize()
    ms = [s.elapsed_time(e) for s, e in ev]
    med = percentile(ms, 50)
    return {"median_ms": med, "p90_ms": percentile(ms, 90), "p99_ms": percentile(ms, 99), "min_ms": min(ms),
            "throughput": batch * 1000.0 / med}


def time_torch(model16, inputs, mode, args):
    """mode: "eager", "compile" (torch.compile default) or "max-autotune". Compilation is timed apart."""
    import torch
    b = next(iter(inputs.values())).shape[0]
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    with torch.inference_mode():
        fn = model16
        res = {}
        if mode != "eager":
            import torch._dynamo
            torch._dynamo.reset()  # fresh, static-shape compile per (model, batch)
            fn = torch.compile(model16, mode=None if mode == "compile" else mode, dynamic=False)
            t0 = time.perf_counter()
            fn(**inputs)
            torch.cuda.synchronize()
            res["compile_s"] = time.perf_counter() - t0
        res.update(time_cuda(lambda: fn(**inputs), b, args.warmup, args.iters))
    res["gpu_memory_bytes"] = torch.cuda.max_memory_allocated()
    return res


def kiln_bench(args, name, onnx_path, batch):
    jf = os.path.join(args.out, f"{name}_b{batch}_kiln.json")
    if os.path.exists(jf):
        os.remove(jf)
    cmd = [args.kiln, "bench", onnx_path, "--fp16", "--batch", str(batch), "--warmup", str(args.warmup),
           "--iterations", str(args.iters), "--json", jf]
    err, _ = run_cmd(cmd, args.kiln_timeout)
    if err:
        return {"error": err}
    try:
        with open(jf) as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        return {"error": f"cannot read {jf}: {e}"}


def count_flops(model, inputs):
    from torch.utils.flop_counter import FlopCounterMode
    import torch
    with torch.no_grad(), FlopCounterMode(display=False) as fc:
        model(**inputs)
    return int(fc.get_total_flops())


def floor_ms(flops_b1, params, inputs_b1, out_numel_b1, batch):
    """Physical floor: compute at PEAK_FLOPS vs fp16 weights + inputs + fp16 output at PEAK_BYTES."""
    in_bytes = sum((t.numel() * (2 if t.is_floating_point() else t.element_size())) for t in inputs_b1.values())
    compute = flops_b1 * batch / PEAK_FLOPS * 1e3
    memory = (2 * params + batch * (in_bytes + 2 * out_numel_b1)) / PEAK_BYTES * 1e3
    return {"compute_ms": compute, "memory_ms": memory, "floor_ms": max(compute, memory)}


# ---- per model ----------------------------------------------------------------------------------

def bench_model(args, name):
    import torch
    rec = {"model": name, "rows": [], "errors": []}
    model, names, vocab = build_model(name)
    rec["params"] = sum(p.numel() for p in model.parameters())
    onnx_path = os.path.join(args.out, f"{name}.onnx")
    checks_in = {b: make_inputs(names, vocab, b) for b in (1, 2)}
    t0 = time.perf_counter()
    rec["exporter"] = export_onnx(model, checks_in[2], onnx_path)
    rec["export_s"] = time.perf_counter() - t0
    print(f"  exported {onnx_path} via {rec['exporter']} in {rec['export_s']:.1f} s, {rec['params'] / 1e6:.1f} M params")

    # fp32 reference on the GPU with TF32 off; FLOPs at batch 1.
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    model = model.cuda()
    refs = {}
    with torch.inference_mode():
        for b, inp in checks_in.items():
            refs[b] = model(**{k: v.cuda() for k, v in inp.items()}).float().cpu().numpy()
    rec["flops_b1"] = count_flops(model, {k: v.cuda() for k, v in checks_in[1].items()})
    rec["out_shape_b1"] = list(refs[1].shape)
    pin_output_dims(onnx_path, refs[1].shape[1:])
    try:
        rec["ort_rel_l2_b2"] = ort_rel_l2(onnx_path, checks_in[2], refs[2])
        print(f"  onnxruntime fp32 vs torch (export sanity): rel-L2 {rec['ort_rel_l2_b2']:.2e}")
    except Exception as e:
        rec["ort_rel_l2_b2"] = None
        print("  onnxruntime check skipped: " + describe(e))

    if not args.skip_kiln:
        rec["checks"] = []
        for b in (1, 2):
            try:
                rec["checks"].append(kiln_check(args, name, onnx_path, checks_in[b], refs[b]))
            except Exception as e:  # e.g. no output.npy written
                rec["checks"].append({"batch": b, "status": "ERROR", "error": describe(e)})
        for c in rec["checks"]:
            print(f"  check b{c['batch']}: {c['status']} " + " ".join(
                f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in c.items() if k not in ("batch", "status")))
        st = [c["status"] for c in rec["checks"]]
        rec["check"] = "ERROR" if "ERROR" in st and "FAIL" not in st else ("FAIL" if "FAIL" in st else "PASS")
        rels = [c["rel_l2"] for c in rec["checks"] if "rel_l2" in c]
        rec["check_rel_l2"] = float("nan") if any(r != r for r in rels) else max(rels, default=None)
        rec["errors"] += [f"check b{c['batch']}: {c['error']}" for c in rec["checks"] if "error" in c]
        rec["errors"] += [f"check b{c['batch']}: kiln ran on '{c['backend']}', not cuda" for c in rec["checks"]
                          if not c.get("backend", "cuda").startswith("cuda")]

    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    model16 = model.half()
    try:  # torch's own fp16 error at batch 2: the yardstick for kiln's
        with torch.inference_mode():
            x16 = {k: (v.half() if v.is_floating_point() else v).cuda() for k, v in checks_in[2].items()}
            rec["torch_fp16_rel_l2"] = rel_l2(model16(**x16).float().cpu().numpy(), refs[2])
        print(f"  torch eager fp16 vs fp32: rel-L2 {rec['torch_fp16_rel_l2']:.2e}")
    except Exception as e:
        rec["errors"].append("torch fp16 check: " + describe(e))
    batches = [b for b in (1, LARGE_BATCH[name]) if not (args.large_batch_only and b == 1)
               and not (args.batch1_only and b != 1)]
    modes = ["eager", "compile"] + (["max-autotune"] if args.max_autotune else [])
    for b in batches:
        row = {"model": name, "batch": b,
               **floor_ms(rec["flops_b1"], rec["params"], checks_in[1], int(refs[1].size), b)}
        inp = {k: (v.half() if v.is_floating_point() else v).cuda() for k, v in make_inputs(names, vocab, b).items()}
        for mode in ([] if args.skip_torch else modes):
            try:
                row[mode] = time_torch(model16, inp, mode, args)
                print(f"  b{b} {mode}: {row[mode]['median_ms']:.3f} ms"
                      + (f" (compile {row[mode]['compile_s']:.1f} s)" if "compile_s" in row[mode] else ""))
            except Exception as e:
                row[mode] = {"error": describe(e)}
                rec["errors"].append(f"b{b} {mode}: {row[mode]['error']}")
                print(f"  b{b} {mode} failed: {row[mode]['error']}")
            torch.cuda.empty_cache()
        del inp
        torch.cuda.empty_cache()
        if not args.skip_kiln:
            row["kiln"] = kiln_bench(args, name, onnx_path, b)
            if "error" in row["kiln"]:
                rec["errors"].append(f"b{b} kiln: {row['kiln']['error']}")
            elif row["kiln"].get("backend") != "cuda" or row["kiln"].get("precision") != "fp16":
                rec["errors"].append(f"b{b} kiln bench ran {row['kiln'].get('backend')} "
                                     f"{row['kiln'].get('precision')}, not cuda fp16")
            print(f"  b{b} kiln: " + (f"{row['kiln'].get('median_ms', float('nan')):.3f} ms"
                                      if "error" not in row["kiln"] else f"failed: {row['kiln']['error']}"))
        rec["rows"].append(row)
    del model, model16
    return rec


# ---- phase 5: report ----------------------------------------------------------------------------

def fmt(x, spec=".3f"):
    return "-" if x is None else "nan" if x != x else format(x, spec)


def render_table(records, max_autotune):
    cols = ["model", "batch", "eager ms", "compile ms"] + (["max-autotune ms"] if max_autotune else []) + [
        "kiln ms", "kiln p99 ms", "eager items/s", "compile items/s", "kiln items/s", "kiln/eager", "kiln/compile"] + (
        ["kiln/max-autotune"] if max_autotune else []) + ["check (rel-L2)", "floor ms", "compute ms", "memory ms"]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for rec in records:
        if not rec["rows"]:
            lines.append(f"| {rec['model']} | - | " + " | ".join(["-"] * (len(cols) - 3))
                         + f" | ERROR: {'; '.join(rec['errors'])[:120]} |")
            continue
        for r in rec["rows"]:
            g = lambda k, f: (r.get(k) or {}).get(f)
            e, c, k = g("eager", "median_ms"), g("compile", "median_ms"), g("kiln", "median_ms")
            check = rec.get("check", "-")
            if rec.get("check_rel_l2") is not None:
                check += f" {fmt(rec['check_rel_l2'], '.1e')}"
            if any(not c.get("backend", "cuda").startswith("cuda") for c in rec.get("checks", [])):
                check += " [kiln not on cuda]"
            if rec.get("torch_fp16_rel_l2") is not None:
                check += f" (torch fp16 {fmt(rec['torch_fp16_rel_l2'], '.1e')})"
            kiln_ms = fmt(k) if k is not None else ("ERR" if "error" in (r.get("kiln") or {}) else "-")
            cells = [rec["model"], str(r["batch"]), fmt(e), fmt(c)]
            cells += [fmt(g("max-autotune", "median_ms"))] if max_autotune else []
            cells += [kiln_ms, fmt(g("kiln", "p99_ms")), fmt(g("eager", "throughput"), ".0f"),
                      fmt(g("compile", "throughput"), ".0f"), fmt(g("kiln", "throughput"), ".0f"),
                      fmt(e / k if e and k else None, ".2f") + ("x" if e and k else ""),
                      fmt(c / k if c and k else None, ".2f") + ("x" if c and k else "")]
            if max_autotune:
                a = g("max-autotune", "median_ms")
                cells += [fmt(a / k if a and k else None, ".2f") + ("x" if a and k else "")]
            cells += [check, fmt(r["floor_ms"]), fmt(r["compute_ms"]), fmt(r["memory_ms"])]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def header(args):
    import torch
    h = {"device": torch.cuda.get_device_name() if torch.cuda.is_available() else "no CUDA device",
         "date_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC"),
         "torch": torch.__version__, "commit": args.commit, "command": shlex.join([sys.executable] + sys.argv),
         "iters": args.iters, "warmup": args.warmup, "precision": "fp16 (reference: fp32 torch eager, TF32 off)",
         "floor": f"max(FLOPs / {PEAK_FLOPS:.0e} FLOP/s, bytes / {PEAK_BYTES:.1e} B/s)"}
    for mod in ("torchvision", "transformers", "onnx", "onnxruntime"):
        try:
            h[mod] = __import__(mod).__version__
        except Exception:
            h[mod] = None
    return h


def write_results(args, hdr, records):
    table = render_table(records, args.max_autotune)
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump({"header": hdr, "models": records}, f, indent=1, default=str)
    md = ["# kiln peer comparison", ""] + [f"- {k}: {v}" for k, v in hdr.items() if v is not None] + ["", table, ""]
    for rec in records:
        md += [f"- {rec['model']}: {e}" for e in rec["errors"]]
    with open(os.path.join(args.out, "results.md"), "w") as f:
        f.write("\n".join(md) + "\n")
    return table


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--kiln", default="build/kiln", help="kiln binary (default build/kiln)")
    p.add_argument("--models", default=",".join(m for m in MODELS if m not in ARCH_BLOCKS),
                   help="comma list from " + ",".join(MODELS) + " (default: the first five)")
    p.add_argument("--out", default="/tmp/kiln-peers", help="folder for ONNX files, .npy data and results")
    p.add_argument("--iters", type=int, default=200, help="timed iterations (default 200)")
    p.add_argument("--warmup", type=int, default=50, help="untimed warm-up iterations (default 50)")
    p.add_argument("--max-autotune", action="store_true", help='also torch.compile(mode="max-autotune")')
    p.add_argument("--skip-kiln", action="store_true", help="no kiln runs (no correctness check either)")
    p.add_argument("--skip-torch", action="store_true", help="no eager/torch.compile timing")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--large-batch-only", action="store_true", help="time only the large batch")
    g.add_argument("--batch1-only", action="store_true", help="time only batch 1")
    p.add_argument("--commit", default=None, help="kiln git commit, recorded in the header")
    p.add_argument("--kiln-timeout", type=int, default=900, help="seconds per kiln invocation (default 900)")
    a = p.parse_args(argv)
    a.models = [m.strip() for m in a.models.split(",") if m.strip()]
    bad = [m for m in a.models if m not in MODELS]
    if bad:
        p.error(f"unknown model(s) {bad}; choose from {','.join(MODELS)}")
    if a.iters < 1 or a.warmup < 0:
        p.error("--iters must be >= 1 and --warmup >= 0")
    return a


def main(argv=None):
    args = parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    if not args.skip_kiln and not os.access(args.kiln, os.X_OK):
        print(f"warning: kiln binary '{args.kiln}' is not executable; kiln runs will fail", file=sys.stderr)
    args.kiln = os.path.abspath(args.kiln) if os.path.exists(args.kiln) else args.kiln
    import torch
    if not torch.cuda.is_available():
        sys.exit("peers.py needs a CUDA GPU")
    hdr = header(args)
    print(json.dumps(hdr, indent=1))
    records = []
    for name in args.models:
        print(f"== {name}")
        try:
            rec = bench_model(args, name)
        except Exception as e:
            traceback.print_exc()
            rec = {"model": name, "rows": [], "errors": [describe(e)]}
        records.append(rec)
        import gc
        gc.collect()
        torch.cuda.empty_cache()
        write_results(args, hdr, records)  # after every model: a killed run keeps what it finished
    print("\n" + write_results(args, hdr, records))
    for rec in records:
        for e in rec["errors"]:
            print(f"error: {rec['model']}: {e}")
    print(f"\nwrote {os.path.join(args.out, 'results.json')} and results.md")
    bad = [r["model"] for r in records if r["errors"] or r.get("check") not in (None, "PASS")]
    if bad:
        print("not clean: " + ", ".join(bad))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
