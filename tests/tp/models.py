"""Small transformer ONNX models written the way exporters write the real ones, with random weights,
for the tensor-parallel tests (tests/tp/check.py) and the GPU benchmark (bench/tp_gpu.py takes
its models from transformers instead).

gpt2(): GPT-2 as torch.onnx.export writes HF's GPT2LMHeadModel: fused Q/K/V through Gemm + Split,
Reshape targets with 0 and -1, a causal mask through Where, tanh GELU decomposed, LayerNormalization,
an LM head tied to the token embedding (the vocabulary need not divide by the ranks).

llama(): a Llama-style decoder: RMSNorm decomposed, separate Q/K/V projections with grouped KV
heads (Unsqueeze + Expand + Reshape, as HF's repeat_kv), rotary embeddings through Slice/Neg/
Concat, SwiGLU, an untied LM head.
"""
import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


class Builder:
    def __init__(self, seed):
        self.rng = np.random.default_rng(seed)
        self.nodes, self.inits, self.n = [], [], 0

    def name(self, base):
        self.n += 1
        return f"{base}_{self.n}"

    def const(self, value, base="c"):
        n = self.name(base)
        self.inits.append(numpy_helper.from_array(np.asarray(value), n))
        return n

    def weight(self, *shape, scale=None):
        scale = scale if scale is not None else 1.0 / np.sqrt(shape[0])
        return self.const((self.rng.standard_normal(shape) * scale).astype(np.float32), "w")

    def op(self, op, inputs, outputs=1, **attrs):
        outs = [self.name(op.lower()) for _ in range(outputs)]
        self.nodes.append(helper.make_node(op, inputs, outs, name=self.name(op), **attrs))
        return outs[0] if outputs == 1 else outs

    def model(self, inputs, outputs):
        g = helper.make_graph(self.nodes, "g", inputs, outputs, self.inits)
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
        m.ir_version = 8
        onnx.checker.check_model(m)
        return m


def causal_mask(s):
    return np.tril(np.ones((s, s), dtype=bool)).reshape(1, 1, s, s)


