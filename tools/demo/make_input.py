#!/usr/bin/env python3
"""Turn a photo into the input tensor of models/efficientnet-lite0/model.onnx.

Usage:
    python3 tools/demo/make_input.py IMAGE OUT.npy
    python3 tools/demo/make_input.py --check      # rebuild the bundled .npy files and compare

Needs numpy and Pillow. The bundled files were made with numpy 2.4.6 and Pillow 13.0.0.

Preprocessing, the same as Google's EfficientNet-Lite evaluation (the weights
were trained in TensorFlow with these settings):
  1. Decode the image and convert it to 8-bit RGB.
  2. Resize so the shorter side is 256 px (PIL bilinear, which antialiases when it
     shrinks), keeping the aspect ratio; the longer side is rounded to the
     nearest pixel.
  3. Crop the central 224 x 224 (left = (w - 224) // 2, top = (h - 224) // 2).
     256 -> 224 is the usual 0.875 crop ratio.
  4. Normalize every channel as (pixel - 127) / 128, which maps [0, 255] to
     about [-1, 1]. This is EfficientNet-Lite's mean/std (127, 128), NOT the
     torchvision ImageNet mean/std.
  5. HWC -> CHW, add a batch axis: float32 of shape [1, 3, 224, 224], RGB order.

The model's output "logits" [1, 1000] is raw scores; apply softmax for
probabilities. Class i is line i (0-based) of models/efficientnet-lite0/labels.txt.
"""
import os
import sys

import numpy as np
from PIL import Image

SHORT_SIDE = 256
CROP = 224
MEAN = 127.0
STD = 128.0

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
MODEL_DIR = os.path.join(REPO, "models", "efficientnet-lite0")
BUNDLED = [("chelsea.png", "chelsea.npy"), ("coffee.png", "coffee.npy")]


def preprocess(path):
    img = Image.open(path).convert("RGB")
    w, h = img.size
    scale = SHORT_SIDE / min(w, h)
    img = img.resize((int(round(w * scale)), int(round(h * scale))), Image.BILINEAR)
    w, h = img.size
    left, top = (w - CROP) // 2, (h - CROP) // 2
    img = img.crop((left, top, left + CROP, top + CROP))
    x = (np.asarray(img, dtype=np.float32) - MEAN) / STD   # [224, 224, 3]
    return np.ascontiguousarray(x.transpose(2, 0, 1)[None], dtype=np.float32)


def main(argv):
    if argv == ["--check"]:
        worst = 0.0
        for src, dst in BUNDLED:
            x = preprocess(os.path.join(MODEL_DIR, src))
            ref = np.load(os.path.join(MODEL_DIR, dst))
            assert x.shape == ref.shape == (1, 3, CROP, CROP) and ref.dtype == np.float32
            d = float(np.abs(x - ref).max())
            print(f"{dst}: max abs diff {d:g}")
            worst = max(worst, d)
        # Pillow's resampler has been stable for years, but allow one 8-bit step.
        return 0 if worst <= 1.0 / STD + 1e-6 else 1
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    x = preprocess(argv[0])
    np.save(argv[1], x)
    print(f"wrote {argv[1]}: {x.dtype} {list(x.shape)} min {x.min():.4f} max {x.max():.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
