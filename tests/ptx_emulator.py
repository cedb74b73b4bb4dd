"""Runs the top-k's shared-memory PTX statements (the select kernel's slots, the sample's
threshold) on the CPU, thread by thread, so that their text (not a rewrite of it) is
checked where no GPU is. Passing here is necessary, not sufficient: a statement that
passed here once failed on the GPU (BENCHMARKS.md, "Counting, ranking and sampling in
shared memory").

It knows only the instructions those statements use: 32-bit ``mov`` (also of
``%tid.x``, ``%ntid.x``), ``add``, ``sub``, ``mul.lo``, ``mad.lo``, ``and``, ``or``,
``xor``, ``not``, ``shl``, ``shr`` (shifts past 31 give 0, as in PTX), ``clz``, unsigned
``setp`` (with ``.and``/``.or``), ``selp``, ``ld``/``st``/``red``/``atom.shared`` (32-bit), ``popc``,
``match.any.sync`` (over each 32 threads, ``%lanemask_lt``), ``bra``, labels, predicates
(``@p``, ``@!p``) and ``bar.sync``;
``.reg`` and ``.shared`` declarations. A CTA's threads run one at a time in a
random order, each up to its next barrier (where it waits for the whole block) or
warp-wide match (where it waits for its warp): any such order is one the GPU may take,
and a missing barrier shows as a warp running ahead into memory another still uses.
"""

from __future__ import annotations

import random
import re

MASK = 0xFFFFFFFF


class Block:
    """One CTA: its shared memory (the statements' arrays, from address 0) and the
    statements run on its threads one after another, as a kernel runs them."""

    def __init__(self, seed: int = 0) -> None:
        self.shared: dict[int, int] = {}  # 32-bit words by byte address
        self.symbols: dict[str, int] = {}  # function-scope names: arrays' addresses, ...
        self.size = 0
        self.rng = random.Random(seed)

    def _parse(self, text: str):
        program, labels, depth = [], {}, 0
        for raw in text.splitlines():
            line = raw.strip().rstrip(";").strip()
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
                at_match[tid] = stop[1]
                warp = [t for t in steps if t // 32 == tid // 32]
                if all(t in at_match for t in warp):  # match.any.sync over the warp's lanes
                    for t in warp:
                        sent[t] = sum(1 << (u % 32) for u in warp if at_match[u] == at_match[t])
                    for t in warp:
                        del at_match[t]
                    runnable += warp
            if not runnable and at_barrier:
                if len(at_barrier) != len(steps):
                    raise RuntimeError("a barrier that not every thread reached")
                runnable, at_barrier = list(at_barrier), set()
        if at_match or len(ended) != len(steps):
            raise RuntimeError("a match that not every lane of a warp reached")
        return [thread.operands[:outputs] for thread in threads]

    def load(self, address: int) -> int:
        self._check(address)
        return self.shared.get(address, 0xDEADBEEF)  # never written: poison

    def store(self, address: int, value: int) -> None:
        self._check(address)
        self.shared[address] = value & MASK

    def _check(self, address: int) -> None:
        if address % 4 or not 0 <= address < self.size:
            raise IndexError(f"shared address {address} outside [0, {self.size}) or unaligned")


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
                self.set(ops[0], (yield ("match", self.value(ops[1]))))
            elif opcode == "popc.b32":
                self.set(ops[0], bin(self.value(ops[1])).count("1"))
            elif opcode == "bra":
                pc = self.labels[ops[0]]
            elif opcode == "mov.u32":
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
            elif parts[0] == "setp" and parts[-1] == "u32":
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
            else:
                raise NotImplementedError(f"PTX {opcode}")
