"""A model whose fp16 build overflows where fp32 does not, for `kiln run --check-finite`:
y = x * 300 * 300 for x in [1, 2] (at least 9e4, past fp16's 65504).

    python3 bench/check_finite_demo.py DIR
    kiln run DIR/finite.onnx --input x=DIR/finite_x.npy --fp16 --check-finite   # names the step, exit 1
    kiln run DIR/finite.onnx --input x=DIR/finite_x.npy --check-finite          # fp32: finite, exit 0
"""
import os
import sys

import numpy as np
import onnx
from onnx import TensorProto as T
from onnx import helper as h

out = sys.argv[1] if len(sys.argv) > 1 else "."
os.makedirs(out, exist_ok=True)
k = h.make_tensor("k", T.FLOAT, [], [300.0])
nodes = [h.make_node("Mul", ["x", "k"], ["a"], name="scale1"), h.make_node("Mul", ["a", "k"], ["y"], name="scale2")]
g = h.make_graph(nodes, "g", [h.make_tensor_value_info("x", T.FLOAT, [4, 8])],
                 [h.make_tensor_value_info("y", T.FLOAT, [4, 8])], [k])
m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])
m.ir_version = 8  # readable by older onnx and onnxruntime releases too
onnx.save(m, os.path.join(out, "finite.onnx"))
np.save(os.path.join(out, "finite_x.npy"), np.random.RandomState(0).uniform(1, 2, (4, 8)).astype(np.float32))
