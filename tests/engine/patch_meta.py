"""Rewrites an engine file's META section and re-seals the file (size and checksum), so tests can
present the loader with engines that are well-formed but were built for something else: another
device or GPU, a configuration field this kiln does not know, META that is not JSON.

    python3 tests/engine/patch_meta.py IN.kiln OUT.kiln 'PYTHON EXPRESSION OF meta'
    e.g. "dict(meta, device='cuda', target={'gpu': 'NVIDIA H100', 'sm_major': 9, ...})"
         "'not json'"   (a str result is written as it is)

The layout and checksum are src/runtime/engine_file.h's."""
import json
import struct
import sys

MASK = (1 << 64) - 1
MUL = 0x9E3779B97F4A7C15


def step(h, w):
    h = ((h ^ w) * MUL) & MASK
    return ((h << 31) | (h >> 33)) & MASK


def chunk_hash(b):
    lanes = [0x243F6A8885A308D3, 0x13198A2E03707344, 0xA4093822299F31D0, 0x082EFA98EC4E6C89]
    n = len(b)
    full = n - n % 32
    words = struct.unpack_from(f"<{full // 8}Q", b, 0)
    for i in range(0, len(words), 4):
        for k in range(4):
            lanes[k] = step(lanes[k], words[i + k])
    h = n
    for lane in lanes:
        h = step(h, lane)
    for byte in b[full:]:
        h = step(h, byte)
    return h


def checksum(b, chunk=4 << 20):
    h = chunk_hash(struct.pack("<Q", len(b)))
    for at in range(0, len(b), chunk):
        h = step(h, chunk_hash(b[at:at + chunk]))
    return h


def sections(b):
    at, end, out = 24, len(b) - 8, []
    while at < end:
        at = (at + 16 + 63) // 64 * 64 - 16
        tag, length = b[at:at + 4].decode(), struct.unpack_from("<Q", b, at + 8)[0]
        out.append((tag, b[at + 16:at + 16 + length]))
        at += 16 + length
    return out


def seal(head, secs):
    b = bytearray(head[:24])
    for tag, data in secs:
        b += b"\0" * ((len(b) + 16 + 63) // 64 * 64 - 16 - len(b))
        b += tag.encode() + b"\0" * 4 + struct.pack("<Q", len(data)) + data
    struct.pack_into("<Q", b, 16, len(b) + 8)
    return bytes(b) + struct.pack("<Q", checksum(bytes(b)))


def main():
    src, dst, expr = sys.argv[1:4]
    b = open(src, "rb").read()
    secs = sections(b)
    meta = json.loads(dict(secs)["META"])
    new = eval(expr, {"meta": meta})  # the test's own expression
    data = new.encode() if isinstance(new, str) else json.dumps(new).encode()
    open(dst, "wb").write(seal(b, [(t, data if t == "META" else d) for t, d in secs]))


if __name__ == "__main__":
    main()
