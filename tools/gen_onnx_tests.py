#!/usr/bin/env python3
"""Writes the ONNX node backend tests of the installed onnx package as test folders.

The onnx 1.23.2 wheel ships the test *generators* (onnx/backend/test/case/node/*.py) but not the
generated node data, so kiln generates it: OUTDIR/test_x/model.onnx and
OUTDIR/test_x/test_data_set_N/{input,output}_K.pb, the same layout as the ONNX repository's data.
"""
import os
import sys
import warnings

import numpy as np
import onnx
from onnx import numpy_helper


def to_proto(value, vtype, name):
    """Serializes one test value the way its graph declares it (tensor, sequence, optional)."""
    if vtype.HasField("sequence_type"):
        return numpy_helper.from_list(value, name)
    if vtype.HasField("optional_type"):
        return numpy_helper.from_optional(value, name)
    if vtype.HasField("map_type"):
        return numpy_helper.from_dict(value, name)
    if isinstance(value, onnx.TensorProto):
        return value
    return numpy_helper.from_array(np.asarray(value) if not isinstance(value, np.ndarray) else value, name)


def write_case(case, outdir):
    folder = os.path.join(outdir, case.name)
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "model.onnx"), "wb") as f:
        f.write(case.model.SerializeToString())
    graph = case.model.graph
    for i, (inputs, outputs) in enumerate(case.data_sets):
        ds = os.path.join(folder, f"test_data_set_{i}")
        os.makedirs(ds, exist_ok=True)
        for kind, values, decls in (("input", inputs, graph.input), ("output", outputs, graph.output)):
            for j, v in enumerate(values):
                proto = to_proto(v, decls[j].type, decls[j].name)
                with open(os.path.join(ds, f"{kind}_{j}.pb"), "wb") as f:
                    f.write(proto.SerializeToString())


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: gen_onnx_tests.py OUTDIR")
    outdir = sys.argv[1]
    warnings.simplefilter("ignore")
    np.seterr(all="ignore")
    from onnx.backend.test.case import node

    cases = node.collect_testcases(None)
    os.makedirs(outdir, exist_ok=True)
    failed = 0
    for case in cases:
        try:
            write_case(case, outdir)
        except Exception as e:  # a generator the wheel cannot serialize: report, keep going
            failed += 1
            print(f"gen_onnx_tests: {case.name}: {e}", file=sys.stderr)
    print(f"gen_onnx_tests: wrote {len(cases) - failed} node tests (onnx {onnx.__version__}) to {outdir}")


if __name__ == "__main__":
    main()
