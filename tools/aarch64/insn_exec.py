#!/usr/bin/env python3
"""Dynamic instruction count of one call of a function, under qemu-user.

Usage: insn_exec.py BINARY FUNCTION [ARGS...]   (env: QEMU_CPU, e.g. cortex-a76)
  Runs `qemu-aarch64 -L /usr/aarch64-linux-gnu BINARY ARGS` with one guest instruction per
  translation block (`-one-insn-per-tb`, called `-singlestep` before qemu 8.1) and
  `-d exec,nochain` (every executed block is logged: chaining blocks would skip the log), so
  the log has one line per executed instruction, with its address and the symbol holding it.
  FUNCTION is a demangled name as `nm -C` prints it (e.g.
  `dsp::backend::neon_kquants::tile_dot`); the count starts at the first instruction of its
  first call (entered from another symbol) and runs until the instruction after the call
  site (return address = call site + 4), so it includes what the function calls (memset,
  ...) and nothing of its caller. Prints one JSON line: {"function", "insns", "calls_seen"}.

Why dynamic: a static loop range (insn_loops.py) cannot measure code whose hot path is
spread over several loops with run-time bounds (the K-quant sweep's row and token loops): a
static count either misses code that runs or counts cold paths as if taken. This counts
what runs. To get a per-block figure, difference two calls with different block counts
(insn_table.sh does), which cancels the call's fixed cost.
"""
import json
import os
import re
import subprocess
import sys
import tempfile

LINE = re.compile(r"^Trace \d+: \S+ \[[0-9a-f]+/([0-9a-f]+)/[0-9a-f]+/[0-9a-f]+\] ?(\S*)")


def symbol(binary, demangled):
    """(symbol-table name, address, size) of `demangled` (qemu's log prints raw names)."""
    nm = lambda *a: subprocess.run(["aarch64-linux-gnu-nm", "-S", *a, binary],
                                   capture_output=True, text=True, check=True).stdout
    for r, d in zip(nm().splitlines(), nm("-C").splitlines()):
        f = r.split(" ", 3)
        if len(f) == 4 and d.split(" ", 3)[-1] == demangled:
            return f[3], int(f[0], 16), int(f[1], 16)
    sys.exit(f"insn_exec.py: {demangled} not in the symbols of {binary}")


def returns(binary, addr, size):
    """Offsets (from the function start) of its `ret` instructions."""
    dis = subprocess.run(["aarch64-linux-gnu-objdump", "-d", "--no-show-raw-insn",
                          f"--start-address={addr}", f"--stop-address={addr + size}", binary],
                         capture_output=True, text=True, check=True).stdout
    out = set()
    for line in dis.splitlines():
        m = re.match(r"^\s+([0-9a-f]+):\s+ret\b", line)
        if m:
            out.add(int(m.group(1), 16) - addr)
    return out


def main():
    binary, function, args = sys.argv[1], sys.argv[2], sys.argv[3:]
    sym, addr, size = symbol(binary, function)
    rets = returns(binary, addr, size)
    helptext = subprocess.run(["qemu-aarch64", "-h"], capture_output=True, text=True).stdout
    one = "-one-insn-per-tb" if "-one-insn-per-tb" in helptext else "-singlestep"
    with tempfile.TemporaryDirectory() as tmp:
        log = os.path.join(tmp, "exec.log")
        subprocess.run(["qemu-aarch64", "-L", "/usr/aarch64-linux-gnu", one, "-d",
                        "exec,nochain", "-D", log, binary, *args],
                       check=True, stdout=subprocess.DEVNULL)
        # State: None before the first call, a dict during it, "done" after its return.
        count, calls, call, prev_sym = 0, 0, None, None
        with open(log, errors="replace") as f:
            for line in f:
                m = LINE.match(line)
                if not m:
                    continue
                pc, s = int(m.group(1), 16), m.group(2)
                if s == sym and prev_sym != sym and (call is None or call == "done"):
                    calls += 1
                    if call is None:
                        # Calls enter at the function's start: the load base of the binary.
                        call = {"base": pc - addr, "caller": prev_sym}
                if isinstance(call, dict):
                    if s == call["caller"] and s != sym:
                        call = "done"  # back in the caller without a ret seen (tail call)
                    else:
                        count += 1
                        if s == sym and pc - call["base"] - addr in rets:
                            call = "done"
                prev_sym = s
    if calls == 0:
        sys.exit(f"insn_exec.py: {function} was not called")
    print(json.dumps({"function": function, "insns": count, "calls_seen": calls}))


if __name__ == "__main__":
    main()
