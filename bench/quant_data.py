#!/usr/bin/env python3
"""Real photos as EfficientNet-Lite inputs, for calibration and evaluation (issue 25).

    python3 bench/quant_data.py OUT_DIR [--calib N] [--eval N] [--size 224]

Writes OUT_DIR/calib/NNNN.npy and OUT_DIR/eval/NNNN.npy, float32 [1, 3, S, S], preprocessed as
tools/demo/make_input.py does ((pixel - 127) / 128, RGB, CHW). The photos are scikit-image's sample
images (CC0 / public domain; `pip install scikit-image`); each sample is a seeded random crop (40-100%
of the shorter side, anywhere in the image), optionally mirrored, resized to S x S. The calibration
and evaluation sets come from different photos, so they are disjoint.
"""
import argparse
import os

import numpy as np
from PIL import Image
import skimage.data as sd

# The photos the scikit-image wheel carries (others need a download): colour, then greyscale ones
# repeated over three channels. (skimage's `cat` is `chelsea` again.)
PHOTOS = ["astronaut", "chelsea", "coffee", "rocket", "motorcycle", "hubble_deep_field", "retina",
          "immunohistochemistry", "camera", "coins", "clock", "moon", "brick", "grass"]


def load(name):
    if name == "motorcycle":
        img = sd.stereo_motorcycle()[0]
    else:
        img = getattr(sd, name)()
    img = np.asarray(img)
    if img.ndim == 2:
        img = np.stack([img] * 3, -1)
    return Image.fromarray(img[..., :3].astype(np.uint8)).convert("RGB")


def sample(img, rng, size):
    w, h = img.size
    side = int(min(w, h) * rng.uniform(0.4, 1.0))
    x, y = int(rng.integers(0, w - side + 1)), int(rng.integers(0, h - side + 1))
    crop = img.crop((x, y, x + side, y + side)).resize((size, size), Image.BILINEAR)
    a = np.asarray(crop, dtype=np.float32)
    if rng.random() < 0.5:
        a = a[:, ::-1]
    a = (a - 127.0) / 128.0
    return np.ascontiguousarray(a.transpose(2, 0, 1)[None])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--calib", type=int, default=128)
    ap.add_argument("--eval", type=int, default=256)
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    photos = [load(n) for n in PHOTOS]
    calib, evals = photos[0::2], photos[1::2]  # every other photo: no photo in both sets
    rng = np.random.default_rng(a.seed)
    for folder, imgs, n in (("calib", calib, a.calib), ("eval", evals, a.eval)):
        d = os.path.join(a.out, folder)
        os.makedirs(d, exist_ok=True)
        for i in range(n):
            np.save(os.path.join(d, f"{i:04d}.npy"), sample(imgs[i % len(imgs)], rng, a.size))
    print(f"{a.out}: {a.calib} calibration samples from {[PHOTOS[i] for i in range(0, len(PHOTOS), 2)]}, "
          f"{a.eval} evaluation samples from {[PHOTOS[i] for i in range(1, len(PHOTOS), 2)]}")


if __name__ == "__main__":
    main()
