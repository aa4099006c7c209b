"""Tensor parallelism end to end through the CLI (what `make tp` runs):

  python3 tests/tp/check.py KILN TMPDIR [--device cpu|cuda] [--ranks 1,2,4]

On a GPT-2-style and a Llama-style model (tests/tp/models.py, random weights), for each rank count:
kiln's logits equal onnxruntime's (rel-L2 under 1e-4 in fp32); an engine file of the split model
loads and gives the same bytes as the build that wrote it; `kiln plan-parallel` reports per-GPU
weights that shrink with the ranks and the collectives the split needs (two AllReduce per layer,
one for the vocabulary-split embedding, one AllGather of the logits); grouped KV heads that do not
divide by the ranks keep attention whole (the report says why) and the answer stays right; and a
split without fixed shapes is a one-line error. On the CPU the ranks are threads joined by the
reference collectives; with --device cuda, GPUs through NCCL.
"""
import json
import os
import subprocess
import sys

import numpy as np
import onnxruntime as ort

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import models  # noqa: E402

KILN, TMP = sys.argv[1], sys.argv[2]
DEVICE = sys.argv[sys.argv.index("--device") + 1] if "--device" in sys.argv else "cpu"
RANKS = [int(r) for r in (sys.argv[sys.argv.index("--ranks") + 1] if "--ranks" in sys.argv else "1,2,4").split(",")]
failures = []


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what)
    if not ok:
        failures.append(what)


def kiln(*args, expect_ok=True):
    r = subprocess.run([KILN, *args], capture_output=True, text=True)
    if expect_ok and r.returncode != 0:
        raise SystemExit(f"kiln {' '.join(args)} failed:\n{r.stderr}")
    return r


def rel(a, b):
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-12))


def run(model, ids_file, out_dir, *extra):
    kiln("run", model, "--device", DEVICE, "--input", f"input_ids={ids_file}", "--output-dir", out_dir, *extra)
    return np.load(os.path.join(out_dir, "logits.npy"))


