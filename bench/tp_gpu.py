#!/usr/bin/env python3
"""Tensor parallelism on the GPU machine: kiln at 1, 2 (, 4) ranks on transformers models.

Per model (random fp32 weights from a transformers config, seed 0; one 128-token prefill, no KV
cache, logits out): export ONNX -> for each rank count: `kiln build --fp16 --tensor-parallel N`
into an engine file -> its logits against torch fp32 eager (rel-L2) -> `kiln bench` at batch 1 and
the large batch (CUDA events, median and p99) -> `kiln plan-parallel` (the estimator, with the NCCL
all-reduce measured at the model's message size) -> torch eager fp16 and torch.compile on one GPU
as the peers. Writes OUT/TAG.json and OUT/TAG.md (--tag, default tp).

  python3 bench/tp_gpu.py --kiln /tmp/k/bin/kiln --out $OUT --models gpt2-medium,llama-gqa --ranks 1,2
"""
import argparse, json, os, subprocess, sys, time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peers  # noqa: E402  (model export and timing helpers)

SEQ = 128
CONFIGS = {
    # GPT-2 medium (355M) and large (774M) shapes; the vocabulary (50257) does not divide by 2.
    "gpt2-medium": ("GPT2LMHeadModel", "GPT2Config", dict(n_layer=24, n_embd=1024, n_head=16)),
    "gpt2-large": ("GPT2LMHeadModel", "GPT2Config", dict(n_layer=36, n_embd=1280, n_head=20)),
    # Llama-style with grouped KV heads (16 query heads, 4 KV heads), shortened to 6 layers so the
    # fp32 export stays under protobuf's 2 GB.
    "llama-gqa": ("LlamaForCausalLM", "LlamaConfig",
                  dict(hidden_size=2048, intermediate_size=5632, num_hidden_layers=6, num_attention_heads=16,
                       num_key_value_heads=4, vocab_size=32000, max_position_embeddings=512)),
    # Two layers of Llama-2-7B's shapes (4096 hidden, 11008 MLP, 32 heads) with 8 KV heads and tied
    # embeddings: the per-layer work TP is for, under the 2 GB export limit.
    "llama-7b-shape": ("LlamaForCausalLM", "LlamaConfig",
                       dict(hidden_size=4096, intermediate_size=11008, num_hidden_layers=2, num_attention_heads=32,
                            num_key_value_heads=8, vocab_size=32000, max_position_embeddings=512,
                            tie_word_embeddings=True)),
}


def build(name):
    import torch, transformers
    cls, cfg_cls, kw = CONFIGS[name]
    torch.manual_seed(0)
    cfg = getattr(transformers, cfg_cls)(attn_implementation="eager", **kw)
    hf = getattr(transformers, cls)(cfg).eval()

    class Lm(torch.nn.Module):
        def __init__(self, net):
            super().__init__()
            self.net = net

        def forward(self, input_ids):
            mask = torch.ones_like(input_ids)
            return self.net(input_ids=input_ids, attention_mask=mask, use_cache=False).logits
    return Lm(hf).eval(), cfg.vocab_size, sum(p.numel() for p in hf.parameters())


