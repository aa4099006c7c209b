#!/usr/bin/env python3
"""ONNX models for the CPU side-by-side (issue 29), written node by node with numpy: no PyTorch needed.

    python3 bench/cpu_models.py --out DIR [--only resnet50,mobilenetv2,bert-base-s128] [--force]

Writes DIR/resnet50.onnx, DIR/mobilenetv2.onnx and DIR/bert-base-s128.onnx (a file that already
exists is kept unless --force): opset 17, fp32, random weights from a fixed seed (the same bytes on
every run), laid out the way torch.onnx.export (TorchScript exporter) writes the torchvision and
HuggingFace models, with the same node and parameter names:

  resnet50        torchvision ResNet-50 v1.5 (bottlenecks 3,4,6,3, stride on the 3x3 conv).
                  input f32[1,3,224,224] -> logits [1,1000]
  mobilenetv2     torchvision MobileNetV2 (ReLU6 as Clip(x, 0, 6), last conv 1280, no dropout).
                  input f32[1,3,224,224] -> logits [1,1000]
  bert-base-s128  transformers BertModel, bert-base (12 layers, hidden 768, 12 heads, FFN 3072),
                  sequence 128, eager attention, erf GELU, additive (1 - mask) * -10000 mask.
                  input_ids, attention_mask, token_type_ids i64[1,128] -> last_hidden_state [1,128,768]

Conv nets keep Conv and BatchNormalization as separate nodes (no Conv+BN folding). Their BN running
statistics are calibrated: a first graph with batch-statistics BN runs once in onnxruntime on 8
seeded N(0,1) images, and the means / variances it measured (rounded to 4 significant digits)
become the inference-form BN's running_mean / running_var, so every BN output is roughly
N(beta, gamma^2) as in a trained net, and the variances are positive and spread (about 3e-5 to 25).
BERT's parameters are N(0, 0.02) (LayerNorm scales 1 + N(0, 0.02)). The bundled EfficientNet-Lite0
(models/efficientnet-lite0/model.onnx) is not generated here.

Each model is checked with onnx.checker (full check) and run once in onnxruntime on random inputs
(outputs must be finite); one line per model gives its size and node count.
"""
import argparse
import os
import time

import numpy as np
import onnx
from onnx import TensorProto as TP
from onnx import helper as h
from onnx import numpy_helper as nh

OPSET = 17
SEED = 0
BN_EPS = 1e-5
CALIB_BATCH = 8
SEQ, HIDDEN, HEADS, FFN, LAYERS, VOCAB, POSITIONS, TYPES = 128, 768, 12, 3072, 12, 30522, 512, 2  # bert-base


def scope_of(path):
    """torch.onnx's scope for a module path: "features.1.conv.0.0" -> "/features/features.1/conv/conv.0/conv.0.0"
    (a Sequential's numbered child is shown with its parent's name in front)."""
    parts = []
    for p in path.split("."):
        parts.append(parts[-1] + "." + p if p.isdigit() and parts else p)
    return "/" + "/".join(parts)


class Graph:
    """Nodes and initializers of one graph; node and value names follow torch.onnx.export's scheme."""

    def __init__(self, rng):
        self.rng = rng
        self.nodes, self.inits = [], []
        self.node_names = set()

    def param(self, name, array):
        self.inits.append(nh.from_array(np.asarray(array), name))
        return name

    def normal(self, name, shape, std, mean=0.0):
        return self.param(name, (mean + std * self.rng.standard_normal(shape)).astype(np.float32))

    def op(self, op_type, inputs, scope="", out=None, **attrs):
        """Adds `scope/op_type` (suffixed _1, _2... when taken) and returns its output's name."""
        name, i = f"{scope}/{op_type}", 0
        while name in self.node_names:
            i += 1
            name = f"{scope}/{op_type}_{i}"
        self.node_names.add(name)
        out = out or name + "_output_0"
        self.nodes.append(h.make_node(op_type, inputs, [out], name=name, **attrs))
        return out

    def constant(self, scope, value):
        """A Constant node holding a scalar, as torch exports a Python number."""
        return self.op("Constant", [], scope, value=nh.from_array(np.asarray(value)))

    def model(self, name, inputs, outputs):
        graph = h.make_graph(self.nodes, name, inputs, outputs, self.inits)
        model = h.make_model(graph, opset_imports=[h.make_opsetid("", OPSET)], producer_name="kiln bench/cpu_models.py")
        model.ir_version = 8
        return model


