#!/usr/bin/env python3
"""Writes the bad-input cases of the kiln error suite into OUTDIR (see run.sh).

Each case gets a folder OUTDIR/<name>/ with its files, and one line in OUTDIR/cases.tsv:

    name <TAB> ok|err <TAB> expect <TAB> check <TAB> arg <TAB> arg ...

expect: substrings the output must contain; ';' separates required ones, '|' alternatives.
        (err cases: stderr; ok cases: stdout + stderr.) '-' for none.
check:  '-' or 'absent:P,P' (must not exist afterwards) or 'present:P,P' (must exist).
args:   the kiln command line; {D} is the case folder, {T} is OUTDIR.

The files are intentionally malformed: onnx.checker is never run on them.
"""
import os
import struct
import sys

import numpy as np
import onnx
from onnx import TensorProto as TP
from onnx import helper as h
from onnx import numpy_helper

F, I64, BOOL = TP.FLOAT, TP.INT64, TP.BOOL
OUT = ""
CASES = []


def add(name, args, expect, kind="err", check="-"):
    for field in [name, kind, expect, check, *args]:
        assert field and "\t" not in field and "\n" not in field, (name, field)
    CASES.append([name, kind, expect, check, *args])


def cdir(name):
    d = os.path.join(OUT, name)
    os.makedirs(d, exist_ok=True)
    return d


def write(name, fname, data):
    path = os.path.join(cdir(name), fname)
    with open(path, "wb") as f:
        f.write(data if isinstance(data, bytes) else data.SerializeToString())
    return path


def npy(name, fname, arr):
    np.save(os.path.join(cdir(name), fname), arr)


def vi(name, shape, dt=F):
    return h.make_tensor_value_info(name, dt, shape)


def model(nodes, inputs, outputs, inits=(), opsets=(("", 17),), ir=8, vinfo=()):
    g = h.make_graph(nodes, "g", inputs, outputs, initializer=list(inits), value_info=list(vinfo))
    m = h.make_model(g, opset_imports=[h.make_opsetid(d, v) for d, v in opsets], producer_name="kiln-errors")
    m.ir_version = ir
    return m


def init(name, arr):
    return numpy_helper.from_array(np.asarray(arr), name)


def i64(name, values):
    return init(name, np.array(values, dtype=np.int64))


def add_model():  # z = x + y, both float[2,3]
    return model([h.make_node("Add", ["x", "y"], ["z"], name="add_xy")],
                 [vi("x", [2, 3]), vi("y", [2, 3])], [vi("z", [2, 3])])


def inspect_case(name, m, expect, fname="model.onnx"):
    write(name, fname, m)
    add(name, ["inspect", "{D}/" + fname], expect)


# ---- files that are not ONNX models -------------------------------------------------------------

