"""Writes a model with one CPU node (CumSum: no GPU lowering yet) between two runs of 20 small
GEMM + Tanh steps, for timing graphs around host steps (bench/engine-check.sh).

    python3 bench/hoststep_model.py OUT.onnx
"""
import sys, numpy as np, onnx
from onnx import helper as h, TensorProto as T
rng = np.random.default_rng(0)
inits, nodes, cur = [], [], "x"
for i in range(40):
    inits.append(h.make_tensor(f"w{i}", T.FLOAT, [256, 256], (rng.standard_normal(256 * 256) * 0.06).astype(np.float32).tolist()))
    nodes.append(h.make_node("MatMul", [cur, f"w{i}"], [f"m{i}"]))
    nodes.append(h.make_node("Tanh", [f"m{i}"], [f"t{i}"]))
    cur = f"t{i}"
    if i == 19:
        inits.append(h.make_tensor("ax", T.INT64, [], [1]))
        nodes.append(h.make_node("CumSum", [cur, "ax"], ["cs"], name="cumsum"))
        cur = "cs"
nodes.append(h.make_node("Identity", [cur], ["y"]))
g = h.make_graph(nodes, "hoststep40", [h.make_tensor_value_info("x", T.FLOAT, [8, 256])],
                 [h.make_tensor_value_info("y", T.FLOAT, [8, 256])], inits)
onnx.save(h.make_model(g, opset_imports=[h.make_opsetid("", 17)]), sys.argv[1])
