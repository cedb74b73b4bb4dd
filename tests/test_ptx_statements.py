"""The kernels' element-wise inline PTX, run on the CPU (``ptx_emulator.Lanes``) over whole
input ranges, against the contract's numbers.

On a GPU these statements replace the integer forms that the interpreter runs, so the CPU
tests of the kernels never execute them: here their text is executed as written. What this
cannot check is how Triton packs a tensor's elements into the registers (``pack``): the
tests take the packing the statements' comments state, which the GPU tests confirm.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from indexer_kcache import reference
from indexer_kcache.kernels import logits as kl
from indexer_kcache.kernels import numerics
from indexer_kcache.kernels import store as ks
from indexer_kcache.reference.cache import E2M1_VALUES

from .cases import scaled_e2m1_pairs, unscaled_e2m1_keys
from .ptx_emulator import Block, Lanes, _fma, _prmt, _round_exact

E2M1 = np.array(E2M1_VALUES)


def e2m1_values(codes: np.ndarray) -> np.ndarray:
    """E2M1 codes (sign << 3 | index) -> float64, -0.0 for code 8."""
    return np.where(codes & 8, -1.0, 1.0) * E2M1[codes & 7]


def e4m3_values(codes: np.ndarray) -> np.ndarray:
    return torch.from_numpy(codes.astype(np.uint8)).view(torch.float8_e4m3fn).double().numpy()


def bf16_values(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << 16).view(np.float32).astype(np.float64)


def byte(words: np.ndarray, i: int) -> np.ndarray:
    return (words >> (8 * i)) & 0xFF


def same_values(got: np.ndarray, want: np.ndarray) -> bool:
    """Equal values, the sign of zero included."""
    return bool(np.array_equal(got, want) and np.array_equal(np.signbit(got), np.signbit(want)))


@pytest.fixture
def rng() -> np.random.Generator:
    """Fresh random inputs each run; the seed is printed (pytest shows it on a failure)."""
    seed = np.random.SeedSequence().entropy
    print(f"numpy seed {seed}")
    return np.random.default_rng(seed)


def torch_generator(rng: np.random.Generator) -> torch.Generator:
    """A torch generator seeded from ``rng`` (for the shared input builders of ``cases``)."""
    return torch.Generator().manual_seed(int(rng.integers(2**62)))


def float_bits(x: torch.Tensor) -> np.ndarray:
    """float32 values -> their bits, one lane each."""
    return x.numpy().view(np.uint32)


def random_words(n: int, rng: np.random.Generator) -> np.ndarray:
    """``n`` random 32-bit words, then every byte value in every byte of a word."""
    every = np.arange(256, dtype=np.uint32)
    spread = np.concatenate([every << (8 * i) for i in range(4)] + [every * 0x01010101])
    return np.concatenate([rng.integers(0, 2**32, n, dtype=np.uint64).astype(np.uint32), spread])


# ------------------------------------------------------------------- the emulator itself
def test_emulator_rounds_once_to_nearest_even():
    """Its fused multiply-add and conversions round the exact value once: a tie broken by
    the bits below float64's last one, and a float64 sum that is a float32 tie only after
    float64 rounding, both go the right way."""
    one = np.array([1.0])
    # 1 + 2**-24 is a float32 tie between 1 and 1 + 2**-23: to the even one, 1; and
    # 1 + 3 * 2**-24 to 1 + 2**-22.
    assert _fma(one, one, np.array([2.0**-24]), 23)[0] == 1.0
    assert _fma(one, np.array([1 + 2.0**-23]), np.array([2.0**-24]), 23)[0] == 1 + 2.0**-22
    # 2**-24 + 2**-80 rounds to the tie 1 + 2**-24 in float64, but lies above it.
    assert _fma(np.array([2.0**-40]), np.array([2.0**-40]), 1 + np.array([2.0**-24]), 23)[0] \
        == 1 + 2.0**-23
    assert _round_exact(1 + np.array([2.0**-24]), np.array([-2.0**-80]), 23, -126)[0] == 1.0
    # float32 subnormals: multiples of 2**-149, ties to even.
    assert _round_exact(np.array([1.5 * 2.0**-149]), np.zeros(1), 23, -126)[0] == 2.0**-148
    assert _round_exact(np.array([2.5 * 2.0**-149]), np.zeros(1), 23, -126)[0] == 2.0**-148


def test_emulator_prmt_selects_and_spreads_signs():
    a, b = np.array([0x33221100], np.uint32), np.array([0xF7E6D5C4], np.uint32)
    assert _prmt(a, b, np.array([0x7531], np.uint32))[0] == 0xF7D53311
    assert _prmt(a, b, np.array([0x0F4C], np.uint32))[0] == 0x00FFC4FF  # msb of 0xC4, 0xF7


# ------------------------------------------------------------------- the store's encode
def test_e4m3_four_a_conversion_rounds_to_nearest_even(rng):
    """``_E4M3_X4_PTX``: four floats (one a register) -> four e4m3 bytes, element i in byte
    i: every e4m3 value, every tie between neighbours, random values, against torch."""
    grid = e4m3_values(np.arange(256))
    grid = np.sort(grid[np.isfinite(grid)])
    x = np.concatenate([grid, (grid[1:] + grid[:-1]) / 2,
                        rng.uniform(-448, 448, 4096), np.ldexp(rng.uniform(-1, 1, 4096), -7)])
    x = x[: x.size // 4 * 4].astype(np.float32)
    lanes = x.view(np.uint32).reshape(-1, 4)
    (got,) = Lanes(numerics._E4M3_X4_PTX.value).run([lanes[:, i] for i in range(4)], 1)
    want = torch.from_numpy(x).to(torch.float8_e4m3fn).view(torch.uint8).numpy().reshape(-1, 4)
    for i in range(4):
        zero = (want[:, i] & 0x7F) == 0
        assert np.array_equal(byte(got, i)[~zero], want[~zero, i])
        assert ((byte(got, i)[zero] & 0x7F) == 0).all()


def test_bf16_pair_rounding(rng):
    """``_BF16_PAIR_PTX``: two float32 -> each rounded to bf16 (as a float32), ties and
    random bits, against torch."""
    bits = rng.integers(0, 2**31 - 2**24, 8192).astype(np.uint32)
    ties = (bits & ~np.uint32(0xFFFF)) | 0x8000
    x = np.concatenate([bits, ties | 0x80000000])
    y = np.concatenate([ties, bits | 0x80000000])
    got_x, got_y = Lanes(numerics._BF16_PAIR_PTX.value).run([x, y], 2)
    for got, v in ((got_x, x), (got_y, y)):
        want = torch.from_numpy(v.view(np.float32)).to(torch.bfloat16).float().numpy()
        assert np.array_equal(got.view(np.float32), want)


def test_e2m1_pair_of_every_bf16_up_to_6(rng):
    """``_E2M1_PAIR_PTX``: two scaled values -> their E2M1 byte (x low nibble), over
    ``cases.scaled_e2m1_pairs``, against the reference's thresholds."""
    x, y = scaled_e2m1_pairs(torch_generator(rng))
    want = (reference.e2m1_codes(x) | (reference.e2m1_codes(y) << 4)).numpy()
    (got,) = Lanes(numerics._E2M1_PAIR_PTX.value).run([float_bits(x), float_bits(y)], 1)
    assert np.array_equal(got, want)