def kiln(args, *cmd, timeout=600):
    t0 = time.time()
    r = subprocess.run([args.kiln, *cmd], capture_output=True, text=True, timeout=timeout)
    if r.returncode != 0:
        raise RuntimeError(f"kiln {' '.join(cmd[:3])}...: {r.stderr.strip()[-600:]}")
    return r, time.time() - t0


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--kiln", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--models", default="gpt2-medium,llama-gqa")
    p.add_argument("--ranks", default="1,2")
    p.add_argument("--batches", default="1,8")
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--iters", type=int, default=100)
    p.add_argument("--peers", default="eager,reduce-overhead")
    p.add_argument("--profile", action="store_true", help="also save `kiln bench --profile` of each engine")
    p.add_argument("--build-flags", default="", help="more `kiln build` flags (write --build-flags=\"--no-autotune\")")
    p.add_argument("--tag", default="tp", help="names OUT/TAG.json and OUT/TAG.md (several runs in one OUT)")
    p.add_argument("--export-only", action="store_true",
                   help="only export the models' ONNX into /tmp/tp_work (run beside other work; a later run reuses them)")
    args = p.parse_args()
    import numpy as np, torch
    os.makedirs(args.out, exist_ok=True)
    work = "/tmp/tp_work"
    os.makedirs(work, exist_ok=True)
    ranks = [int(r) for r in args.ranks.split(",")]
    batches = [int(b) for b in args.batches.split(",")]
    records = []
    for name in args.models.split(","):
        rec = {"model": name, "seq": SEQ}
        records.append(rec)
        try:
            model, vocab, params = build(name)
            rec["params"] = params
            inputs = peers.make_inputs(["input_ids"], vocab, 2)
            path = os.path.join(work, f"{name}.onnx")
            if not os.path.exists(path):  # else an earlier run in this machine's /tmp exported it
                t0 = time.time()
                rec["exporter"] = peers.export_onnx(model, inputs, path)
                rec["export_s"] = time.time() - t0
            if args.export_only:
                continue
            ids1 = inputs["input_ids"][:1]
            np.save(os.path.join(work, f"{name}_ids.npy"), ids1.numpy())
            with torch.inference_mode():
                ref = model(input_ids=ids1).float().numpy()
            model16 = model.half().cuda()
            for b in batches:
                feed = {"input_ids": peers.make_inputs(["input_ids"], vocab, b)["input_ids"].cuda()}
                for mode in [m for m in args.peers.split(",") if m]:
                    try:
                        rec[f"torch_{mode}_b{b}"] = peers.time_torch(model16, feed, mode, args)
                    except Exception as e:  # a peer that fails is recorded, not fatal
                        rec[f"torch_{mode}_b{b}"] = {"error": peers.describe(e)}
            del model16
            torch.cuda.empty_cache()
            for b in batches:
                est_file = os.path.join(work, f"{name}_est{b}.json")
                kiln(args, "plan-parallel", path, "--fp16", "--batch", str(b), "--gpus", ",".join(map(str, ranks)),
                     "--json", est_file)
                rec[f"estimate_b{b}"] = json.load(open(est_file))
            for n in ranks:
                for b in batches:
                    eng = os.path.join(work, f"{name}_tp{n}_b{b}.kiln")
                    r, secs = kiln(args, "build", path, "--fp16", "--batch", str(b), "--tensor-parallel", str(n), "-o", eng,
                                   *args.build_flags.split())
                    key = f"tp{n}_b{b}"
                    rec[key] = {"build_s": secs, "report": r.stdout[-1500:]}
                    if b == 1:
                        out = os.path.join(work, f"{name}_out{n}")
                        kiln(args, "run", eng, "--input", f"input_ids={os.path.join(work, f'{name}_ids.npy')}",
                             "--output-dir", out)
                        got = np.load(os.path.join(out, "output.npy")).astype(np.float32)
                        rec[key]["rel_l2_vs_torch_fp32"] = peers.rel_l2(got, ref)
                    jf = os.path.join(work, f"{name}_{key}.json")
                    # --profile runs its step-by-step forwards after the timed ones, in the same call.
                    prof = ["--profile", "--top", "12"] if args.profile else []
                    r, _ = kiln(args, "bench", eng, "--warmup", str(args.warmup), "--iterations", str(args.iters),
                                "--json", jf, *prof)
                    rec[key].update(json.load(open(jf)))
                    if args.profile:
                        with open(os.path.join(args.out, f"{args.tag}_{name}_{key}_profile.txt"), "w") as f:
                            f.write(r.stdout)
                    os.remove(eng)
        except Exception as e:
            rec["error"] = peers.describe(e)
            print(f"{name}: {rec['error']}", flush=True)
        with open(os.path.join(args.out, f"{args.tag}.json"), "w") as f:
            json.dump(records, f, indent=1, default=str)
    lines = ["| model | ranks | batch | kiln median ms | p99 ms | tokens/s | rel-L2 vs fp32 | build s |",
             "|---|---|---|---|---|---|---|---|"]
    for rec in records:
        for n in ranks:
            for b in batches:
                r = rec.get(f"tp{n}_b{b}", {})
                if "median_ms" in r:
                    lines.append(f"| {rec['model']} | {n} | {b} | {r['median_ms']:.3f} | {r['p99_ms']:.3f} | "
                                 f"{b * SEQ * 1000 / r['median_ms']:.0f} | {r.get('rel_l2_vs_torch_fp32', float('nan')):.2e} | "
                                 f"{r['build_s']:.1f} |")
        for k, v in rec.items():
            if k.startswith("torch_") and isinstance(v, dict) and "median_ms" in v:
                lines.append(f"| {rec['model']} | torch {k[6:]} | | {v['median_ms']:.3f} | {v['p99_ms']:.3f} | | | |")
        if "error" in rec:
            lines.append(f"| {rec['model']} | error: {rec['error'][:200]} |")
    with open(os.path.join(args.out, f"{args.tag}.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
