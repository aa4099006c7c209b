#!/usr/bin/env python3
"""Squeeze-and-excitation blocks alone, as ONNX pairs for timing the fused gate against the plain chain.

Each block is a 1x1 convolution (so that the SE input is NHWC in half builds, as in the models), then
GlobalAveragePool -> Conv 1x1 -> SiLU (Sigmoid and Mul) -> Conv 1x1 -> Sigmoid -> Mul. `se_<tag>_fused.onnx`
returns the output alone; `se_<tag>_plain.onnx` also returns the pooled value, which keeps the CUDA lowering
from fusing the gate (an intermediate the graph returns). Time both with
    kiln bench OUT/se_<tag>_<form>.onnx --device cuda --fp16 --warmup 50 --iterations 300
Usage: python3 bench/se_blocks.py OUT
"""
import os
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

# tag: (batch, channels, map side, squeezed channels): EfficientNet-B0's stage-2 and last blocks and its
# first, MobileNetV3-Large's last, and a batch of 4 MobileNetV3 stage-5 blocks.
BLOCKS = {"a": (1, 144, 56, 6), "b": (1, 1152, 7, 48), "c": (1, 960, 7, 240), "d": (1, 32, 112, 8),
          "e": (4, 672, 14, 168)}


def block(n, c, side, cr, plain, rng):
    def w(name, *dims):
        return numpy_helper.from_array((rng.standard_normal(dims) * 0.1).astype(np.float32), name)
    nodes = [helper.make_node("Conv", ["x", "w0"], ["c0"]),
             helper.make_node("GlobalAveragePool", ["c0"], ["p"]),
             helper.make_node("Conv", ["p", "w1", "b1"], ["f"]),
             helper.make_node("Sigmoid", ["f"], ["s"]), helper.make_node("Mul", ["f", "s"], ["a"]),
             helper.make_node("Conv", ["a", "w2", "b2"], ["e"]),
             helper.make_node("Sigmoid", ["e"], ["g"]), helper.make_node("Mul", ["c0", "g"], ["y"])]
    outs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, [n, c, side, side])]
    if plain:
        outs.append(helper.make_tensor_value_info("p", TensorProto.FLOAT, [n, c, 1, 1]))
    g = helper.make_graph(nodes, "se", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [n, 16, side, side])],
                          outs, [w("w0", c, 16, 1, 1), w("w1", cr, c, 1, 1), w("b1", cr), w("w2", c, cr, 1, 1),
                                 w("b2", c)])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "se_blocks"
    os.makedirs(out, exist_ok=True)
    rng = np.random.default_rng(0)
    for tag, (n, c, side, cr) in BLOCKS.items():
        for form in ("fused", "plain"):
            onnx.save(block(n, c, side, cr, form == "plain", rng), os.path.join(out, f"se_{tag}_{form}.onnx"))


if __name__ == "__main__":
    main()