for kind, make, layers in (("gpt2", models.gpt2, 2), ("llama", models.llama, 2)):
    path = os.path.join(TMP, f"{kind}.onnx")
    make(path, layers=layers)
    ids = np.random.default_rng(7).integers(0, 50, size=(1, 8)).astype(np.int64)
    ids_file = os.path.join(TMP, f"{kind}_ids.npy")
    np.save(ids_file, ids)
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    ref = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"]).run(None, {"input_ids": ids})[0]
    tol = 1e-4 if DEVICE == "cpu" else 2e-2
    # One sequence of 8 tokens: the logits (8 x vocab) stay small beside the LM head's weight
    # (hidden x vocab), so the head splits by vocabulary and its logits are gathered.
    shapes = ["--shapes", "input_ids:1x8"]
    outs = {}
    for n in RANKS:
        out = run(path, ids_file, os.path.join(TMP, f"{kind}_out{n}"), *shapes, "--tensor-parallel", str(n))
        outs[n] = out
        check(out.shape == ref.shape and rel(out, ref) < tol,
              f"{kind}, {n} rank(s) on {DEVICE}: logits match onnxruntime (rel-L2 {rel(out, ref):.2e} < {tol})")

    # The engine file of a split model: built, saved, loaded, run, bit for bit the same.
    n = max(RANKS)
    if n > 1:
        engine = os.path.join(TMP, f"{kind}_tp{n}.kiln")
        r = kiln("build", path, "--device", DEVICE, *shapes, "--tensor-parallel", str(n), "-o", engine, "--report")
        check("tensor parallel: %d ranks" % n in r.stdout + r.stderr, f"{kind}: the build report states the split")
        loaded = run(engine, ids_file, os.path.join(TMP, f"{kind}_loaded"))
        check(np.array_equal(loaded, outs[n]), f"{kind}: the {n}-rank engine file gives the built engine's bytes")
        r = kiln("run", engine, "--device", DEVICE, "--input", f"input_ids={ids_file}", "--tensor-parallel", "3",
                 expect_ok=False)
        check(r.returncode != 0 and "built for %d rank" % n in r.stderr,
              f"{kind}: running a {n}-rank engine file with --tensor-parallel 3 is refused: {r.stderr.strip()}")
        r = kiln("inspect", engine)
        check(f"tensor parallel: {n} ranks" in r.stdout and "AllReduce" in r.stdout,
              f"{kind}: kiln inspect shows the ranks and the split")
        data = open(engine, "rb").read()
        for cut in (20, len(data) // 2, len(data) - 10):  # the header, rank 0's file, the last rank's
            damaged = os.path.join(TMP, f"{kind}_cut.kiln")
            open(damaged, "wb").write(data[:cut])
            r = kiln("run", damaged, "--device", DEVICE, "--input", f"input_ids={ids_file}", expect_ok=False)
            msg = r.stderr.strip()
            check(r.returncode != 0 and damaged in msg and len(msg.splitlines()) == 1,
                  f"{kind}: an engine file cut at {cut} of {len(data)} bytes is a one-line error naming it: {msg[:150]}")

    # Micro-batches: a batch of 4 as 2 micro-batches of 2 rows at once (asked for: by default they
    # need GPU ranks and all-reduces of 16 MiB, and this model's are a few KiB), as 1, and through an
    # engine file; each against onnxruntime at batch 4.
    n = max(RANKS)
    if n > 1:
        ids4 = np.random.default_rng(8).integers(0, 50, size=(4, 8)).astype(np.int64)
        ids4_file = os.path.join(TMP, f"{kind}_ids4.npy")
        np.save(ids4_file, ids4)
        ref4 = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"]).run(None, {"input_ids": ids4})[0]
        r = kiln("build", path, "--device", DEVICE, "--batch", "4", "--tensor-parallel", str(n), "--report")
        out = r.stdout + r.stderr
        why = ("micro-batches: 1 (a micro-batch's largest all-reduce would carry" if DEVICE == "cuda" else
               "micro-batches: 1 (the ranks run on the CPU")
        check(why in out, f"{kind}: by default one batch (all-reduces this small, or CPU ranks), and the report says why")
        engine = os.path.join(TMP, f"{kind}_micro.kiln")
        r = kiln("build", path, "--device", DEVICE, "--batch", "4", "--tensor-parallel", str(n), "--micro-batches", "2",
                 "-o", engine, "--report")
        check("micro-batches: 2 of 2 rows" in r.stdout + r.stderr, f"{kind}: the report says the batch of 4 runs as 2 "
              "micro-batches")
        micro = run(engine, ids4_file, os.path.join(TMP, f"{kind}_micro"))
        one = run(path, ids4_file, os.path.join(TMP, f"{kind}_one"), "--batch", "4", "--tensor-parallel", str(n),
                  "--micro-batches", "1")
        check(micro.shape == ref4.shape and rel(micro, ref4) < tol and rel(one, ref4) < tol,
              f"{kind}, {n} ranks, batch 4: 2 micro-batches (rel-L2 {rel(micro, ref4):.2e}) and one batch "
              f"({rel(one, ref4):.2e}) match onnxruntime")
        r = kiln("inspect", engine)
        check("micro-batches: 2" in r.stdout, f"{kind}: kiln inspect shows the micro-batches")
        ids3_file = os.path.join(TMP, f"{kind}_ids3.npy")
        np.save(ids3_file, ids4[:3])
        r = kiln("run", engine, "--input", f"input_ids={ids3_file}", expect_ok=False)
        msg = r.stderr.strip()
        check(r.returncode != 0 and "input_ids" in msg and "[4,8]" in msg and len(msg.splitlines()) == 1,
              f"{kind}: 3 rows for a micro-batched engine of 4 is a one-line error naming the input: {msg}")
        r = kiln("run", path, "--device", DEVICE, "--batch", "4", "--tensor-parallel", str(n), "--micro-batches", "3",
                 "--input", f"input_ids={ids4_file}", expect_ok=False)
        msg = r.stderr.strip()
        check(r.returncode != 0 and "does not divide into 3" in msg and len(msg.splitlines()) == 1,
              f"{kind}: 3 micro-batches of a batch of 4 is a one-line error: {msg}")

    # The estimator: per-GPU weights shrink with the ranks; the collectives the split needs.
    est_file = os.path.join(TMP, f"{kind}_est.json")
    kiln("plan-parallel", path, *shapes, "--gpus", "1,2,4", "--no-measure", "--json", est_file)
    est = {e["gpus"]: e for e in json.load(open(est_file))}
    check(est[1]["all_reduces"] == 0 and est[1]["all_gathers"] == 0, f"{kind}: one GPU needs no collective")
    check(est[2]["weight_bytes"] < 0.6 * est[1]["weight_bytes"],
          f"{kind}: 2 GPUs hold {est[2]['weight_bytes']} weight bytes each, under 60% of {est[1]['weight_bytes']}")
    check(est[2]["all_reduces"] == 2 * layers + 1 and est[2]["all_gathers"] == 1,
          f"{kind}: 2 ranks: {est[2]['all_reduces']} AllReduce (2 per layer + the embedding), {est[2]['all_gathers']} "
          "AllGather (the logits)")
    # Every collective's tensor counts: an all-reduce carries the fp32 hidden state of every token
    # (32 wide in both models), the gather the logits (vocabulary 50 and 64).
    vocab = 50 if kind == "gpt2" else 64
    for g in (2, 4):
        want = (est[g]["all_reduces"] * 32 + est[g]["all_gathers"] * vocab) * 4 * est[g]["tokens"]
        check(est[g]["payload_bytes"] == want, f"{kind}, {g} GPUs: {est[g]['payload_bytes']} bytes per forward through "
              f"the collectives, the embedding's all-reduce included (expected {want:.0f})")
    check(est[2]["bus_bytes"] > 0 and est[2]["kv_bytes_per_token"] < est[1]["kv_bytes_per_token"],
          f"{kind}: 2 GPUs: KV per token {est[2]['kv_bytes_per_token']:.0f} B (1 GPU: {est[1]['kv_bytes_per_token']:.0f})")
    if kind == "llama":  # 2 KV heads over 4 ranks: attention stays whole, the MLP still splits
        kept = " ".join(est[4]["kept_whole"])
        check("do not divide" in kept or "does not divide" in kept,
              f"llama, 4 ranks: the report says the 2 KV heads do not divide ({kept[:120]}...)")
        check(est[4]["weight_bytes"] < est[2]["weight_bytes"], "llama, 4 ranks: the MLP and head still split")

    # Without fixed shapes the split is refused with a one-line error naming the input; `kiln run`
    # takes the shapes from its input files, and then splits.
    r = kiln("build", path, "--device", DEVICE, "--tensor-parallel", "2", "-o", os.path.join(TMP, "sym.kiln"),
             expect_ok=False)
    msg = r.stderr.strip()
    check(r.returncode != 0 and "input_ids" in msg and "fixed" in msg and len(msg.splitlines()) == 1,
          f"{kind}: a split with a symbolic batch is a one-line error: {msg}")
    bound = run(path, ids_file, os.path.join(TMP, f"{kind}_bound"), "--tensor-parallel", "2")
    check(bound.shape == ref.shape and rel(bound, ref) < tol,
          f"{kind}: kiln run splits a symbolic-batch model bound by its input file (rel-L2 {rel(bound, ref):.2e})")

if failures:
    print(f"{len(failures)} check(s) failed")
    sys.exit(1)
print("tensor parallel: all checks passed")