def test_e2m1_four_bytes_of_unscaled_keys(rng):
    """``_E2M1_X4_PTX``: four pairs of bf16 keys and their groups' 2**e (as bits) -> four
    E2M1 bytes of x / 2**e, y / 2**e, over ``cases.unscaled_e2m1_keys``, against the
    reference's thresholds."""
    x, y, e, want = unscaled_e2m1_keys(torch_generator(rng))
    n = x.numel() // 4 * 4
    scale = torch.exp2(e[:n].float())
    columns = [float_bits(a[:n]).reshape(-1, 4) for a in (x, y, scale)]
    (got,) = Lanes(numerics._E2M1_X4_PTX.value).run(
        [column[:, i] for column in columns for i in range(4)], 1)
    want = want[:n].numpy().reshape(-1, 4)
    for i in range(4):
        assert np.array_equal(byte(got, i), want[:, i])


def test_max_abs_keeping_sign_propagates_nan(rng):
    """``_MAX_ABS_KEEPING_SIGN_PTX`` (the store's group maximum with the sign of the pair's
    product): max(|x|, |y|) of finite and infinite values, and a NaN whichever operand
    holds it, so that a poisoned key's maximum reaches NaN's bits."""
    specials = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 2.0**-149, -6.0, 448.0],
                        dtype=np.float32)
    x = np.concatenate([rng.standard_normal(4096).astype(np.float32), np.repeat(specials, 8)])
    y = np.concatenate([rng.standard_normal(4096).astype(np.float32), np.tile(specials, 8)])
    (got,) = Lanes(ks._MAX_ABS_KEEPING_SIGN_PTX.value).run([x.view(np.uint32), y.view(np.uint32)], 1)
    nan = np.isnan(x) | np.isnan(y)
    assert ((got[nan] & 0x7FFFFFFF) > 0x7F800000).all()
    magnitude = np.maximum(np.abs(x), np.abs(y))
    want = np.where(np.signbit(x) ^ np.signbit(y), -magnitude, magnitude)
    assert same_values(got[~nan].view(np.float32), want[~nan])


# ------------------------------------------------------------------ the scorer's decode
def test_e2m1_to_e4m3_both_nibbles_of_four_bytes(rng):
    """``_E2M1_TO_E4M3_PTX``: four packed bytes -> e4m3 bytes of each code's value times
    2**-6, the low nibbles in ``$0``, the high ones in ``$1``."""
    words = random_words(4096, rng)
    low, high = Lanes(kl._E2M1_TO_E4M3_PTX.value).run([words], 2)
    for i in range(4):
        packed = byte(words, i)
        for got, codes in ((low, packed & 0xF), (high, packed >> 4)):
            assert same_values(e4m3_values(byte(got, i)), e2m1_values(codes) * 2.0**-6)


