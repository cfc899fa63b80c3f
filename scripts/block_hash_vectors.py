#!/usr/bin/env python3
"""Test vectors for Cachet's prefix block hash (DESIGN.md interface 1), computed with the Python
`blake3` package (an implementation independent of the Rust crate Cachet uses).

    pip install blake3 && python scripts/block_hash_vectors.py > tests/fixtures/block_hash_vectors.json
"""
import json
import struct

import blake3

TAG = b"cachet-v1"


def u32(n):
    return struct.pack("<I", n)


def toks(ts):
    return u32(len(ts)) + b"".join(struct.pack("<I", t) for t in ts)


def chain(key, salt, model_id, block_size, extra, tokens, public_blocks=0):
    """The chain of `tokens`' full blocks; the first `public_blocks` under the public salt, the
    block after them mixing the tenant's salt back in."""
    out, parent = [], None
    for i in range(len(tokens) // block_size):
        blk = tokens[i * block_size:(i + 1) * block_size]
        if parent is None:
            first_salt = public_salt_of(key) if public_blocks > 0 else salt
            data = TAG + first_salt + u32(len(model_id.encode())) + model_id.encode() + toks(blk)
        else:
            data = parent + toks(blk) + u32(len(extra)) + extra
            if i == public_blocks:
                data += salt
        parent = blake3.blake3(data, key=key).digest()
        out.append(parent.hex())
    return out


def salt_of(key, tenant):
    return blake3.blake3(key + tenant.encode(), derive_key_context="cachet-v1 tenant salt").digest()


def public_salt_of(key):
    return blake3.blake3(key, derive_key_context="cachet-v1 public prefix salt").digest()


def main():
    key_a = bytes(range(32))
    key_b = bytes([0xA5] * 32)
    cases = []
    specs = [
        (key_a, "tenant-a", "smollm2", 16, b"", list(range(40))),
        # Public prefixes: two tenants, two public blocks of three (the third salted), and a
        # prompt wholly public.
        (key_a, "tenant-a", "smollm2", 16, b"", list(range(50)), 2),
        (key_a, "tenant-b", "smollm2", 16, b"", list(range(50)), 2),
        (key_a, "tenant-b", "smollm2", 4, b"lora:7", list(range(9)), 2),
        (key_a, "tenant-b", "smollm2", 16, b"", list(range(40))),
        (key_b, "tenant-a", "smollm2", 16, b"", list(range(40))),
        (key_a, "tenant-a", "llama3-8b", 16, b"", [128000, 9906, 1917, 0, 4294967295] * 10),
        (key_a, "tenant-a", "smollm2", 4, b"lora:7", [1, 2, 3, 4, 5, 6, 7, 8, 9]),
        (key_a, "tenant-a", "smollm2", 16, b"", list(range(15))),
    ]
    for key, tenant, model, bs, extra, tokens, *public in specs:
        salt = salt_of(key, tenant)
        public_blocks = public[0] if public else 0
        cases.append({
            "key": key.hex(), "tenant": tenant, "salt": salt.hex(), "model_id": model, "block_size": bs,
            "extra": extra.hex(), "tokens": tokens, "public_blocks": public_blocks,
            "hashes": chain(key, salt, model, bs, extra, tokens, public_blocks),
        })
    print(json.dumps({"source": "python blake3 %s" % blake3.__version__, "cases": cases}, indent=1))


if __name__ == "__main__":
    main()
