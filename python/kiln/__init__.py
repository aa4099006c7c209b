"""kiln: compile ONNX models into engines and run them, from Python.

    import kiln, numpy as np
    engine = kiln.build("model.onnx", device="cpu")          # or kiln.Engine.load("model.kiln")
    print(engine.inputs)                                     # [TensorInfo(name='input', dtype='float32', shape=[1, 3, 224, 224])]
    session = engine.create_session()
    logits, = session.run(None, {"input": np.random.rand(1, 3, 224, 224).astype(np.float32)})

Every call is kiln's C++ API (include/kiln): errors are kiln.KilnError with kiln's one-line
message, and the GIL is released while kiln builds, loads or runs. Inputs are numpy arrays or any
host DLPack tensor (taken without a copy when C-contiguous); outputs are numpy arrays that share
kiln's buffers.
"""
from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional, Sequence

import numpy as np

from ._kiln import KilnError, _Engine, _Session  # noqa: F401  (re-exported)
from . import _kiln

__all__ = ["KilnError", "Engine", "Session", "TensorInfo", "build", "from_torch", "quantize"]


@dataclass(frozen=True)
class TensorInfo:
    """An engine input or output. shape[i] is None for a dim the engine does not fix; its name is
    dim_names[i] and its range min_shape[i]..max_shape[i]."""
    name: str
    dtype: str
    shape: list
    min_shape: list = field(default_factory=list, repr=False)
    max_shape: list = field(default_factory=list, repr=False)
    dim_names: list = field(default_factory=list, repr=False)


class Session:
    """Runs an engine; several sessions of one engine may run at once (one thread each)."""

    def __init__(self, engine: "Engine", impl: _Session):
        self._engine = engine
        self._impl = impl

    def run(self, output_names: Optional[Sequence[str]], input_feed: Mapping[str, Any]) -> list:
        """ONNX Runtime's form: the outputs named (all, in engine order, for None) as numpy arrays.

        On a GPU engine, inputs may be CUDA tensors (torch, CuPy or any DLPack producer): they are read
        where they lie and the outputs come back on the GPU too, as torch tensors when an input was one
        (else as DLPack arrays: torch.from_dlpack / cupy.from_dlpack take them), with no host copy."""
        inputs, outputs = self._engine.inputs, self._engine.outputs
        names = [i.name for i in inputs]
        unknown = [k for k in input_feed if k not in names]
        if unknown:
            raise KilnError(f"input '{unknown[0]}' is not an input of this engine; its inputs are {names}")
        missing = [n for n in names if n not in input_feed]
        if missing:
            raise KilnError(f"input '{missing[0]}' has no value; the engine's inputs are {names}")
        arrays = [_as_tensor(input_feed[i.name], i) for i in inputs]
        torch_in = any(type(a).__module__.split(".")[0] == "torch" for a in arrays)
        result = self._impl.run(arrays, torch_in)
        if output_names is None:
            return result
        index = {o.name: k for k, o in enumerate(outputs)}
        for n in output_names:
            if n not in index:
                raise KilnError(f"output '{n}' is not an output of this engine; its outputs are {list(index)}")
        return [result[index[n]] for n in output_names]


def _as_tensor(x, info: TensorInfo):
    """numpy arrays and DLPack tensors go as they are (kiln checks dtype and shape); other values
    (lists, scalars) become arrays of the input's dtype."""
    if isinstance(x, np.ndarray) or hasattr(x, "__dlpack__"):
        return x
    return np.asarray(x, dtype=info.dtype if info.dtype in np.sctypeDict else None)


