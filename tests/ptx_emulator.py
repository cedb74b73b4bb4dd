"""Runs the kernels' inline PTX on the CPU, so that their text (not a rewrite of it) is
checked where no GPU is. Passing here is necessary, not sufficient: a statement that
passed here once failed on the GPU (BENCHMARKS.md, "Counting, ranking and sampling in
shared memory").

``Block`` runs the top-k's statements that share memory or a warp (the select kernel's
slots, the sample's threshold, the filter's per-warp append) thread by thread. It knows
only the instructions those statements use: 32-bit ``mov`` (also of ``%tid.x``,
``%ntid.x``), ``add``, ``sub``, ``mul.lo``, ``mad.lo``, ``and``, ``or``, ``xor``,
``not``, ``shl``, ``shr`` (shifts past 31 give 0, as in PTX), ``clz``, ``setp``
(unsigned, or ``eq``/``ne`` of any 32-bit type; with ``.and``/``.or``), ``selp``,
``ld``/``st``/``red``/``atom.shared`` (32-bit), ``popc``, ``match.any.sync``,
``vote.sync.ballot`` and ``shfl.sync.idx`` (over each 32 threads, the full mask;
``%lanemask_lt``), ``bra``, labels, predicates (``@p``, ``@!p``) and ``bar.sync``;
``.reg`` and ``.shared`` declarations; for global buffers (``allocate_global``, below
2**32) ``mad.wide.u32``, ``atom.global.relaxed.gpu.add.u32`` and ``st.global``
(``.b32``, ``.v2.b32``). A CTA's threads run one at a time in a random order, each up to
its next barrier (where it waits for the whole block) or warp collective (where it waits
for its warp): any such order is one the GPU may take, and a missing barrier shows as a
warp running ahead into memory another still uses.

``Lanes`` runs an element-wise statement (the store's conversions, the scorer's decodes)
on every element of numpy arrays at once; its class docstring lists what it knows.
"""

from __future__ import annotations

import random
import re

import numpy as np

MASK = 0xFFFFFFFF


