# Copies a GGUF's metadata (the tokenizer and chat template) into a GGUF with no tensors: a
# tokenizer for `--load-format dummy` runs (`--tokenizer FILE`) on a machine the model's weights
# need not reach (SmolLM2's 98 MB GGUF → 1.8 MB). GGUF v2/v3, every metadata type.
#   python3 scripts/gguf_tokenizer_only.py IN.gguf OUT.gguf
import struct, sys
src, dst = sys.argv[1], sys.argv[2]
b = open(src, 'rb').read()
magic, ver = b[:4], struct.unpack_from('<I', b, 4)[0]
assert magic == b'GGUF' and ver >= 2
n_t, n_kv = struct.unpack_from('<QQ', b, 8)
off = 24
SIZES = {0:1,1:1,2:2,3:2,4:4,5:4,6:4,7:1,10:8,11:8,12:8}
def skip_val(t, off):
    if t in SIZES: return off + SIZES[t]
    if t == 8:
        n = struct.unpack_from('<Q', b, off)[0]; return off + 8 + n
    if t == 9:
        et, n = struct.unpack_from('<IQ', b, off); off += 12
        if et in SIZES: return off + SIZES[et] * n
        for _ in range(n): off = skip_val(et, off)
        return off
    raise ValueError(t)
start = off
for _ in range(n_kv):
    klen = struct.unpack_from('<Q', b, off)[0]; off += 8 + klen
    t = struct.unpack_from('<I', b, off)[0]; off += 4
    off = skip_val(t, off)
out = b'GGUF' + struct.pack('<IQQ', ver, 0, n_kv) + b[start:off]
out += b'\0' * ((-len(out)) % 32)
open(dst, 'wb').write(out)
print(f"{n_kv} keys, {len(out)} bytes (of {len(b)})")
