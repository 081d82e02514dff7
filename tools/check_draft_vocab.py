#!/usr/bin/env python3
"""Cross-check `tandem-tools draft-vocab` output with gguf-py's GGUFReader (independent of
our Rust reader).

Usage:
    tools/check_draft_vocab.py SOURCE.gguf OUTPUT.gguf

Checks that OUTPUT opens with GGUFReader and holds:
- every metadata field of SOURCE with the same type and value, plus
  `{arch}.nextn_draft_token_ids` (UINT32 array of N unique ids < n_vocab);
- every tensor of SOURCE with the same type, shape and bytes, plus
  `blk.{L}.nextn.draft_output.weight` (L = block_count - nextn_predict_layers) with the LM
  head's type, shape [n_embd, N] and row r equal to LM-head row ids[r], byte for byte.
Exits non-zero with a message on the first mismatch; prints a one-line summary otherwise.
"""

import sys

import numpy as np
from gguf import GGUFReader, GGUFValueType


def fail(msg):
    print(f"check_draft_vocab: FAIL: {msg}", file=sys.stderr)
    sys.exit(1)


def field_value(f):
    """A field's value as plain Python (lists for arrays, str for strings)."""
    if f.types[0] == GGUFValueType.ARRAY:
        return [bytes(f.parts[i]) if f.types[-1] == GGUFValueType.STRING else f.parts[i].tolist()
                for i in f.data]
    return bytes(f.parts[f.data[0]]) if f.types[0] == GGUFValueType.STRING else f.parts[f.data[0]].tolist()


def scalar(r, key):
    f = r.fields.get(key)
    if f is None:
        fail(f"{key} missing")
    return int(f.parts[f.data[0]][0])


def main():
    if len(sys.argv) != 3:
        fail("usage: check_draft_vocab.py SOURCE.gguf OUTPUT.gguf")
    src, out = GGUFReader(sys.argv[1]), GGUFReader(sys.argv[2])

    arch = bytes(src.fields["general.architecture"].parts[-1]).decode()
    layer = scalar(src, f"{arch}.block_count") - scalar(src, f"{arch}.nextn_predict_layers")
    key = f"{arch}.nextn_draft_token_ids"
    name = f"blk.{layer}.nextn.draft_output.weight"

    skip = {"GGUF.kv_count", "GGUF.tensor_count", "GGUF.version"}
    for k, f in src.fields.items():
        if k in skip:
            continue
        g = out.fields.get(k)
        if g is None:
            fail(f"metadata {k} missing from the output")
        if list(g.types) != list(f.types) or field_value(g) != field_value(f):
            fail(f"metadata {k} differs")
    extra = set(out.fields) - set(src.fields)
    if extra != {key}:
        fail(f"new metadata {sorted(extra)}, expected [{key!r}]")
    ids_field = out.fields[key]
    if list(ids_field.types) != [GGUFValueType.ARRAY, GGUFValueType.UINT32]:
        fail(f"{key} has types {ids_field.types}, expected ARRAY of UINT32")
    ids = [int(ids_field.parts[i][0]) for i in ids_field.data]

    src_t = {t.name: t for t in src.tensors}
    out_t = {t.name: t for t in out.tensors}
    for n, t in src_t.items():
        u = out_t.get(n)
        if u is None:
            fail(f"tensor {n} missing from the output")
        if u.tensor_type != t.tensor_type or list(u.shape) != list(t.shape):
            fail(f"tensor {n}: type/shape differ")
        if not np.array_equal(np.asarray(u.data).view(np.uint8), np.asarray(t.data).view(np.uint8)):
            fail(f"tensor {n}: bytes differ")
    if set(out_t) - set(src_t) != {name}:
        fail(f"new tensors {sorted(set(out_t) - set(src_t))}, expected [{name!r}]")

    lm = src_t.get("output.weight") or src_t["token_embd.weight"]
    n_embd, n_vocab = (int(x) for x in lm.shape)
    d = out_t[name]
    if d.tensor_type != lm.tensor_type or [int(x) for x in d.shape] != [n_embd, len(ids)]:
        fail(f"{name}: {d.tensor_type.name} {list(d.shape)}, expected {lm.tensor_type.name} [{n_embd}, {len(ids)}]")
    if len(set(ids)) != len(ids) or max(ids) >= n_vocab:
        fail(f"{key}: ids repeat or reach past n_vocab {n_vocab}")
    lm_rows = np.asarray(lm.data).view(np.uint8).reshape(n_vocab, -1)
    d_rows = np.asarray(d.data).view(np.uint8).reshape(len(ids), -1)
    if not np.array_equal(d_rows, lm_rows[ids]):
        bad = next(r for r in range(len(ids)) if not np.array_equal(d_rows[r], lm_rows[ids[r]]))
        fail(f"{name}: row {bad} differs from LM-head row {ids[bad]}")

    print(f"check_draft_vocab: OK: {len(src.fields) - len(skip)} KVs and {len(src_t)} tensors unchanged; "
          f"{name} = {len(ids)} rows of {lm.name} ({lm.tensor_type.name}); {key} = {len(ids)} unique ids < {n_vocab}")


if __name__ == "__main__":
    main()