class Block:
    """One CTA: its shared memory (the statements' arrays, from address 0) and the
    statements run on its threads one after another, as a kernel runs them."""

    def __init__(self, seed: int = 0) -> None:
        self.shared: dict[int, int] = {}  # 32-bit words by byte address
        self.symbols: dict[str, int] = {}  # function-scope names: arrays' addresses, ...
        self.size = 0
        self.rng = random.Random(seed)
        self.global_memory: dict[int, int] = {}  # 32-bit words by byte address
        self.global_buffers: list[tuple[int, int]] = []
        self.global_end = 0x10000  # buffers below 2**32: addresses fit a 32-bit register

    def _parse(self, text: str):
        program, labels, depth = [], {}, 0
        for raw in text.splitlines():
            line = raw.split("//", 1)[0].strip().rstrip(";").strip()
            if line in ("{", "}"):
                depth += 1 if line == "{" else -1
                continue
            declared = re.match(r"\.shared \.align \d+ \.b(8|32) (\w+)\[(\d+)\]", line)
            if line.startswith(".reg") and depth == 0:  # a function-scope name
                declared = re.match(r"\.reg \.(\w+) (\w+)$", line)
            elif line.startswith(".reg") or not line:
                continue
            if declared:
                name = declared.group(2)
                if depth == 0 and name in self.symbols:  # (inside braces: a new one each time)
                    raise ValueError(f"duplicate definition of {name}")
                self.symbols[name] = self.size
                if line.startswith(".shared"):
                    self.size += int(declared.group(3)) * (4 if declared.group(1) == "32" else 1)
                continue
            if line.endswith(":"):
                labels[line[:-1]] = len(program)
                continue
            guard = None
            if line.startswith("@"):
                guard, line = line.split(None, 1)
            opcode, _, rest = line.partition(" ")
            operands = [x.strip() for x in re.split(r",(?![^{]*})", rest)] if rest else []
            program.append((guard, opcode, operands))
        return program, labels

    def run(self, text: str, operands: list[list[int]], outputs: int) -> list[list[int]]:
        """Runs the statement ``text`` on every thread (``operands[t]``: its ``$`` operands
        in order, the first ``outputs`` of them results, their values ignored) to its end;
        returns each thread's results."""
        program, labels = self._parse(text)
        threads = [_Thread(self, program, labels, list(values), outputs, tid, len(operands))
                   for tid, values in enumerate(operands)]
        steps = {thread.tid: thread.steps() for thread in threads}
        sent: dict[int, int | None] = dict.fromkeys(steps)
        runnable = list(steps)
        at_barrier: set[int] = set()
        at_match: dict[int, int] = {}  # tid -> the value it matches on
        ended: set[int] = set()
        while runnable:
            # A random runnable thread, up to its next barrier, warp-wide match or end: a
            # warp's match holds only that warp, a barrier every thread of the block.
            tid = runnable.pop(self.rng.randrange(len(runnable)))
            value, sent[tid] = sent[tid], None
            try:
                stop = steps[tid].send(value) if value is not None else next(steps[tid])
            except StopIteration:
                ended.add(tid)
                continue
            if stop == "barrier":
                at_barrier.add(tid)
            else:
                at_match[tid] = stop
                warp = [t for t in steps if t // 32 == tid // 32]
                if all(t in at_match for t in warp):  # the warp's lanes all there
                    if len({at_match[t][0] for t in warp}) != 1:
                        raise RuntimeError("a warp's lanes at different collectives")
                    for t in warp:
                        sent[t] = _collective(warp, at_match, t)
                    for t in warp:
                        del at_match[t]
                    runnable += warp
            if not runnable and at_barrier:
                if len(at_barrier) != len(steps):
                    raise RuntimeError("a barrier that not every thread reached")
                runnable, at_barrier = list(at_barrier), set()
        if at_match or len(ended) != len(steps):
            raise RuntimeError("a warp collective that not every lane of the warp reached")
        return [thread.operands[:outputs] for thread in threads]

    def allocate_global(self, words: int, fill: int = 0xDEADBEEF) -> int:
        """A global buffer of ``words`` 32-bit words, each holding ``fill``: its address.
        Global accesses outside every buffer raise ``IndexError``."""
        base = self.global_end
        self.global_buffers.append((base, base + 4 * words))
        for i in range(words):
            self.global_memory[base + 4 * i] = fill
        self.global_end = base + 4 * words + 256  # a gap: a step past one buffer misses
        return base

    def load_global(self, address: int) -> int:
        self._check_global(address)
        return self.global_memory[address]

    def store_global(self, address: int, value: int) -> None:
        self._check_global(address)
        self.global_memory[address] = value & MASK

    def _check_global(self, address: int) -> None:
        if address % 4 or not any(lo <= address < hi for lo, hi in self.global_buffers):
            raise IndexError(f"global address {address:#x} outside every buffer or unaligned")

    def load(self, address: int) -> int:
        self._check(address)
        return self.shared.get(address, 0xDEADBEEF)  # never written: poison

    def store(self, address: int, value: int) -> None:
        self._check(address)
        self.shared[address] = value & MASK

    def _check(self, address: int) -> None:
        if address % 4 or not 0 <= address < self.size:
            raise IndexError(f"shared address {address} outside [0, {self.size}) or unaligned")


def _collective(warp: list[int], arrived: dict[int, tuple], tid: int) -> int:
    """What lane ``tid`` gets from its warp's collective: ``match.any`` the lanes whose
    value equals its own, ``vote.ballot`` the lanes whose predicate holds, ``shfl.idx``
    the value of the lane it names."""
    kind, value = arrived[tid][:2]
    if kind == "match":
        return sum(1 << (u % 32) for u in warp if arrived[u][1] == value)
    if kind == "ballot":
        return sum(1 << (u % 32) for u in warp if arrived[u][1])
    source = warp[0] - warp[0] % 32 + arrived[tid][2]
    if source not in arrived:
        raise RuntimeError(f"shfl from lane {source % 32}, which is not in the warp")
    return arrived[source][1]


_BINARY = {
    "add.u32": lambda a, b: a + b,
    "sub.u32": lambda a, b: a - b,
    "mul.lo.u32": lambda a, b: a * b,
    "and.b32": lambda a, b: a & b,
    "or.b32": lambda a, b: a | b,
    "xor.b32": lambda a, b: a ^ b,
    "shl.b32": lambda a, b: a << b if b < 32 else 0,
    "shr.u32": lambda a, b: a >> b if b < 32 else 0,
}


class _Thread:
    def __init__(self, block: Block, program, labels, operands: list[int], outputs: int,
                 tid: int, threads: int) -> None:
        self.block = block
        self.tid = tid
        self.special = {"%tid.x": tid, "%ntid.x": threads,
                        "%lanemask_lt": (1 << (tid % 32)) - 1}
        self.program = program
        self.labels = labels
        self.operands = operands
        self.outputs = outputs
        self.registers: dict[str, int] = {}
        self.predicates: dict[str, bool] = {}

    def value(self, token: str) -> int:
        token = token.strip()
        if token.startswith("$"):
            return self.operands[int(token[1:])] & MASK
        if token in self.block.symbols:
            return self.block.symbols[token]
        if token in self.special:
            return self.special[token]
        if re.fullmatch(r"-?(0x[0-9a-fA-F]+|\d+)", token):
            return int(token, 0) & MASK
        return self.registers[token]

    def set(self, token: str, value: int) -> None:
        token = token.strip()
        if token.startswith("$"):
            index = int(token[1:])
            if index >= self.outputs:
                raise ValueError(f"{token} is an input")
            self.operands[index] = value & MASK
        else:
            self.registers[token] = value & MASK

    def address(self, token: str) -> int:
        inner = token.strip()[1:-1]
        base, _, offset = inner.partition("+")
        return (self.value(base) + (int(offset) if offset else 0)) & MASK

    def steps(self):
        pc = 0
        program = self.program
        while pc < len(program):
            guard, opcode, ops = program[pc]
            pc += 1
            if guard is not None:
                name = guard[1:].lstrip("!")
                if self.predicates[name] == guard.startswith("@!"):
                    continue
            parts = opcode.split(".")
            if opcode == "bar.sync":
                yield "barrier"
            elif opcode == "match.any.sync.b32":  # every lane of the warp, at once
                self._full_mask(ops[2])
                self.set(ops[0], (yield ("match", self.value(ops[1]))))
            elif opcode == "vote.sync.ballot.b32":
                self._full_mask(ops[2])
                self.set(ops[0], (yield ("ballot", self.predicates[ops[1]])))
            elif opcode == "shfl.sync.idx.b32":  # shfl.sync.idx d, a, lane, 0x1f, mask
                self._full_mask(ops[4])
                if self.value(ops[3]) != 0x1F:
                    raise NotImplementedError("shfl.idx within sub-warp segments")
                self.set(ops[0], (yield ("shfl", self.value(ops[1]), self.value(ops[2]) % 32)))
            elif opcode == "popc.b32":
                self.set(ops[0], bin(self.value(ops[1])).count("1"))
            elif opcode == "bra":
                pc = self.labels[ops[0]]
            elif opcode in ("mov.u32", "mov.b32"):
                self.set(ops[0], self.value(ops[1]))
            elif opcode == "mad.lo.u32":
                self.set(ops[0], self.value(ops[1]) * self.value(ops[2]) + self.value(ops[3]))
            elif opcode in _BINARY:
                self.set(ops[0], _BINARY[opcode](self.value(ops[1]), self.value(ops[2])))
            elif opcode == "not.b32":
                self.set(ops[0], ~self.value(ops[1]))
            elif opcode == "clz.b32":
                self.set(ops[0], 32 - self.value(ops[1]).bit_length())
            elif opcode == "selp.b32":
                self.set(ops[0], self.value(ops[1] if self.predicates[ops[3]] else ops[2]))
            elif parts[0] == "setp" and (parts[-1] == "u32" or parts[1] in ("eq", "ne")):
                a, b = self.value(ops[1]), self.value(ops[2])
                result = {"eq": a == b, "ne": a != b, "ge": a >= b, "gt": a > b,
                          "lt": a < b, "le": a <= b}[parts[1]]
                if len(parts) == 4:  # setp.cmp.bool.type p, a, b, c
                    other = self.predicates[ops[3]]
                    result = result and other if parts[2] == "and" else result or other
                self.predicates[ops[0]] = result
            elif opcode == "st.shared.u32":
                self.block.store(self.address(ops[0]), self.value(ops[1]))
            elif opcode == "ld.shared.u32":
                self.set(ops[0], self.block.load(self.address(ops[1])))
            elif opcode == "red.shared.add.u32":
                address = self.address(ops[0])
                self.block.store(address, self.block.load(address) + self.value(ops[1]))
            elif opcode == "atom.shared.add.u32":
                address = self.address(ops[1])
                old = self.block.load(address)
                self.block.store(address, old + self.value(ops[2]))
                self.set(ops[0], old)
            elif opcode == "mad.wide.u32":  # (a 64-bit result: global addresses)
                self.registers[ops[0]] = (self.value(ops[1]) * self.value(ops[2])
                                          + self.value(ops[3]))
            elif opcode == "atom.global.relaxed.gpu.add.u32":
                address = self.address(ops[1])
                old = self.block.load_global(address)
                self.block.store_global(address, old + self.value(ops[2]))
                self.set(ops[0], old)
            elif opcode == "st.global.b32":
                self.block.store_global(self.address(ops[0]), self.value(ops[1]))
            elif opcode == "st.global.v2.b32":  # st [a], {lo, hi}: two words from a
                address = self.address(ops[0])
                for i, word in enumerate(ops[1].strip()[1:-1].split(",")):
                    self.block.store_global(address + 4 * i, self.value(word))
            else:
                raise NotImplementedError(f"PTX {opcode}")

    def _full_mask(self, token: str) -> None:
        if self.value(token) != MASK:
            raise NotImplementedError("warp collectives over part of a warp")


# ----------------------------------------------------------------- element-wise statements
# The kernels' other inline PTX is element-wise: register arithmetic, conversions and
# ``prmt``/``lop3``, no memory and no branches. ``Lanes`` runs such a statement on every
# element of numpy arrays at once (each array a ``$`` operand's 32-bit register, one
# element a lane), so that whole input ranges can be checked against the contract.

def _u32(x) -> np.ndarray:
    return np.asarray(x, dtype=np.int64).astype(np.uint32)


def _f32(bits: np.ndarray) -> np.ndarray:
    return bits.astype(np.uint32).view(np.float32)


def _round_exact(s: np.ndarray, err: np.ndarray, mantissa_bits: int, min_exponent: int
                 ) -> np.ndarray:
    """float64 ``s + err`` (exactly: ``err`` is the rounding error of ``s``, from a
    two-sum) rounded to nearest even in a binary format of ``mantissa_bits`` stored bits
    whose normal numbers start at ``2**min_exponent`` (subnormals below), as float64. No
    overflow: the callers' values lie in range."""
    negative = np.signbit(s)
    a = np.abs(s)
    e = np.where(negative, -err, err)  # the exact value is a + e
    _, exponent = np.frexp(a)  # a in [2**(exponent - 1), 2**exponent)
    quantum = np.ldexp(1.0, np.maximum(exponent - 1, min_exponent) - mantissa_bits)
    n = a / quantum  # exact: a power of two
    whole = np.floor(n)
    frac = n - whole
    up = (frac > 0.5) | ((frac == 0.5) & ((e > 0) | ((e == 0) & (whole % 2 == 1))))
    r = (whole + up) * quantum
    return np.where(negative, -r, r)


def _two_sum(p: np.ndarray, c: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    s = p + c
    pb = s - c
    return s, (p - pb) + (c - (s - pb))


def _fma(a: np.ndarray, b: np.ndarray, c: np.ndarray, mantissa_bits: int) -> np.ndarray:
    """a * b + c rounded once (float64 operands of at most 24 significant bits: their
    product is exact in float64)."""
    with np.errstate(invalid="ignore"):  # (inf * 0 is NaN, as in PTX)
        s, err = _two_sum(a * b, c)
        return _round_exact(s, err, mantissa_bits, -126)


def _to_bf16_bits(x64: np.ndarray) -> np.ndarray:
    """float64 values that bf16 holds -> their 16 bits (in a uint32)."""
    return x64.astype(np.float32).view(np.uint32) >> 16


def _bf16_halves(bits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    lo = ((bits & 0xFFFF) << 16).view(np.float32).astype(np.float64)
    hi = (bits & 0xFFFF0000).view(np.float32).astype(np.float64)
    return lo, hi


def _rn_bf16_bits(x: np.ndarray) -> np.ndarray:
    """``cvt.rn.bf16.f32``: float32 -> the bits of the nearest bf16 (ties to even; NaN ->
    the canonical 0x7FFF)."""
    x64 = x.astype(np.float64)
    bits = _to_bf16_bits(_round_exact(x64, np.zeros_like(x64), 7, -126))
    return np.where(np.isnan(x), np.uint32(0x7FFF), bits)


def _rn_satfinite_e4m3(x: np.ndarray) -> np.ndarray:
    """``cvt.rn.satfinite.e4m3.f32``: float32 -> e4m3fn byte, ties to even, beyond 448
    clamped to +-448, NaN -> 0x7F."""
    x64 = x.astype(np.float64)
    r = np.clip(_round_exact(x64, np.zeros_like(x64), 3, -6), -448.0, 448.0)
    a = np.abs(r)
    _, exponent = np.frexp(a)
    normal = a >= 2.0**-6
    field = np.where(normal, exponent - 1 + 7, 0)  # biased exponent
    mantissa = np.where(normal, a / np.ldexp(1.0, exponent - 1) * 8 - 8, a * 512)
    code = (field.astype(np.int64) << 3) | mantissa.astype(np.int64)
    code = code | (np.signbit(r).astype(np.int64) << 7)
    return np.where(np.isnan(x), 0x7F, code).astype(np.uint32)


def _prmt(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    """``prmt.b32`` in its default mode: output byte i is byte ``c[4i:4i+3]`` of {b, a}
    (a's bytes 0-3, b's 4-7), or that byte's top bit spread over it when ``c[4i+3]``."""
    pool = (a.astype(np.uint64) | (b.astype(np.uint64) << 32))
    out = np.zeros_like(a, dtype=np.uint32)
    for i in range(4):
        selector = (c >> (4 * i)) & 0xF
        byte = ((pool >> ((selector & 7).astype(np.uint64) * 8)) & 0xFF).astype(np.uint32)
        byte = np.where(selector & 8, np.where(byte & 0x80, 0xFF, 0), byte).astype(np.uint32)
        out |= byte << (8 * i)
    return out


def _lop3(a: np.ndarray, b: np.ndarray, c: np.ndarray, table: int) -> np.ndarray:
    """``lop3.b32``: each result bit is bit ``4 a + 2 b + c`` of ``table`` (a = 0xF0, b =
    0xCC, c = 0xAA)."""
    out = np.zeros_like(a, dtype=np.uint32)
    for index in range(8):
        if table >> index & 1:
            out |= ((a if index & 4 else ~a) & (b if index & 2 else ~b)
                    & (c if index & 1 else ~c))
    return out


def _shift(a: np.ndarray, b: np.ndarray, left: bool) -> np.ndarray:
    """Logical shifts; by 32 or more, 0 (as in PTX)."""
    b = b.astype(np.uint32)
    shifted = (a << (b & 31)) if left else (a >> (b & 31))
    return np.where(b >= 32, np.uint32(0), shifted).astype(np.uint32)


def _canonical_nan(bits: np.ndarray, nan: int = 0x7FFFFFFF) -> np.ndarray:
    """float32 results whose NaNs are PTX's canonical one (numpy keeps payloads)."""
    return np.where(np.isnan(_f32(bits)), np.uint32(nan), bits).astype(np.uint32)


def _max_f32(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``max.f32``: a NaN operand ignored (both NaN: the canonical NaN), +0 above -0."""
    result = np.fmax(_f32(a), _f32(b)).view(np.uint32)
    zeros = ((a | b) & 0x7FFFFFFF) == 0
    return _canonical_nan(np.where(zeros, a & b, result))


def _max_xorsign_abs(a: np.ndarray, b: np.ndarray, nan: bool = False) -> np.ndarray:
    """``max{.NaN}.xorsign.abs.f32``: max(|a|, |b|) with the sign of a times that of b; a
    NaN operand is ignored (both NaN: the canonical NaN), or with ``.NaN`` makes the
    result the canonical NaN."""
    a_nan, b_nan = np.isnan(_f32(a)), np.isnan(_f32(b))
    magnitude = np.fmax(_f32(a & 0x7FFFFFFF), _f32(b & 0x7FFFFFFF)).view(np.uint32)
    result = magnitude | ((a ^ b) & 0x80000000)
    return np.where((a_nan | b_nan) if nan else (a_nan & b_nan), np.uint32(0x7FFFFFFF), result)


def _fma_bf16x2(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    """``fma.rn.bf16x2``: each half's a * b + c rounded once to bf16."""
    (a_lo, a_hi), (b_lo, b_hi), (c_lo, c_hi) = (_bf16_halves(x) for x in (a, b, c))
    hi, lo = (_canonical_nan(_to_bf16_bits(_fma(x, y, z, 7)) << 16) >> 16
              for x, y, z in ((a_hi, b_hi, c_hi), (a_lo, b_lo, c_lo)))
    return (hi << 16) | lo  # (a NaN half: the canonical 0x7FFF)


_LANE_OPS = {
    "and.b32": lambda a, b: a & b,
    "or.b32": lambda a, b: a | b,
    "xor.b32": lambda a, b: a ^ b,
    "add.s32": lambda a, b: a + b,
    "add.u32": lambda a, b: a + b,
    "sub.s32": lambda a, b: a - b,
    "sub.u32": lambda a, b: a - b,
    "shl.b32": lambda a, b: _shift(a, b, True),
    "shr.b32": lambda a, b: _shift(a, b, False),
    "shr.u32": lambda a, b: _shift(a, b, False),
    "mad.lo.s32": lambda a, b, c: a * b + c,
    "mad.lo.u32": lambda a, b, c: a * b + c,
    "mov.b32": lambda a: a,
    "abs.f32": lambda a: a & 0x7FFFFFFF,
    "max.f32": _max_f32,
    "max.xorsign.abs.f32": _max_xorsign_abs,
    "max.NaN.xorsign.abs.f32": lambda a, b: _max_xorsign_abs(a, b, nan=True),
    "fma.rn.f32": lambda a, b, c: _canonical_nan(
        _fma(*(_f32(x).astype(np.float64) for x in (a, b, c)), 23).astype(np.float32)
        .view(np.uint32)),
    "fma.rn.bf16x2": _fma_bf16x2,
    "cvt.rn.bf16x2.f32": lambda a, b: (_rn_bf16_bits(_f32(a)) << 16) | _rn_bf16_bits(_f32(b)),
    "cvt.rn.satfinite.e4m3x2.f32": lambda a, b: (_rn_satfinite_e4m3(_f32(a)) << 8)
    | _rn_satfinite_e4m3(_f32(b)),
    "prmt.b32": _prmt,
    "lop3.b32": _lop3,  # (run() passes its table, the last operand, as a number)
}


class Lanes:
    """An element-wise PTX statement, parsed once, run on arrays of lanes.

    It knows only what those statements use: ``and``/``or``/``xor``, ``add``/``sub``,
    ``mad.lo``, logical ``shl``/``shr``, ``mov.b32`` (also ``{lo, hi}`` from two 16-bit
    registers), ``prmt.b32`` (default mode), ``lop3.b32``, ``abs``/``max``/
    ``max{.NaN}.xorsign.abs``/``fma.rn`` of ``.f32``, ``fma.rn.bf16x2``, ``cvt.rn.bf16x2.f32``
    and ``cvt.rn.satfinite.e4m3x2.f32`` (the first source in the high half), with hex,
    decimal and ``0f`` float immediates. Conversions and fused multiply-adds round once,
    to nearest even, computed exactly here (not through another conversion)."""

    def __init__(self, text: str) -> None:
        self.program, labels = Block()._parse(text)
        if labels or any(guard is not None for guard, _, _ in self.program):
            raise NotImplementedError("branches and predicates: use Block")
        for _, opcode, _ in self.program:
            if opcode not in _LANE_OPS:
                raise NotImplementedError(f"PTX {opcode}")

    def run(self, inputs: list, outputs: int) -> list[np.ndarray]:
        """``inputs``: the input operands' 32-bit registers in order (``$outputs`` on), each
        an array of lanes (or a number for all); returns the ``outputs`` results."""
        shape = np.broadcast_shapes(*(np.shape(x) for x in inputs))
        operands = [None] * outputs + [np.broadcast_to(_u32(x), shape) for x in inputs]
        registers: dict[str, np.ndarray] = {}

        def value(token: str) -> np.ndarray:
            if token.startswith("{"):  # {lo, hi}: two 16-bit registers into one
                lo, hi = (value(t.strip()) for t in token[1:-1].split(","))
                return (lo & 0xFFFF) | (hi << 16)
            if token.startswith("$"):
                x = operands[int(token[1:])]
                if x is None:
                    raise ValueError(f"{token} read before it is written")
                return x
            if token.startswith("0f"):
                return np.full(shape, int(token[2:], 16), dtype=np.uint32)
            if re.fullmatch(r"-?(0x[0-9a-fA-F]+|\d+)", token):
                return np.full(shape, int(token, 0) & MASK, dtype=np.uint32)
            return registers[token]

        for _, opcode, ops in self.program:
            if opcode == "lop3.b32":  # (its last operand is the table, not a register)
                result = _lop3(*[value(t) for t in ops[1:4]], int(ops[4], 0))
            else:
                result = _LANE_OPS[opcode](*[value(t) for t in ops[1:]])
            result = np.asarray(result).astype(np.uint32)
            if ops[0].startswith("$"):
                index = int(ops[0][1:])
                if index >= outputs:
                    raise ValueError(f"{ops[0]} is an input")
                operands[index] = result
            else:
                registers[ops[0]] = result
        if any(x is None for x in operands[:outputs]):
            raise ValueError("an output the statement never writes")
        return operands[:outputs]