def file_cases():
    add("missing_file", ["inspect", "{D}/nope.onnx"], "nope.onnx;cannot open")
    cdir("missing_file")
    add("directory_as_model", ["inspect", "{D}"], "directory_as_model;directory")
    cdir("directory_as_model")
    inspect_case("empty_file", b"", "empty.onnx;not an ONNX model", "empty.onnx")
    big = model([h.make_node("Add", ["x", "w"], ["z"], name="add_w")], [vi("x", [256])], [vi("z", [256])],
                inits=[init("w", np.arange(256, dtype=np.float32))]).SerializeToString()
    inspect_case("truncated_model", big[: len(big) // 2], "truncated.onnx;not a valid ONNX protobuf", "truncated.onnx")
    rnd = np.random.default_rng(7).integers(0, 256, 4096, dtype=np.uint8).tobytes()
    inspect_case("random_bytes", rnd, "random.onnx;not a valid ONNX protobuf|random.onnx;not an ONNX model", "random.onnx")
    inspect_case("text_file", b"this is not a model\n" * 10, "notes.onnx;not a valid ONNX protobuf|notes.onnx;not an ONNX model",
                 "notes.onnx")
    t = numpy_helper.from_array(np.ones((2, 3), np.float32), "t")
    inspect_case("tensorproto_as_model", t, "tensor.pb;not an ONNX model|tensor.pb;has no graph|tensor.pb;not a valid ONNX protobuf", "tensor.pb")
    inspect_case("graphproto_as_model", add_model().graph, "graph.pb;not an ONNX model|graph.pb;has no graph", "graph.pb")


# ---- model structure --------------------------------------------------------------------------

def structure_cases():
    x, y = vi("x", [2, 3]), vi("y", [2, 3])
    inspect_case("unknown_op", model([h.make_node("FooBar", ["x"], ["y"], name="mystery")], [x], [y]),
                 "node 'mystery';FooBar;unknown op")
    inspect_case("unknown_domain", model([h.make_node("Custom", ["x"], ["y"], name="custom1", domain="com.example")],
                                         [x], [y], opsets=(("", 17), ("com.example", 1))),
                 "node 'custom1';com.example")
    inspect_case("domain_not_imported", model([h.make_node("Custom", ["x"], ["y"], name="custom2", domain="com.other")],
                                              [x], [y]),
                 "node 'custom2';com.other;opset_import")
    m = add_model()
    m.opset_import[0].version = 99
    inspect_case("opset_99", m, "opset 99;ai.onnx")
    m = add_model()
    m.opset_import.add(domain="ai.onnx.ml", version=42)
    inspect_case("ml_opset_42", m, "opset 42;ai.onnx.ml")
    m = add_model()
    m.ir_version = 99
    inspect_case("ir_version_99", m, "IR version 99")
    inspect_case("undefined_input", model([h.make_node("Add", ["x", "ghost"], ["y"], name="add_ghost")], [x], [y]),
                 "node 'add_ghost';'ghost';not defined")
    inspect_case("undefined_graph_output", model([h.make_node("Relu", ["x"], ["y"], name="relu")], [x], [vi("nowhere", [2, 3])]),
                 "'nowhere';not produced")
    inspect_case("duplicate_node_output", model([h.make_node("Relu", ["x"], ["y"], name="first"),
                                                 h.make_node("Neg", ["x"], ["y"], name="second")], [x], [y]),
                 "'y';defined twice;node 'second'")
    w = init("w", np.ones((2, 3), np.float32))
    inspect_case("duplicate_initializer", model([h.make_node("Add", ["x", "w"], ["y"], name="add_w")], [x], [y],
                                                inits=[w, w]),
                 "'w';defined twice;initializer")
    inspect_case("duplicate_graph_input", model([h.make_node("Relu", ["x"], ["y"], name="relu")], [x, x], [y]),
                 "'x';defined twice")
    inspect_case("cycle", model([h.make_node("Add", ["x", "b"], ["a"], name="loop_a"),
                                 h.make_node("Relu", ["a"], ["b"], name="loop_b"),
                                 h.make_node("Neg", ["b"], ["y"], name="tail")], [x], [y]),
                 "cycle;node 'loop_a'|cycle;node 'loop_b'")
    inspect_case("self_cycle", model([h.make_node("Add", ["x", "y"], ["y"], name="selfish")], [x], [y]),
                 "node 'selfish';cycle")
    twice = model([h.make_node("Softmax", ["x"], ["y"], name="sm", axis=1)], [x], [y])
    twice.graph.node[0].attribute.append(h.make_attribute("axis", 0))  # make_node cannot repeat one
    inspect_case("attribute_twice", twice, "node 'sm';'axis';twice")


# ---- shapes and sizes -------------------------------------------------------------------------

def shape_cases():
    inspect_case("add_shape_mismatch", model([h.make_node("Add", ["x", "y"], ["z"], name="add_bad")],
                                             [vi("x", [2, 3]), vi("y", [4, 5])], [vi("z", None)]),
                 "node 'add_bad';[2,3]|node 'add_bad';2x3|node 'add_bad';(2, 3)")
    inspect_case("matmul_inner_mismatch", model([h.make_node("MatMul", ["a", "b"], ["c"], name="mm_bad")],
                                                [vi("a", [2, 3]), vi("b", [4, 5])], [vi("c", None)]),
                 "node 'mm_bad'")
    inspect_case("declared_output_contradicts", model([h.make_node("Relu", ["x"], ["y"], name="relu")],
                                                      [vi("x", [2, 3])], [vi("y", [3, 2])]),
                 "'y';contradicts")
    inspect_case("declared_value_info_dtype", model([h.make_node("Relu", ["x"], ["r"], name="relu"),
                                                     h.make_node("Neg", ["r"], ["y"], name="neg")],
                                                    [vi("x", [2, 3])], [vi("y", [2, 3])], vinfo=[vi("r", [2, 3], I64)]),
                 "'r';contradicts")
    inspect_case("negative_dim_input", model([h.make_node("Relu", ["x"], ["y"], name="relu")],
                                             [vi("x", [2, -3])], [vi("y", None)]),
                 "input 'x';negative")
    neg = TP(name="wneg", data_type=F, dims=[-2, 3])
    inspect_case("negative_dim_initializer", model([h.make_node("Relu", ["wneg"], ["y"], name="relu")], [], [vi("y", None)],
                                                   inits=[neg]),
                 "initializer 'wneg';negative")
    huge = TP(name="whuge", data_type=F, dims=[10**12, 10**12])
    inspect_case("huge_initializer_overflow", model([h.make_node("Relu", ["whuge"], ["y"], name="relu")], [], [vi("y", None)],
                                                    inits=[huge]),
                 "initializer 'whuge'")
    big = TP(name="wbig", data_type=F, dims=[10**6, 10**6], raw_data=b"\0" * 64)
    inspect_case("huge_initializer_short_data", model([h.make_node("Relu", ["wbig"], ["y"], name="relu")], [], [vi("y", None)],
                                                      inits=[big]),
                 "initializer 'wbig';raw data")
    short = TP(name="wshort", data_type=F, dims=[4, 4], raw_data=b"\0" * 10)
    inspect_case("raw_data_short", model([h.make_node("Relu", ["wshort"], ["y"], name="relu")], [], [vi("y", None)],
                                         inits=[short]),
                 "initializer 'wshort';10 bytes")
    few = TP(name="wfew", data_type=F, dims=[4], float_data=[1.0, 2.0])
    inspect_case("float_data_short", model([h.make_node("Relu", ["wfew"], ["y"], name="relu")], [], [vi("y", None)],
                                           inits=[few]),
                 "initializer 'wfew';2 values")
    for name, dims in [("constantofshape_overflow", [10**12, 10**12]), ("constantofshape_40gb", [100000, 100000])]:
        m = model([h.make_node("ConstantOfShape", ["shape"], ["y"], name="fill_huge")], [], [vi("y", None)],
                  inits=[i64("shape", dims)])
        write(name, "model.onnx", m)
        add(name, ["run", "{D}/model.onnx", "--output-dir", "{D}/out"], "node 'fill_huge'", check="absent:{D}/out")
    inspect_case("reshape_huge", model([h.make_node("Reshape", ["x", "shape"], ["y"], name="reshape_huge")],
                                       [vi("x", [2, 3])], [vi("y", None)], inits=[i64("shape", [10**12, 10**12])]),
                 "node 'reshape_huge'")
    # The same sizes arriving only at run time, as input data.
    big = np.array([10**12, 10**12], np.int64)
    run_case("constantofshape_huge_runtime", h.make_node("ConstantOfShape", ["shape"], ["y"], name="fill_rt"),
             {"shape": big}, "node 'fill_rt'")
    run_case("expand_huge_runtime", h.make_node("Expand", ["x", "shape"], ["y"], name="expand_rt"),
             {"x": np.ones([1], np.float32), "shape": np.array([10**9, 10**9], np.int64)}, "node 'expand_rt'")
    run_case("reshape_huge_runtime", h.make_node("Reshape", ["x", "shape"], ["y"], name="reshape_rt"),
             {"x": np.ones([2, 3], np.float32), "shape": big}, "node 'reshape_rt'")
    # Symbolic shapes that only clash once real data arrives.
    run_case("broadcast_mismatch_runtime", h.make_node("Add", ["x", "y"], ["z"], name="add_rt"),
             {"x": np.ones([2, 3], np.float32), "y": np.ones([4, 5], np.float32)}, "node 'add_rt'",
             shapes={"x": ["N", "M"], "y": ["P", "Q"]})


def run_case(name, node, feeds, expect, shapes=None, kind="err"):
    """`kiln run` of a one-node model on .npy inputs; inputs are declared with their data's shape."""
    ins = [h.make_tensor_value_info(k, onnx.helper.np_dtype_to_tensor_dtype(v.dtype), (shapes or {}).get(k, v.shape))
           for k, v in feeds.items()]
    write(name, "model.onnx", model([node], ins, [vi(o, None) for o in node.output]))
    args = ["run", "{D}/model.onnx", "--output-dir", "{D}/out"]
    for k, v in feeds.items():
        npy(name, k + ".npy", v)
        args += ["--input", f"{k}={{D}}/{k}.npy"]
    add(name, args, expect, kind=kind,
        check=f"present:{{D}}/out/{node.output[0]}.npy" if kind == "ok" else "absent:{D}/out")


# ---- external data ----------------------------------------------------------------------------

def external_cases():
    with open(os.path.join(OUT, "secret.bin"), "wb") as f:  # outside every case folder
        f.write(b"\0" * 64)
    os.symlink("../secret.bin", os.path.join(cdir("ext_symlink_outside"), "link.bin"))
    os.makedirs(os.path.join(cdir("ext_directory"), "sub"))
    for name, location, extra, expect in [
            ("ext_dotdot", "../secret.bin", {}, "../secret.bin;leaves the model's folder"),
            ("ext_absolute", "/etc/passwd", {}, "/etc/passwd;absolute"),
            ("ext_symlink_outside", "link.bin", {}, "link.bin;outside the model's folder"),
            ("ext_past_end", "w.bin", {"offset": 8}, "w.bin;past the end"),
            ("ext_offset_huge", "w.bin", {"offset": 10**18}, "w.bin;past the end"),
            ("ext_bad_offset", "w.bin", {"offset": -8}, "offset;-8"),
            ("ext_length_mismatch", "w.bin", {"length": 3}, "length 3"),
            ("ext_missing_file", "nothere.bin", {}, "nothere.bin"),
            ("ext_directory", "sub", {}, "sub;not a regular file")]:
        if location == "w.bin":
            write(name, "w.bin", b"\0" * 16)  # 4 floats: what the tensor needs at offset 0
        t = TP(name="wext", data_type=F, dims=[4], data_location=TP.EXTERNAL)
        for k, v in [("location", location), *extra.items()]:
            t.external_data.add(key=k, value=str(v))
        m = model([h.make_node("Relu", ["wext"], ["y"], name="relu")], [], [vi("y", None)], inits=[t])
        inspect_case(name, m, "initializer 'wext';" + expect)


# ---- deeply nested subgraphs ------------------------------------------------------------------

def field(num, payload):  # a length-delimited protobuf field
    def varint(n):
        out = b""
        while True:
            out += bytes([(n & 0x7F) | (0x80 if n > 0x7F else 0)])
            n >>= 7
            if not n:
                return out
    return varint(num << 3 | 2) + varint(len(payload)) + payload


def nested_if_model(depth):
    """If inside If ... `depth` deep, innermost Identity(x). Spliced as bytes: python protobuf
    refuses to copy messages nested this deep (upb's depth limit)."""
    node = h.make_node("Identity", ["x"], ["o0"], name="leaf").SerializeToString()
    for i in range(1, depth + 1):
        sub = h.make_graph([], f"g{i - 1}", [], [vi(f"o{i - 1}", [1])]).SerializeToString() + field(1, node)
        other = h.make_graph([h.make_node("Identity", ["x"], [f"e{i}"], name=f"else{i}")], f"e{i}", [], [vi(f"e{i}", [1])])
        n = h.make_node("If", ["c"], [f"o{i}"], name=f"if{i}", else_branch=other).SerializeToString()
        then = h.make_attribute("then_branch", h.make_graph([], "x", [], []))
        then.ClearField("g")
        node = n + field(5, then.SerializeToString() + field(6, sub))
    m = model([], [vi("c", [], BOOL), vi("x", [1])], [vi(f"o{depth}", [1])])
    return m.SerializeToString() + field(7, field(1, node))  # merged into the graph: one more node


def nested_cases():
    inspect_case("nested_if_40", nested_if_model(40), "nested")
    inspect_case("nested_if_150", nested_if_model(150), "nested")
    write("nested_if_3_ok", "model.onnx", nested_if_model(3))
    npy("nested_if_3_ok", "c.npy", np.array(True))
    npy("nested_if_3_ok", "x.npy", np.array([4.5], np.float32))
    add("nested_if_3_ok", ["run", "{D}/model.onnx", "--input", "c={D}/c.npy", "--input", "x={D}/x.npy", "--output-dir",
                           "{D}/out"], "o3", kind="ok", check="present:{D}/out/o3.npy")


# ---- run-time inputs --------------------------------------------------------------------------

def runtime_cases():
    n = "rt"  # shared files for the Add model
    write(n, "model.onnx", add_model())
    npy(n, "x.npy", np.ones([2, 3], np.float32))
    npy(n, "y.npy", np.full([2, 3], 2, np.float32))
    npy(n, "x_i32.npy", np.ones([2, 3], np.int32))
    npy(n, "x_3x2.npy", np.ones([3, 2], np.float32))
    npy(n, "x_rank3.npy", np.ones([1, 2, 3], np.float32))
    rt = ["run", "{T}/rt/model.onnx"]
    y = ["--input", "y={T}/rt/y.npy"]
    add("ok_run_add", rt + ["--input", "x={T}/rt/x.npy"] + y + ["--output-dir", "{D}/out"], "output 'z'", kind="ok",
        check="present:{D}/out/z.npy")
    add("ok_inspect_add", ["inspect", "{T}/rt/model.onnx"], "Add", kind="ok")
    add("ok_random_inputs", rt + ["--random-inputs", "--seed", "3"], "output 'z'", kind="ok")
    # --check-finite: a finite result passes; Sqrt of a negative input is NaN, which the fp32 CPU
    # reference itself makes (on the GPU an fp16 overflow is the error: bench/RESULTS.md).
    add("ok_check_finite", rt + ["--input", "x={T}/rt/x.npy"] + y + ["--check-finite"], "every output value is finite",
        kind="ok")
    m = model([h.make_node("Sqrt", ["x"], ["r"], name="root")], [vi("x", [2, 3])], [vi("r", [2, 3])])
    write("check_finite_nan", "model.onnx", m)
    npy("check_finite_nan", "x.npy", np.array([[1, -1, 4], [-9, 0, 2]], np.float32))
    add("check_finite_nan", ["run", "{D}/model.onnx", "--input", "x={D}/x.npy", "--check-finite", "--device", "cpu"],
        "NaN/Inf in 'r' (2 of 6);the model makes them", kind="ok")
    # `bench --profile` on the fast CPU backend: each step's FLOPs (a 64x64x64 MatMul: 0.000524 GFLOP),
    # no datasheet peaks for a CPU (the bound and roofline columns need the flags; --plot is refused).
    m = model([h.make_node("MatMul", ["x", "w"], ["y"], name="mm")], [vi("x", [64, 64])], [vi("y", [64, 64])],
              inits=[init("w", np.full([64, 64], 0.5, np.float32))])
    write("ok_profile_cpu", "model.onnx", m)
    prof = ["bench", "{D}/model.onnx", "--device", "cpu", "--iterations", "2", "--warmup", "1", "--profile"]
    add("ok_profile_cpu", prof, "no peaks for this device;whole forward: 0.001 GFLOP", kind="ok")
    write("profile_plot_no_peaks", "model.onnx", m)
    add("profile_plot_no_peaks", prof + ["--plot", "{D}/r.svg"], "--plot draws against the device's peaks")
    for c in ["ok_run_add", "ok_inspect_add", "ok_random_inputs"]:
        cdir(c)
    bad = [
        ("wrong_input_name", ["--input", "nope={T}/rt/x.npy"] + y, "'nope';'x'"),
        ("wrong_input_dtype", ["--input", "x={T}/rt/x_i32.npy"] + y, "input 'x';x_i32.npy;i32[2,3]"),
        ("wrong_input_shape", ["--input", "x={T}/rt/x_3x2.npy"] + y, "input 'x';x_3x2.npy;[3,2]"),
        ("wrong_input_rank", ["--input", "x={T}/rt/x_rank3.npy"] + y, "input 'x';x_rank3.npy;[1,2,3]"),
        ("missing_input_value", y, "input 'x';no value"),
        ("input_twice", ["--input", "x={T}/rt/x.npy", "--input", "x={T}/rt/x.npy"] + y, "'x';twice"),
        ("input_flag_malformed", ["--input", "x"] + y, "--input 'x';NAME=FILE"),
        ("input_npy_missing", ["--input", "x={D}/absent.npy"] + y, "absent.npy;cannot open"),
        ("input_npy_directory", ["--input", "x={D}"] + y, "input_npy_directory"),
        ("shapes_wrong_name", ["--shapes", "nope:2x3", "--random-inputs"], "--shapes;'nope'"),
        ("shapes_contradict", ["--shapes", "x:4x4", "--random-inputs"], "input 'x';[4,4]|input 'x';4x4"),
        ("shapes_malformed", ["--shapes", "x:2xbanana", "--random-inputs"], "banana"),
        ("warm_shapes_without_ranges", ["--warm-shapes", "x:2x3", "--random-inputs"], "warm shapes need shape ranges"),
        ("warm_shapes_malformed", ["--warm-shapes", "x:2xbanana", "--random-inputs"], "--warm-shapes 'x:2xbanana';NAME:DIMS"),
        ("disable_pass_unknown", ["--disable-pass", "fuse-everything", "--random-inputs"],
         "--disable-pass;unknown pass 'fuse-everything';fold-constants"),
        ("dump_ir_after_unknown", ["--dump-ir-after", "nope", "--random-inputs"], "unknown pass 'nope';or all"),
    ]
    for name, args, expect in bad:
        cdir(name)
        add(name, rt + args + ["--output-dir", "{D}/out"], expect, check="absent:{D}/out")
    # --batch on a model whose batch is fixed, and a batch that is not a positive number: no artifact.
    for name, args, expect in [
        ("build_batch_fixed", ["build", "{T}/rt/model.onnx", "--batch", "4"], "batch 4;input 'x';fixed batch of 2"),
        ("bench_batch_fixed", ["bench", "{T}/rt/model.onnx", "--batch", "4"], "batch 4;input 'x';fixed batch of 2"),
        ("build_batch_zero", ["build", "{T}/rt/model.onnx", "--batch", "0"], "--batch"),
        ("bench_batch_negative", ["bench", "{T}/rt/model.onnx", "--batch", "-2"], "--batch"),
    ]:
        cdir(name)
        add(name, args + ["-o", "{D}/m.kiln"] if args[0] == "build" else args, expect, check="absent:{D}/m.kiln")
    # Corrupt .npy files.
    hdr = b"{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }".ljust(117) + b"\n"
    good = b"\x93NUMPY\x01\x00" + struct.pack("<H", len(hdr)) + hdr
    huge_hdr = b"{'descr': '<f4', 'fortran_order': False, 'shape': (1000000000000, 1000000000000), }".ljust(117) + b"\n"
    big_hdr = b"{'descr': '<f4', 'fortran_order': False, 'shape': (100000, 100000), }".ljust(117) + b"\n"
    corrupt = [
        ("npy_bad_magic", b"\x93NUMPX\x01\x00" + good[8:] + b"\0" * 24, "bad.npy;magic"),
        ("npy_truncated_data", good + b"\0" * 8, "bad.npy;8 bytes"),
        ("npy_truncated_header", good[:40], "bad.npy;header"),
        ("npy_huge_shape", b"\x93NUMPY\x01\x00" + struct.pack("<H", len(huge_hdr)) + huge_hdr, "bad.npy"),
        ("npy_big_shape_no_data", b"\x93NUMPY\x01\x00" + struct.pack("<H", len(big_hdr)) + big_hdr, "bad.npy;0 bytes"),
        ("npy_empty", b"", "bad.npy"),
        ("npy_bad_dtype", good.replace(b"<f4", b"|O8"), "bad.npy;O8"),
    ]
    for name, data, expect in corrupt:
        write(name, "bad.npy", data)
        add(name, rt + ["--input", "x={D}/bad.npy"] + y + ["--output-dir", "{D}/out"], expect, check="absent:{D}/out")
    # Index values out of range, only visible at run time.
    for name, idx, kind, expect in [("ok_gather_in_range", 2, "ok", "output 'out'"),
                                    ("ok_gather_negative", -3, "ok", "output 'out'"),
                                    ("gather_index_100", 100, "err", "node 'pick';100"),
                                    ("gather_index_minus_4", -4, "err", "node 'pick';-4")]:
        run_case(name, h.make_node("Gather", ["data", "idx"], ["out"], name="pick", axis=0),
                 {"data": np.array([1, 2, 3], np.float32), "idx": np.array([idx], np.int64)}, expect, kind=kind)
    # RoiAlign boxes that are not finite, or that would take an absurd sample grid (a hang, once).
    for name, box, kind, expect in [("ok_roialign_box", [0, 0, 4, 4], "ok", "output 'out'"),
                                    ("roialign_nan_box", [float("nan"), 0, 4, 4], "err", "node 'align';roi 0;not finite"),
                                    ("roialign_inf_box", [0, 0, float("inf"), 4], "err", "node 'align';roi 0"),
                                    ("roialign_huge_box", [0, 0, 1e9, 4], "err", "node 'align';samples per bin side")]:
        run_case(name, h.make_node("RoiAlign", ["x", "rois", "bi"], ["out"], name="align", output_height=2, output_width=2),
                 {"x": np.ones((1, 1, 5, 5), np.float32), "rois": np.array([box], np.float32),
                  "bi": np.array([0], np.int64)}, expect, kind=kind)


# ---- where results go -------------------------------------------------------------------------

def output_cases():
    m = model([h.make_node("Relu", ["x"], ["a"], name="relu"), h.make_node("Neg", ["x"], ["b"], name="neg")],
              [vi("x", [2, 3])], [vi("a", [2, 3]), vi("b", [2, 3])])
    write("output_partial", "model.onnx", m)
    os.makedirs(os.path.join(cdir("output_partial"), "out", "b.npy"))  # the second output cannot be written
    add("output_partial", ["run", "{D}/model.onnx", "--random-inputs", "--output-dir", "{D}/out"], "b.npy",
        check="absent:{D}/out/a.npy,{D}/out/b.npy.tmp")
    write("output_dir_is_file", "model.onnx", m)
    write("output_dir_is_file", "out", b"a file, not a folder\n")
    add("output_dir_is_file", ["run", "{D}/model.onnx", "--random-inputs", "--output-dir", "{D}/out"], "out;output folder")
    write("dot_unwritable", "model.onnx", m)
    add("dot_unwritable", ["inspect", "{D}/model.onnx", "--dot", "{D}/no/such/dir/g.dot"], "g.dot",
        check="absent:{D}/no")
    # compare: a missing reference, a missing input file.
    write("compare_missing_reference", "model.onnx", add_model())
    for d in ["inputs", "ref"]:
        os.makedirs(os.path.join(cdir("compare_missing_reference"), d))
    npy("compare_missing_reference", "inputs/x.npy", np.ones([2, 3], np.float32))
    npy("compare_missing_reference", "inputs/y.npy", np.ones([2, 3], np.float32))
    add("compare_missing_reference", ["compare", "{D}/model.onnx", "--inputs", "{D}/inputs", "--reference", "{D}/ref"],
        "output 'z';z.npy")
    write("compare_missing_input", "model.onnx", add_model())
    os.makedirs(os.path.join(cdir("compare_missing_input"), "inputs"))
    npy("compare_missing_input", "inputs/x.npy", np.ones([2, 3], np.float32))
    add("compare_missing_input", ["compare", "{D}/model.onnx", "--inputs", "{D}/inputs", "--reference", "{D}/inputs"],
        "y.npy")


def quant_cases():
    """kiln quantize's bad inputs (issue 25): calibration folders and QDQ models. Nothing is written."""
    n = "qm"  # y = MatMul(Relu(MatMul(x, w0)), w1), x float[1, 4]
    rng = np.random.default_rng(0)
    mlp = [h.make_node("MatMul", ["x", "w0"], ["h"], name="mm0"), h.make_node("Relu", ["h"], ["a"]),
           h.make_node("MatMul", ["a", "w1"], ["y"], name="mm1")]
    ws = [init("w0", rng.standard_normal((4, 8)).astype(np.float32)), init("w1", rng.standard_normal((8, 3)).astype(np.float32))]
    write(n, "model.onnx", model(mlp, [vi("x", [1, 4])], [vi("y", [1, 3])], ws))
    write(n, "old.onnx", model(mlp, [vi("x", [1, 4])], [vi("y", [1, 3])], ws, opsets=(("", 11),), ir=6))
    for d, arr in (("good", rng.standard_normal((1, 4))), ("good", rng.standard_normal((1, 4))),
                   ("shape", np.ones((1, 5))), ("nan", np.array([[1.0, np.nan, 0, 0]])),
                   ("const", np.zeros((1, 4))), ("const", np.zeros((1, 4)))):
        folder = cdir(f"{n}/{d}")
        np.save(os.path.join(folder, f"{len(os.listdir(folder))}.npy"), arr.astype(np.float32))
    np.save(os.path.join(cdir(f"{n}/dtype"), "0.npy"), np.ones((1, 4), np.int32))
    cdir(f"{n}/empty")
    q = ["quantize", "{T}/qm/model.onnx", "-o", "{D}/q.onnx", "--calib"]
    gone = "absent:{D}/q.onnx"
    for case in ("ok_quantize", "quant_calib_empty", "quant_calib_missing", "quant_calib_shape", "quant_calib_dtype",
                 "quant_calib_nan", "quant_calib_constant", "quant_old_opset", "quant_entropy_fp8", "quant_bad_precision",
                 "quant_bad_percentile"):
        cdir(case)  # the output folder exists: only the bad input can fail
    add("ok_quantize", q + ["{T}/qm/good", "--quantize-sensitive"], "2 layer(s) int8", kind="ok", check="present:{D}/q.onnx")
    add("quant_calib_empty", q + ["{T}/qm/empty"], "qm/empty: no samples;x.npy", check=gone)
    add("quant_calib_missing", q + ["{T}/qm/nosuch"], "qm/nosuch: not a folder", check=gone)
    add("quant_calib_shape", q + ["{T}/qm/shape"], "0.npy;expects shape f32[1,4]|0.npy;expects shape [1,4]", check=gone)
    add("quant_calib_dtype", q + ["{T}/qm/dtype"], "0.npy;expects f32;i32", check=gone)
    add("quant_calib_nan", q + ["{T}/qm/nan"], "0.npy;not finite", check=gone)
    add("quant_calib_constant", q + ["{T}/qm/const"], "input 'x';constant", check=gone)
    add("quant_old_opset", ["quantize", "{T}/qm/old.onnx", "-o", "{D}/q.onnx", "--calib", "{T}/qm/good"],
        "opset 11;opset 13", check=gone)
    add("quant_entropy_fp8", q + ["{T}/qm/good", "--precision", "fp8", "--method", "entropy"], "entropy method applies to int8",
        check=gone)
    add("quant_bad_precision", q + ["{T}/qm/good", "--precision", "int4"], "int8 or fp8", check=gone)
    add("quant_bad_percentile", q + ["{T}/qm/good", "--method", "percentile", "--percentile", "120"], "percentile 120",
        check=gone)
    # kiln optimize's int8/fp8 candidates (issue 26): misuse and bad calibration folders stop it
    # before any version folder is made.
    o = ["optimize", "{T}/qm/model.onnx", "--repo", "{D}/repo", "--name", "m", "--validation", "{T}/qm/good",
         "--device", "cpu", "--iterations", "2"]
    none = "absent:{D}/repo/m/1"
    for case in ("opt_int8_no_calib", "opt_calib_empty", "opt_calib_shape", "opt_max_calib_alone"):
        cdir(case)
    add("opt_int8_no_calib", o + ["--candidates", "int8"], "candidate int8 needs --calib", check=none)
    add("opt_calib_empty", o + ["--calib", "{T}/qm/empty"], "qm/empty: no samples", check=none)
    add("opt_calib_shape", o + ["--calib", "{T}/qm/shape"], "0.npy;expects shape", check=none)
    add("opt_max_calib_alone", o + ["--max-calib", "3"], "--max-calib go with --calib", check=none)
    # QDQ models with scales no quantizer writes: each names the node.
    for case, scale in (("zero", 0.0), ("negative", -0.5), ("nan", np.nan)):
        dq = h.make_node("DequantizeLinear", ["wq", "s", "z"], ["w"], name="dq_w")
        m = model([dq, h.make_node("MatMul", ["x", "w"], ["y"], name="mm")], [vi("x", [1, 4])], [vi("y", [1, 3])],
                  [init("wq", np.ones((4, 3), np.int8)), init("s", np.float32(scale)), init("z", np.int8(0))],
                  opsets=(("", 19),), ir=9)
        write(f"qdq_scale_{case}", "model.onnx", m)
        add(f"qdq_scale_{case}", ["inspect", "{D}/model.onnx"], "node 'dq_w' (DequantizeLinear;scale s is;positive")
    # Per-axis scales along an axis the weight does not have: the build names the node once.
    dq = h.make_node("DequantizeLinear", ["wq", "s", "z"], ["w"], name="dq_w", axis=5)
    m = model([dq, h.make_node("MatMul", ["x", "w"], ["y"], name="mm")], [vi("x", [1, 4])], [vi("y", [1, 3])],
              [init("wq", np.ones((4, 3), np.int8)), init("s", np.full(3, 0.5, np.float32)), init("z", np.zeros(3, np.int8))],
              opsets=(("", 19),), ir=9)
    write("qdq_axis_out_of_range", "model.onnx", m)
    add("qdq_axis_out_of_range", ["build", "{D}/model.onnx", "--device", "cpu", "-o", "{D}/m.kiln"],
        "pass 'fold-constants': node 'dq_w' (DequantizeLinear, #0): axis 5 is out of range for rank 2",
        check="absent:{D}/m.kiln")


def main():
    global OUT
    if len(sys.argv) != 2:
        sys.exit("usage: make_cases.py OUTDIR")
    OUT = sys.argv[1]
    os.makedirs(OUT, exist_ok=True)
    for part in [file_cases, structure_cases, shape_cases, external_cases, nested_cases, runtime_cases, output_cases,
                 quant_cases]:
        part()
    names = [c[0] for c in CASES]
    assert len(names) == len(set(names)), "duplicate case names"
    with open(os.path.join(OUT, "cases.tsv"), "w") as f:
        for c in CASES:
            f.write("\t".join(c) + "\n")


if __name__ == "__main__":
    main()