# ---- conv nets (torchvision) --------------------------------------------------------------------

class ConvNet(Graph):
    """Conv / BatchNormalization / activations of a torchvision classifier. With bn_stats None the BNs
    normalize by batch statistics, whose values are listed in self.measured (the calibration graph);
    else bn_stats maps each BN's module path to (running_mean, running_var)."""

    def __init__(self, bn_stats):
        super().__init__(np.random.default_rng(SEED))
        self.bn_stats = bn_stats
        self.measured = {}  # calibration graph: BN path -> (batch mean output, batch variance output)

    def conv(self, x, path, cin, cout, k, stride=1, groups=1):
        # torchvision: kaiming_normal_(mode="fan_out"), fan_out = cout * k * k; no bias before a BN.
        w = self.normal(path + ".weight", (cout, cin // groups, k, k), np.sqrt(2.0 / (cout * k * k)))
        return self.op("Conv", [x, w], scope_of(path), dilations=[1, 1], group=groups, kernel_shape=[k, k],
                       pads=[k // 2] * 4, strides=[stride, stride])

    def bn(self, x, path, c):
        # gamma / beta spread as after training (torchvision starts at 1 / 0, which would hide a wrong scale).
        gamma = self.rng.uniform(0.5, 1.5, c).astype(np.float32)
        beta = (0.1 * self.rng.standard_normal(c)).astype(np.float32)
        scope = scope_of(path)
        if self.bn_stats is not None:
            mean, var = self.bn_stats[path]
            inputs = [x] + [self.param(path + suffix, a) for suffix, a in
                            ((".weight", gamma), (".bias", beta), (".running_mean", mean), (".running_var", var))]
            return self.op("BatchNormalization", inputs, scope, epsilon=BN_EPS, momentum=0.9)
        mean = self.op("ReduceMean", [x], scope, axes=[0, 2, 3], keepdims=1)
        centered = self.op("Sub", [x, mean], scope)
        var = self.op("ReduceMean", [self.op("Mul", [centered, centered], scope)], scope, axes=[0, 2, 3], keepdims=1)
        self.measured[path] = (mean, var)
        std = self.op("Sqrt", [self.op("Add", [var, self.param(path + ".eps", np.float32(BN_EPS))], scope)], scope)
        y = self.op("Mul", [self.op("Div", [centered, std], scope), self.param(path + ".weight", gamma.reshape(c, 1, 1))], scope)
        return self.op("Add", [y, self.param(path + ".bias", beta.reshape(c, 1, 1))], scope)

    def conv_bn(self, x, conv_path, bn_path, cin, cout, k, stride=1, groups=1):
        return self.bn(self.conv(x, conv_path, cin, cout, k, stride, groups), bn_path, cout)

    def relu(self, x, path):
        return self.op("Relu", [x], scope_of(path))

    def relu6(self, x, path):
        scope = scope_of(path)
        return self.op("Clip", [x, self.constant(scope, np.float32(0)), self.constant(scope, np.float32(6))], scope)

    def classifier(self, x, pool_scope, path, cin, classes=1000):
        pooled = self.op("GlobalAveragePool", [x], pool_scope)
        flat = self.op("Flatten", [pooled], "", axis=1)
        bound = 1 / np.sqrt(cin)  # nn.Linear's default init
        w = self.param(path + ".weight", self.rng.uniform(-bound, bound, (classes, cin)).astype(np.float32))
        b = self.param(path + ".bias", self.rng.uniform(-bound, bound, classes).astype(np.float32))
        return self.op("Gemm", [flat, w, b], scope_of(path), out="logits", alpha=1.0, beta=1.0, transB=1)


def resnet50(net):
    x = net.relu(net.conv_bn("input", "conv1", "bn1", 3, 64, 7, stride=2), "relu")
    x = net.op("MaxPool", [x], "/maxpool", ceil_mode=0, dilations=[1, 1], kernel_shape=[3, 3], pads=[1, 1, 1, 1],
               strides=[2, 2])
    cin = 64
    for stage, (planes, blocks) in enumerate([(64, 3), (128, 4), (256, 6), (512, 3)], start=1):
        for b in range(blocks):
            p, stride, cout = f"layer{stage}.{b}", 2 if stage > 1 and b == 0 else 1, planes * 4
            y = net.relu(net.conv_bn(x, p + ".conv1", p + ".bn1", cin, planes, 1), p + ".relu")
            y = net.relu(net.conv_bn(y, p + ".conv2", p + ".bn2", planes, planes, 3, stride), p + ".relu")
            y = net.conv_bn(y, p + ".conv3", p + ".bn3", planes, cout, 1)
            if b == 0:
                x = net.conv_bn(x, p + ".downsample.0", p + ".downsample.1", cin, cout, 1, stride)
            x = net.relu(net.op("Add", [y, x], scope_of(p)), p + ".relu")
            cin = cout
    return net.classifier(x, "/avgpool", "fc", 2048)


def mobilenetv2(net):
    def conv_bn_relu6(x, path, cin, cout, k, stride=1, groups=1):  # Conv2dNormActivation
        return net.relu6(net.conv_bn(x, path + ".0", path + ".1", cin, cout, k, stride, groups), path + ".2")

    x = conv_bn_relu6("input", "features.0", 3, 32, 3, stride=2)
    cin, index = 32, 1
    for t, c, n, s in [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2),
                       (6, 320, 1, 1)]:
        for i in range(n):
            p, stride, hidden = f"features.{index}.conv", s if i == 0 else 1, cin * t
            y, j = x, 0
            if t != 1:
                y, j = conv_bn_relu6(y, f"{p}.0", cin, hidden, 1), 1
            y = conv_bn_relu6(y, f"{p}.{j}", hidden, hidden, 3, stride, groups=hidden)
            y = net.conv_bn(y, f"{p}.{j + 1}", f"{p}.{j + 2}", hidden, c, 1)
            x = net.op("Add", [x, y], scope_of(f"features.{index}")) if stride == 1 and cin == c else y
            cin, index = c, index + 1
    x = conv_bn_relu6(x, "features.18", 320, 1280, 1)
    return net.classifier(x, "", "classifier.1", 1280)  # classifier.0 is the Dropout


def conv_net(body):
    """The body's graph, its BN statistics measured on CALIB_BATCH seeded N(0,1) images."""
    import onnxruntime as ort

    def io(batch):
        return ([h.make_tensor_value_info("input", TP.FLOAT, [batch, 3, 224, 224])],
                [h.make_tensor_value_info("logits", TP.FLOAT, [batch, 1000])])
    calib = ConvNet(bn_stats=None)
    body(calib)
    inputs, outputs = io(CALIB_BATCH)
    stat_names = [name for pair in calib.measured.values() for name in pair]
    outputs += [h.make_tensor_value_info(name, TP.FLOAT, None) for name in stat_names]
    model = calib.model(body.__name__ + "-calibration", inputs, outputs)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    images = np.random.default_rng(SEED + 1).standard_normal((CALIB_BATCH, 3, 224, 224)).astype(np.float32)
    values = dict(zip(stat_names, session.run(stat_names, {"input": images})))
    # Rounded to 4 significant digits, so that onnxruntime's last bits (thread count, CPU) do not change the file.
    rounded = {name: np.array([float(f"{x:.4g}") for x in value.reshape(-1)], np.float32) for name, value in values.items()}
    stats = {path: (rounded[m], rounded[v]) for path, (m, v) in calib.measured.items()}
    net = ConvNet(bn_stats=stats)
    body(net)
    return net.model(body.__name__, *io(1))


# ---- BERT (transformers BertModel) --------------------------------------------------------------

def bert_base_s128():
    S, H, D = SEQ, HIDDEN, HIDDEN // HEADS
    g = Graph(np.random.default_rng(SEED))

    def linear(x, path, cin, cout):
        # torch's linear on a 3-D input: MatMul by the (constant-folded) transposed weight, then Add(bias, .).
        w = g.normal(path + ".weight_T", (cin, cout), 0.02)
        b = g.normal(path + ".bias", (cout,), 0.02)
        return g.op("Add", [b, g.op("MatMul", [x, w], scope_of(path))], scope_of(path))

    def layer_norm(x, path, out=None):
        return g.op("LayerNormalization", [x, g.normal(path + ".weight", (H,), 0.02, mean=1.0), g.normal(path + ".bias", (H,), 0.02)],
                    scope_of(path), out=out, axis=-1, epsilon=1e-12)

    e = "embeddings"
    words = g.op("Gather", [g.normal(e + ".word_embeddings.weight", (VOCAB, H), 0.02), "input_ids"], scope_of(e + ".word_embeddings"))
    types = g.op("Gather", [g.normal(e + ".token_type_embeddings.weight", (TYPES, H), 0.02), "token_type_ids"],
                 scope_of(e + ".token_type_embeddings"))
    # The position_ids buffer (arange over 512), sliced to the sequence and constant-folded.
    positions = g.op("Gather", [g.normal(e + ".position_embeddings.weight", (POSITIONS, H), 0.02),
                                g.param(e + ".position_ids", np.arange(S, dtype=np.int64)[None])], scope_of(e + ".position_embeddings"))
    x = layer_norm(g.op("Add", [g.op("Add", [words, types], "/embeddings"), positions], "/embeddings"), e + ".LayerNorm")

    # get_extended_attention_mask: (1 - mask[:, None, None, :]) * -10000, [1, 1, 1, S]
    mask = g.op("Unsqueeze", ["attention_mask", g.constant("", np.array([1], np.int64))], "")
    mask = g.op("Unsqueeze", [mask, g.constant("", np.array([2], np.int64))], "")
    mask = g.op("Sub", [g.constant("", np.float32(1)), g.op("Cast", [mask], "", to=TP.FLOAT)], "")
    mask = g.op("Mul", [mask, g.constant("", np.float32(-10000))], "")

    heads = g.param("heads_shape", np.array([1, S, HEADS, D], np.int64))  # view shapes, constant-folded
    merged = g.param("merged_shape", np.array([1, S, H], np.int64))
    for i in range(LAYERS):
        p = f"encoder.layer.{i}"
        att, sc = p + ".attention.self", scope_of(p + ".attention.self")

        def split(t, perm):  # transpose_for_scores (key: then transpose(-1, -2), fused into one Transpose)
            return g.op("Transpose", [g.op("Reshape", [t, heads], sc)], sc, perm=perm)
        q = split(linear(x, att + ".query", H, H), [0, 2, 1, 3])
        k = split(linear(x, att + ".key", H, H), [0, 2, 3, 1])
        v = split(linear(x, att + ".value", H, H), [0, 2, 1, 3])
        scores = g.op("Div", [g.op("MatMul", [q, k], sc), g.constant(sc, np.float32(np.sqrt(D)))], sc)
        probs = g.op("Softmax", [g.op("Add", [scores, mask], sc)], sc, axis=-1)
        context = g.op("Transpose", [g.op("MatMul", [probs, v], sc)], sc, perm=[0, 2, 1, 3])
        context = g.op("Reshape", [context, merged], sc)
        out = p + ".attention.output"
        x = layer_norm(g.op("Add", [linear(context, out + ".dense", H, H), x], scope_of(out)), out + ".LayerNorm")

        f = linear(x, p + ".intermediate.dense", H, FFN)
        act = scope_of(p + ".intermediate.intermediate_act_fn")  # GELU, erf form: x * (1 + erf(x / sqrt 2)) * 0.5
        erf = g.op("Erf", [g.op("Div", [f, g.constant(act, np.float32(1.4142135623730951))], act)], act)
        f = g.op("Mul", [g.op("Mul", [f, g.op("Add", [erf, g.constant(act, np.float32(1))], act)], act),
                         g.constant(act, np.float32(0.5))], act)
        out = p + ".output"
        x = layer_norm(g.op("Add", [linear(f, out + ".dense", FFN, H), x], scope_of(out)), out + ".LayerNorm",
                       out="last_hidden_state" if i == LAYERS - 1 else None)
    ids = [h.make_tensor_value_info(n, TP.INT64, [1, S]) for n in ("input_ids", "attention_mask", "token_type_ids")]
    return g.model("bert-base-s128", ids, [h.make_tensor_value_info("last_hidden_state", TP.FLOAT, [1, S, H])])


MODELS = {
    "resnet50": lambda: conv_net(resnet50),
    "mobilenetv2": lambda: conv_net(mobilenetv2),
    "bert-base-s128": bert_base_s128,
}


def random_inputs(path):
    """Seeded random data for each graph input: N(0,1) floats, token ids in [0, VOCAB), all-ones mask, type 0."""
    rng = np.random.default_rng(SEED + 2)
    feeds = {}
    for v in onnx.load(path, load_external_data=False).graph.input:
        dims = [d.dim_value for d in v.type.tensor_type.shape.dim]
        if v.type.tensor_type.elem_type == TP.FLOAT:
            feeds[v.name] = rng.standard_normal(dims).astype(np.float32)
        elif v.name == "input_ids":
            feeds[v.name] = rng.integers(0, VOCAB, dims, dtype=np.int64)
        else:
            feeds[v.name] = np.ones(dims, np.int64) if v.name == "attention_mask" else np.zeros(dims, np.int64)
    return feeds


def validate(path):
    """onnx.checker (full) and one onnxruntime run on random inputs; returns the outputs' max |value|."""
    import onnxruntime as ort
    onnx.checker.check_model(path, full_check=True)
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    outputs = session.run(None, random_inputs(path))
    for o, value in zip(session.get_outputs(), outputs):
        if not np.isfinite(value).all():
            raise RuntimeError(f"{path}: output {o.name} has non-finite values")
    return max(float(np.abs(v).max()) for v in outputs)


def write(name, out_dir):
    """Builds and saves out_dir/name.onnx: one file when it fits protobuf's 2 GiB, else external data beside it."""
    path = os.path.join(out_dir, name + ".onnx")
    model = MODELS[name]()
    if model.ByteSize() < 2**31 - 2**20:
        onnx.save(model, path)
    else:
        onnx.save(model, path, save_as_external_data=True, location=name + ".onnx.data")
    return path


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="folder for the .onnx files")
    ap.add_argument("--only", default=",".join(MODELS), help="comma-separated subset of " + ", ".join(MODELS))
    ap.add_argument("--force", action="store_true", help="rewrite models that already exist")
    args = ap.parse_args()
    names = [n for n in args.only.split(",") if n]
    unknown = [n for n in names if n not in MODELS]
    if unknown:
        ap.error(f"unknown model(s) {', '.join(unknown)}; choose from {', '.join(MODELS)}")
    os.makedirs(args.out, exist_ok=True)
    for name in names:
        path = os.path.join(args.out, name + ".onnx")
        t0 = time.perf_counter()
        status = "kept"
        if args.force or not os.path.exists(path):
            path, status = write(name, args.out), "wrote"
        peak = validate(path)
        nodes = len(onnx.load(path, load_external_data=False).graph.node)
        print(f"{status} {path}: {os.path.getsize(path) / 2**20:.1f} MiB, {nodes} nodes, checker + onnxruntime OK "
              f"(max |output| {peak:.3g}), {time.perf_counter() - t0:.1f} s", flush=True)


if __name__ == "__main__":
    main()