class Engine:
    """A compiled model: kiln.build(...) or Engine.load(path)."""

    def __init__(self, impl: _Engine):
        self._impl = impl
        self.inputs = [TensorInfo(**d) for d in impl.inputs]
        self.outputs = [TensorInfo(**d) for d in impl.outputs]

    @staticmethod
    def load(path: str | os.PathLike) -> "Engine":
        """Reads an engine file written by save() or `kiln build -o` (no ONNX, nothing rebuilt)."""
        return Engine(_Engine.load(os.fspath(path)))

    def save(self, path: str | os.PathLike) -> None:
        self._impl.save(os.fspath(path))

    @property
    def device(self) -> str:
        return self._impl.device

    @property
    def precision(self) -> str:
        return self._impl.precision

    @property
    def weight_bytes(self) -> int:
        return self._impl.weight_bytes

    def report(self) -> str:
        """The build report: every node's placement and kernel, the memory plan."""
        return self._impl.report()

    def create_session(self) -> Session:
        return Session(self, self._impl.create_session())

    def __repr__(self):
        return f"kiln.Engine(device={self.device!r}, precision={self.precision!r}, inputs={self.inputs}, outputs={self.outputs})"


def build(path: str | os.PathLike, *, device: str = "auto", precision: str = "fp32",
          shapes: Optional[Mapping[str, Sequence[int]]] = None, batch: int = 0,
          shape_ranges: Optional[Mapping[str, Sequence]] = None,
          warm_shapes: Sequence[Mapping[str, Sequence[int]]] = (), disabled_passes: Sequence[str] = (),
          autotune: bool = True, cuda_graph: bool = True, memory_budget_mib: int = 0, timing_cache: str = "",
          tensor_parallel: int = 1, micro_batches: int = 0, deterministic: bool = False,
          target: str = "server") -> Engine:
    """Imports and optimizes an ONNX model and builds an engine (BuildConfig's fields, by name).

    shapes binds inputs' symbolic dims ({"input_ids": [1, 128]}); shape_ranges gives ranges for a
    dynamic engine, one entry per dim: an int (fixed) or (min, max) / (min, max, opt)
    ({"input_ids": [(1, 64), (16, 512)]}); warm_shapes lists shapes in those ranges that a GPU engine plans at
    build and load and each new session captures before its first run ([{"input_ids": [8, 128]}]; inputs
    sharing its dims follow). tensor_parallel > 1 splits the model over that many GPUs
    (CPU threads on the CPU); it needs fixed shapes, and with a batch runs micro_batches at once where
    that pays (0) or as asked (docs/tensor-parallel.md). deterministic: the same output bits at any
    CPU thread count (docs/determinism.md). target="edge": batch-1 latency on the CPU, the session's
    memory in the report and held to memory_budget_mib."""
    return Engine(_kiln.build(os.fspath(path), device, precision, {k: list(v) for k, v in (shapes or {}).items()},
                              batch, dict(shape_ranges or {}),
                              [{k: list(v) for k, v in w.items()} for w in warm_shapes], list(disabled_passes),
                              autotune, cuda_graph, memory_budget_mib, timing_cache, tensor_parallel, micro_batches,
                              deterministic, target))


def quantize(path: str | os.PathLike, out: str | os.PathLike, *, calib_dir: str, precision: str = "int8",
             method: str = "minmax", eval_dir: str = "", keep: Sequence[str] = (), quantize_sensitive: bool = False,
             accuracy_budget: float = 0.0, metric: str = "auto") -> tuple[str, dict]:
    """`kiln quantize`: writes the QDQ model to `out`; returns the report (text, and parsed JSON)."""
    import json
    text, js = _kiln.quantize(os.fspath(path), os.fspath(out), precision, method, calib_dir, eval_dir, list(keep),
                              quantize_sensitive, accuracy_budget, metric)
    return text, json.loads(js)


def from_torch(module, example_inputs, *, input_names: Optional[Sequence[str]] = None,
               output_names: Optional[Sequence[str]] = None, opset: int = 17, **config) -> Engine:
    """Exports a torch.nn.Module with torch.onnx.export (example_inputs: a tensor or a tuple of them)
    and builds it with kiln.build(**config)."""
    import torch
    if not isinstance(example_inputs, (tuple, list)):
        example_inputs = (example_inputs,)
    input_names = list(input_names or [f"input_{i}" for i in range(len(example_inputs))])
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "model.onnx")
        module.eval()
        with torch.no_grad():
            torch.onnx.export(module, tuple(example_inputs), path, input_names=input_names,
                              output_names=list(output_names) if output_names else None, opset_version=opset,
                              dynamo=False)
        return build(path, **config)
