#!/usr/bin/env python3
# Used to make the GGUF seeds of fuzz/seeds/gguf_reader (see fuzz/seeds/PROVENANCE.md):
# python3 fuzz/make_small_gguf.py SRC.gguf DST.gguf N
# Writes a small GGUF: the source's metadata (token arrays kept) and its N smallest tensors.
import struct, sys
src, dst, ntens = sys.argv[1], sys.argv[2], int(sys.argv[3])
b = open(src,'rb').read()
pos = 0
def rd(fmt):
    global pos
    v = struct.unpack_from('<'+fmt, b, pos); pos += struct.calcsize('<'+fmt); return v[0]
def rstr():
    global pos
    n = rd('Q'); s = b[pos:pos+n]; pos += n; return s
SZ = {0:'B',1:'b',2:'H',3:'h',4:'I',5:'i',6:'f',7:'?',10:'Q',11:'q',12:'d'}
def skipval(t):
    global pos
    if t in SZ: rd(SZ[t])
    elif t == 8: rstr()
    elif t == 9:
        et = rd('I'); n = rd('Q')
        for _ in range(n): skipval(et)
assert b[:4] == b'GGUF'; pos = 4
ver = rd('I'); nt = rd('Q'); nkv = rd('Q')
kv_start = pos
align = 32
for _ in range(nkv):
    k = rstr(); t = rd('I'); vs = pos; skipval(t)
    if k == b'general.alignment': align = struct.unpack_from('<I', b, vs)[0]
kv_bytes = b[kv_start:pos]
infos = []
for _ in range(nt):
    name = rstr(); nd = rd('I'); dims = [rd('Q') for _ in range(nd)]; ty = rd('I'); off = rd('Q')
    infos.append([name, dims, ty, off])
data_start = (pos + align - 1)//align*align
offs = sorted(i[3] for i in infos) + [len(b) - data_start]
size = {i[3]: offs[offs.index(i[3])+1] - i[3] for i in infos}
keep = sorted(infos, key=lambda i: size[i[3]])[:ntens]
out = bytearray(b'GGUF' + struct.pack('<IQQ', ver, len(keep), nkv) + kv_bytes)
data = bytearray(); table = bytearray()
for name, dims, ty, off in keep:
    data += b'\0' * ((-len(data)) % align)
    table += struct.pack('<Q', len(name)) + name + struct.pack('<I', len(dims)) + b''.join(struct.pack('<Q', d) for d in dims) + struct.pack('<IQ', ty, len(data))
    data += b[data_start+off : data_start+off+size[off]]
out += table
out += b'\0' * ((-len(out)) % align)
out += data
open(dst,'wb').write(out)
print(dst, len(out), 'bytes,', len(keep), 'tensors,', nkv, 'kvs; kv section', len(kv_bytes))