def gpt2(path, layers=2, hidden=32, heads=4, vocab=50, seq=8, seed=0):
    b = Builder(seed)
    hd = hidden // heads
    wte = (b.rng.standard_normal((vocab, hidden)) * 0.5).astype(np.float32)
    wte_name = b.const(wte, "wte")
    x = b.op("Gather", [wte_name, "input_ids"], axis=0)
    pos = b.op("Gather", [b.weight(seq, hidden, scale=0.1), b.const(np.arange(seq, dtype=np.int64))], axis=0)
    x = b.op("Add", [x, pos])
    mask = b.const(causal_mask(seq), "causal")
    big_neg = b.const(np.array(-1e4, dtype=np.float32))
    for _ in range(layers):
        h = b.op("LayerNormalization", [x, b.const(np.ones(hidden, np.float32)), b.const(np.zeros(hidden, np.float32))], axis=-1)
        h2 = b.op("Reshape", [h, b.const(np.array([-1, hidden], dtype=np.int64))])
        qkv = b.op("Gemm", [h2, b.weight(hidden, 3 * hidden), b.weight(3 * hidden, scale=0.1)])
        qkv = b.op("Reshape", [qkv, b.const(np.array([-1, seq, 3 * hidden], dtype=np.int64))])
        q, k, v = b.op("Split", [qkv, b.const(np.array([hidden] * 3, dtype=np.int64))], outputs=3, axis=2)
        heads4 = b.const(np.array([0, 0, heads, hd], dtype=np.int64))
        q = b.op("Transpose", [b.op("Reshape", [q, heads4])], perm=[0, 2, 1, 3])
        kt = b.op("Transpose", [b.op("Reshape", [k, heads4])], perm=[0, 2, 3, 1])
        v = b.op("Transpose", [b.op("Reshape", [v, heads4])], perm=[0, 2, 1, 3])
        s = b.op("Div", [b.op("MatMul", [q, kt]), b.const(np.array(np.sqrt(hd), dtype=np.float32))])
        s = b.op("Where", [mask, s, big_neg])
        o = b.op("MatMul", [b.op("Softmax", [s], axis=-1), v])
        o = b.op("Reshape", [b.op("Transpose", [o], perm=[0, 2, 1, 3]), b.const(np.array([-1, hidden], dtype=np.int64))])
        o = b.op("Gemm", [o, b.weight(hidden, hidden), b.weight(hidden, scale=0.1)])
        x = b.op("Add", [x, b.op("Reshape", [o, b.const(np.array([-1, seq, hidden], dtype=np.int64))])])
        h = b.op("LayerNormalization", [x, b.const(np.ones(hidden, np.float32)), b.const(np.zeros(hidden, np.float32))], axis=-1)
        h = b.op("Reshape", [h, b.const(np.array([-1, hidden], dtype=np.int64))])
        f = b.op("Gemm", [h, b.weight(hidden, 4 * hidden), b.weight(4 * hidden, scale=0.1)])
        # tanh GELU as GPT-2 writes it: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
        cube = b.op("Mul", [b.op("Pow", [f, b.const(np.array(3.0, dtype=np.float32))]), b.const(np.array(0.044715, dtype=np.float32))])
        t = b.op("Tanh", [b.op("Mul", [b.op("Add", [f, cube]), b.const(np.array(np.sqrt(2 / np.pi), dtype=np.float32))])])
        f = b.op("Mul", [b.op("Mul", [f, b.const(np.array(0.5, dtype=np.float32))]), b.op("Add", [t, b.const(np.array(1.0, dtype=np.float32))])])
        f = b.op("Gemm", [f, b.weight(4 * hidden, hidden), b.weight(hidden, scale=0.1)])
        x = b.op("Add", [x, b.op("Reshape", [f, b.const(np.array([-1, seq, hidden], dtype=np.int64))])])
    x = b.op("LayerNormalization", [x, b.const(np.ones(hidden, np.float32)), b.const(np.zeros(hidden, np.float32))], axis=-1)
    logits = b.op("MatMul", [x, b.op("Transpose", [wte_name], perm=[1, 0])])
    b.nodes[-1].output[0] = "logits"
    m = b.model([helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", seq])],
                [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", seq, vocab])])
    onnx.save(m, path)


def rms_norm(b, x, hidden):
    ms = b.op("ReduceMean", [b.op("Pow", [x, b.const(np.array(2.0, dtype=np.float32))])], axes=[-1], keepdims=1)
    inv = b.op("Reciprocal", [b.op("Sqrt", [b.op("Add", [ms, b.const(np.array(1e-5, dtype=np.float32))])])])
    return b.op("Mul", [b.op("Mul", [x, inv]), b.const((1 + 0.1 * b.rng.standard_normal(hidden)).astype(np.float32))])


def rotary(b, x, cos, sin, hd):
    lo = b.op("Slice", [x, b.const(np.array([0])), b.const(np.array([hd // 2])), b.const(np.array([3]))])
    hi = b.op("Slice", [x, b.const(np.array([hd // 2])), b.const(np.array([hd])), b.const(np.array([3]))])
    rot = b.op("Concat", [b.op("Neg", [hi]), lo], axis=-1)
    return b.op("Add", [b.op("Mul", [x, cos]), b.op("Mul", [rot, sin])])


def llama(path, layers=2, hidden=32, heads=4, kv_heads=2, inter=48, vocab=64, seq=8, seed=1):
    b = Builder(seed)
    hd = hidden // heads
    rep = heads // kv_heads
    x = b.op("Gather", [b.weight(vocab, hidden, scale=0.5), "input_ids"], axis=0)
    inv_freq = 1.0 / (10000 ** (np.arange(0, hd, 2) / hd))
    ang = np.outer(np.arange(seq), inv_freq)
    ang = np.concatenate([ang, ang], axis=-1).reshape(1, 1, seq, hd)
    cos, sin = b.const(np.cos(ang).astype(np.float32)), b.const(np.sin(ang).astype(np.float32))
    mask = b.const(np.where(causal_mask(seq), 0.0, -1e9).astype(np.float32))
    for _ in range(layers):
        h = rms_norm(b, x, hidden)
        q = b.op("MatMul", [h, b.weight(hidden, heads * hd)])
        k = b.op("MatMul", [h, b.weight(hidden, kv_heads * hd)])
        v = b.op("MatMul", [h, b.weight(hidden, kv_heads * hd)])
        q = b.op("Transpose", [b.op("Reshape", [q, b.const(np.array([0, seq, heads, hd]))])], perm=[0, 2, 1, 3])
        k = b.op("Transpose", [b.op("Reshape", [k, b.const(np.array([0, seq, kv_heads, hd]))])], perm=[0, 2, 1, 3])
        v = b.op("Transpose", [b.op("Reshape", [v, b.const(np.array([0, seq, kv_heads, hd]))])], perm=[0, 2, 1, 3])
        q, k = rotary(b, q, cos, sin, hd), rotary(b, k, cos, sin, hd)

        def repeat_kv(t):
            t = b.op("Unsqueeze", [t, b.const(np.array([2]))])
            t = b.op("Expand", [t, b.const(np.array([1, kv_heads, rep, seq, hd]))])
            return b.op("Reshape", [t, b.const(np.array([0, heads, seq, hd]))])

        k, v = repeat_kv(k), repeat_kv(v)
        s = b.op("Mul", [b.op("MatMul", [q, b.op("Transpose", [k], perm=[0, 1, 3, 2])]), b.const(np.array(1 / np.sqrt(hd), dtype=np.float32))])
        o = b.op("MatMul", [b.op("Softmax", [b.op("Add", [s, mask])], axis=-1), v])
        o = b.op("Reshape", [b.op("Transpose", [o], perm=[0, 2, 1, 3]), b.const(np.array([0, seq, hidden]))])
        x = b.op("Add", [x, b.op("MatMul", [o, b.weight(hidden, hidden)])])
        h = rms_norm(b, x, hidden)
        gate = b.op("MatMul", [h, b.weight(hidden, inter)])
        up = b.op("MatMul", [h, b.weight(hidden, inter)])
        act = b.op("Mul", [b.op("Mul", [gate, b.op("Sigmoid", [gate])]), up])
        x = b.op("Add", [x, b.op("MatMul", [act, b.weight(inter, hidden)])])
    logits = b.op("MatMul", [rms_norm(b, x, hidden), b.weight(hidden, vocab)])
    b.nodes[-1].output[0] = "logits"
    m = b.model([helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", seq])],
                [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", seq, vocab])])
    onnx.save(m, path)