@pytest.mark.parametrize("k", range(1, kl.FP4_FOLD_SPAN + 1))
def test_fp4_word_with_every_group_table(k, rng):
    """``_FP4_WORD_PTX``: a word of eight E2M1 codes and its group's table
    (``_fp4_tables(k)``) -> eight e4m3 bytes of the codes' values times 2**(k - 6), in
    order, for every fold exponent the scorer uses."""
    words = random_words(2048, rng)
    t_lo, t_hi = (t & 0xFFFFFFFF for t in kl._fp4_tables.fn(k))
    low, high = Lanes(kl._FP4_WORD_PTX.value).run([words, t_lo, t_hi], 2)
    for i in range(8):
        got = byte(low if i < 4 else high, i % 4)
        want = e2m1_values((words >> (4 * i)) & 0xF) * 2.0 ** (k - 6)
        assert same_values(e4m3_values(got), want)


@pytest.mark.parametrize("x", [6, 5, 0, -1, -40, -90, -124, 1 - kl.BF16_FOLD_SPAN.value + 6])
def test_fp4_bf16_decode_with_every_table_range(x, rng):
    """``_BF16_TABLES_PTX`` then ``_FP4_BF16_PTX``: a group's tables for 2**x and a word
    of eight E2M1 codes -> four bf16 pairs, elements (0, 1) .. (6, 7), each the code's
    value times 2**x: across the exponents the bf16 fold reaches (down to the one whose
    0.5 is bf16's smallest normal)."""
    words = random_words(2048, rng)
    tables = Lanes(kl._BF16_TABLES_PTX.value).run([np.uint32((x << 7) & 0xFFFFFFFF)], 4)
    pairs = Lanes(kl._FP4_BF16_PTX.value).run([words, *tables], 4)
    for i in range(8):
        got = bf16_values((pairs[i // 2] >> (16 * (i % 2))) & 0xFFFF)
        want = e2m1_values((words >> (4 * i)) & 0xF) * 2.0**x
        assert same_values(got, want)


def test_f16_to_bf16_of_every_e4m3_pair():
    """``_F16_TO_BF16_PTX``: an f16 pair converted from e4m3 codes -> the bf16 pair of the
    same values (zeros' signs included), every finite e4m3 code in each half."""
    codes = np.arange(256)
    codes = codes[(codes & 0x7F) != 0x7F]
    f16 = torch.from_numpy(e4m3_values(codes)).half().view(torch.int16).numpy().astype(np.uint32)
    f16 &= 0xFFFF
    lo, hi = np.meshgrid(f16, f16)
    (got,) = Lanes(kl._F16_TO_BF16_PTX.value).run([(lo | (hi << 16)).ravel()], 1)
    values = e4m3_values(codes)
    want_lo, want_hi = (v.ravel() for v in np.meshgrid(values, values))
    assert same_values(bf16_values(got & 0xFFFF), want_lo)
    assert same_values(bf16_values(got >> 16), want_hi)


def test_logits_stored_in_place_only_where_the_mask_says():
    """``_STORE_PTX`` (the one-row programs' logits stored from the dot's layout): a
    thread's float32 lands at its address where its mask is set, and nothing else is
    written; two threads hold each position (the same bits), as a quad's do."""
    emulated = Block()
    poison = 0xDEADBEEF
    positions = 48
    out = emulated.allocate_global(positions, fill=poison)
    g = np.random.default_rng()
    values = g.standard_normal(positions).astype(np.float32).view(np.uint32)
    mask = g.random(positions) < 0.5
    threads = [[0, out + 4 * (t // 2), int(values[t // 2]), int(mask[t // 2])]
               for t in range(2 * positions)]
    results = emulated.run(kl._STORE_PTX.value, threads, outputs=1)
    assert all(r == [0] for r in results)
    for p in range(positions):
        assert emulated.load_global(out + 4 * p) == (int(values[p]) if mask[p] else poison)


# The statements each test above (or test_topk's emulated-block tests) runs; the L2
# prefetch hint alone is left out: it has no result and writes nothing.
EMULATED = {"_E4M3_X4_PTX", "_BF16_PAIR_PTX", "_E2M1_PAIR_PTX", "_E2M1_X4_PTX",
            "_MAX_ABS_KEEPING_SIGN_PTX", "_E2M1_TO_E4M3_PTX", "_FP4_WORD_PTX",
            "_BF16_TABLES_PTX", "_FP4_BF16_PTX", "_F16_TO_BF16_PTX", "_STORE_PTX",
            "_WARP_APPEND_PTX", "_shared_slots_ptx", "_shared_threshold_ptx"}
NOT_EMULATED = {"_PREFETCH_L2_PTX"}


def test_every_inline_ptx_statement_is_emulated():
    """A new inline PTX statement in a kernel comes with a CPU test of its text here."""
    import pathlib
    import re

    kernels = pathlib.Path(kl.__file__).parent
    used = set()
    for source in kernels.glob("*.py"):
        for call in re.findall(r"inline_asm_elementwise\(\s*([^,]+),", source.read_text()):
            used.add(re.match(r"\s*(\w+)", call).group(1))
    assert used == EMULATED | NOT_EMULATED
