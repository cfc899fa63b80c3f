#!/usr/bin/env python3
"""Reference dequantisation of GGUF quant blocks by the `gguf` package (llama.cpp's gguf-py), written as
tests/fixtures/gguf_blocks_reference.json for Cachet's own dequantiser.

Blocks are random bytes with their f16 scale fields set to ordinary values (random bytes there could
be NaN or infinite), two blocks per type, so every bit of the quantised payload is exercised.

    python scripts/gguf_blocks_reference.py --out tests/fixtures/gguf_blocks_reference.json
"""
import argparse
import json

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import quants

# type -> (bytes per block, offsets of f16 scale fields)
LAYOUT = {
    T.Q4_0: (18, [0]),
    T.Q4_1: (20, [0, 2]),
    T.Q5_0: (22, [0]),
    T.Q5_1: (24, [0, 2]),
    T.Q8_0: (34, [0]),
    T.Q4_K: (144, [0, 2]),
    T.Q5_K: (176, [0, 2]),
    T.Q6_K: (210, [208]),
}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="tests/fixtures/gguf_blocks_reference.json")
    a = ap.parse_args()
    rng = np.random.default_rng(2024)
    doc = {"source": "gguf-py quants.dequantize", "types": []}
    for t, (size, scales) in LAYOUT.items():
        blocks = rng.integers(0, 256, size=(2, size), dtype=np.uint8)
        for b in blocks:
            for off in scales:
                b[off:off + 2] = np.frombuffer(np.float16(rng.uniform(-0.2, 0.2)).tobytes(), dtype=np.uint8)
        raw = blocks.reshape(-1)
        values = quants.dequantize(raw, t).reshape(-1)
        doc["types"].append({"type": t.name, "id": int(t), "bytes": raw.tobytes().hex(),
                             "values": [float(v) for v in values]})
        print(t.name, len(values))
    with open(a.out, "w") as fh:
        json.dump(doc, fh)


if __name__ == "__main__":
    main()
