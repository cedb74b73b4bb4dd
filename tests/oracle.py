"""An independent, deliberately naive implementation of the contract, token by token.

It shares no code with the package: numpy scalars, brute-force nearest-code search for
the quantizers, ``math.log2`` for the exponents and the page offsets typed again from
the contract (aiter's MXFP4 page order from its description: runs of ``n`` tokens, each
storing ``[chunk of d bytes, token, byte]`` and ``[scale % lanes, token, scale // lanes]``).
Keys in float32 or float16 are rounded to bf16 first; a key with a value that is not
finite after the norm and the rotation is stored as zero codes with NaN scales. Slow;
meant for small cases.
"""

from __future__ import annotations

import math

import numpy as np

F32 = np.float32
E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]


def bf16_round(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float32)
    bits = x.view(np.uint32).astype(np.uint64)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return np.where(np.isnan(x), x, bits.astype(np.uint32).view(np.float32))


def _e4m3_table() -> list[tuple[float, int]]:
    table = []
    for code in range(0x7F):  # 0x7F is NaN
        exponent, mantissa = code >> 3, code & 7
        value = mantissa * 2.0**-9 if exponent == 0 else (1 + mantissa / 8) * 2.0 ** (exponent - 7)
        table.append((value, code))
    return table


E4M3 = _e4m3_table()


def e4m3_code(v: float) -> int:
    a = abs(v)
    best = min(E4M3, key=lambda vc: (abs(vc[0] - a), vc[1] & 1))  # nearest, ties to even
    # The sign of a zero code carries no meaning; follow the sign bit, as the package does.
    return best[1] | (0x80 if math.copysign(1.0, v) < 0 else 0)


def e2m1_code(v: float) -> int:
    a = abs(v)
    idx = min(range(8), key=lambda i: (abs(E2M1[i] - a), i & 1))
    return idx | (8 if math.copysign(1.0, v) < 0 else 0)


def key_of_token(k_row, cos_sin_row, weight, eps) -> np.ndarray:
    k = bf16_round(np.asarray(k_row, dtype=np.float32))
    sq = k * k
    while sq.size > 1:
        sq = sq[0::2] + sq[1::2]
    ms = F32(sq[0] * F32(1.0 / 128))
    denom = F32(math.sqrt(float(F32(ms + F32(eps)))))
    inv = F32(1.0 / float(denom))
    y = bf16_round((k * inv) * np.asarray(weight, dtype=np.float32))
    cs = np.asarray(cos_sin_row, dtype=np.float32)
    out = y.copy()
    for j in range(32):
        x0, y0, c, s = y[64 + 2 * j], y[65 + 2 * j], cs[j], cs[32 + j]
        out[64 + 2 * j] = bf16_round(F32(F32(x0 * c) - F32(y0 * s)))
        out[65 + 2 * j] = bf16_round(F32(F32(y0 * c) + F32(x0 * s)))
    return out


def quantize_fp8(key: np.ndarray, mx_scales: bool) -> tuple[list[int], list[int]]:
    amax = max(float(np.max(np.abs(key))), float(F32(1e-4)))
    e = math.ceil(math.log2(float(F32(F32(amax) / F32(448.0)))))
    codes = [e4m3_code(max(-448.0, min(448.0, float(v) * 2.0**-e))) for v in key]
    if mx_scales:
        return codes, [e + 127] * 4
    return codes, list(np.array([2.0**e], dtype="<f4").view(np.uint8))


def quantize_mxfp4(key: np.ndarray) -> tuple[list[int], list[int]]:
    codes, scales = [], []
    for g in range(4):
        block = key[32 * g : 32 * g + 32]
        amax = max(float(np.max(np.abs(block))), 6 * 2.0**-126)
        e = max(-127, min(127, math.ceil(math.log2(float(F32(F32(amax) / F32(6.0)))))))
        scales.append(e + 127)
        codes += [e2m1_code(float(v) * 2.0**-e) for v in block]
    packed = [codes[2 * b] | (codes[2 * b + 1] << 4) for b in range(64)]
    return packed, scales


def offsets(p: int, block_size: int, fp4: bool, shuffle: bool, n: int, d_chunk: int = 16,
            lanes: int | None = None):
    vb = 64 if fp4 else 128
    if not shuffle or block_size == 1:
        vals = [p * vb + d for d in range(vb)]
        scs = [block_size * vb + 4 * p + i for i in range(4)]
    elif not fp4:
        vals = [(p // 16) * 16 * vb + (d // 16) * 256 + (p % 16) * 16 + d % 16 for d in range(vb)]
        scs = [block_size * vb + 4 * p + i for i in range(4)]
    else:
        # Run g of n tokens holds n * 64 value bytes as [chunk][token][byte in chunk], then
        # (in the scale region) n * 4 scale bytes as [i % lanes][token][i // lanes].
        lanes = 64 // n if lanes is None else lanes
        g, t = p // n, p % n
        per_lane = 4 // lanes
        vals = [g * n * 64 + (d // d_chunk) * (n * d_chunk) + t * d_chunk + d % d_chunk
                for d in range(64)]
        scs = [block_size * 64 + g * n * 4 + (i % lanes) * (n * per_lane) + t * per_lane + i // lanes
               for i in range(4)]
    return vals, scs


def poisoned_bytes(fp4: bool, mx_scales: bool) -> tuple[list[int], list[int]]:
    """A key with a NaN or an infinity: zero codes, NaN scales."""
    if fp4 or mx_scales:
        scales = [0xFF] * 4  # the UE8M0 NaN
    else:
        scales = list(np.array([0x7FC00000], dtype="<u4").view(np.uint8))  # the fp32 NaN
    return [0] * (64 if fp4 else 128), scales


def store(pages: np.ndarray, page_stride: int, block_size: int, k_pre, positions, cos_sin, weight,
          eps, slots, compress_ratio, fp4, mx_scales=False, shuffle=False, n=0, d_chunk=16,
          lanes=None) -> None:
    """Write into ``pages``, a flat uint8 numpy array of all page bytes."""
    num_blocks = (pages.size + page_stride - 1) // page_stride
    for t in range(len(slots)):
        s, pos = int(slots[t]), int(positions[t])
        gp = (pos // compress_ratio) * compress_ratio
        if s < 0 or s >= num_blocks * block_size or pos < 0 or (pos + 1) % compress_ratio:
            continue
        if gp >= len(cos_sin):
            continue
        with np.errstate(over="ignore", invalid="ignore"):
            key = key_of_token(k_pre[t], cos_sin[gp], weight, eps)
        if not np.isfinite(key).all():
            vals, scs = poisoned_bytes(fp4, mx_scales)
        else:
            vals, scs = quantize_mxfp4(key) if fp4 else quantize_fp8(key, mx_scales)
        val_at, sc_at = offsets(s % block_size, block_size, fp4, shuffle, n, d_chunk, lanes)
        base = (s // block_size) * page_stride
        for o, b in zip(val_at, vals, strict=True):
            pages[base + o] = b
        for o, b in zip(sc_at, scs, strict=True):
            pages[base + o] = b
