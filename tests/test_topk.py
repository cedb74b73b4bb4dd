"""Top-k selection: the Triton kernels equal the reference exactly, and both equal a
stable sort written here in plain Python, on every kind of row."""

from __future__ import annotations

import contextlib
import dataclasses
import math

import pytest
import torch

from indexer_kcache import topk
from indexer_kcache.kernels import topk as topk_kernels
from indexer_kcache.reference import topk as reference

from .cases import DEVICE
from .ptx_emulator import Block

SENTINEL = 0x5A5A5A5A  # out's padding columns must keep it
SEED = torch.seed() % 2**31  # fresh inputs every run; failures print the seed
NAN, INF = float("nan"), float("inf")
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


# ----------------------------------------------------------------------------- the oracle
def oracle(logits: torch.Tensor, k: int, lengths: torch.Tensor | None = None) -> torch.Tensor:
    """Python's stable ``sorted`` on (is NaN, -value, column) over each row's eligible
    columns: an independent statement of the ranking rule."""
    values = logits.float().cpu().tolist()
    result = []
    for r, row in enumerate(values):
        n = len(row) if lengths is None else max(0, min(int(lengths[r]), len(row)))

        def rank(c, row=row):
            v = row[c]
            return (1, 0.0, c) if math.isnan(v) else (0, -v, c)  # -(-0.0) == -(+0.0)

        top = sorted(range(n), key=rank)[:k]
        result.append(top + [-1] * (k - len(top)))
    return torch.tensor(result, dtype=torch.int32).reshape(len(values), k)


# ----------------------------------------------------------------------------- inputs
def random_values(kind: str, rows: int, cols: int, g: torch.Generator) -> torch.Tensor:
    """float32 [rows, cols] of one distribution (CPU)."""
    if kind == "normal":
        return torch.randn(rows, cols, generator=g)
    if kind == "few-distinct":  # long runs of ties
        return torch.randint(-2, 2, (rows, cols), generator=g).float() * 0.75
    if kind == "all-equal":
        return torch.full((rows, cols), float(torch.randn(1, generator=g)))
    if kind == "magnitudes":  # from denormals to near the float32 maximum, both signs
        exponent = torch.randint(-149, 127, (rows, cols), generator=g).double()
        sign = torch.randint(0, 2, (rows, cols), generator=g).double() * 2 - 1
        mantissa = 1 + torch.rand(rows, cols, generator=g, dtype=torch.float64)
        return (sign * mantissa * torch.exp2(exponent)).float()
    if kind == "specials":  # numbers with +-inf, NaN, -0.0 and +0.0 sprinkled in
        x = torch.randn(rows, cols, generator=g)
        which = torch.randint(0, 10, (rows, cols), generator=g)
        for code, value in ((0, INF), (1, -INF), (2, NAN), (3, -0.0), (4, 0.0)):
            x[which == code] = value
        return x
    if kind == "mostly-nan":  # fewer numbers than k: NaNs in column order fill the rest
        x = torch.full((rows, cols), NAN)
        few = torch.rand(rows, cols, generator=g) < 0.02
        x[few] = torch.randn(int(few.sum()), generator=g)
        x[:, -1] = -INF
        return x
    if kind == "signed-zeros":
        x = torch.where(torch.rand(rows, cols, generator=g) < 0.5, -0.0, 0.0)
        x[:, ::7] = -1.0
        return x
    raise ValueError(kind)


KINDS = ["normal", "few-distinct", "all-equal", "magnitudes", "specials", "mostly-nan",
         "signed-zeros"]


def generator(salt: int) -> torch.Generator:
    return torch.Generator().manual_seed(SEED + salt)


def make_logits(kind, rows, cols, dtype, row_stride=None, seed=0) -> torch.Tensor:
    """Logits on the test device; a view with a wider row stride when ``row_stride``."""
    g = generator(seed)
    values = random_values(kind, rows, cols, g).to(dtype)
    if row_stride is None:
        return values.to(DEVICE)
    store = torch.randn(rows, row_stride, generator=g).to(dtype)  # never read past cols
    store[:, :cols] = values
    return store.to(DEVICE)[:, :cols]


def random_lengths(rows, cols, g) -> torch.Tensor:
    """Lengths from below 0 to past cols, with 0 and cols among them."""
    lengths = torch.randint(-3, cols + 5, (rows,), generator=g, dtype=torch.int32)
    lengths[0] = 0
    if rows > 1:
        lengths[1] = cols
    return lengths.to(DEVICE)


def run(logits, k, lengths=None, settings=None, buffers=None) -> torch.Tensor:
    """The Triton path, optionally with explicit settings; ``buffers`` receives the work
    buffers (which path ran)."""
    out = torch.empty((logits.shape[0], k), dtype=torch.int32, device=logits.device)
    call = topk.top_k_indices_into.op.bind(logits, lengths, out, backend="triton")
    plan = topk.check_topk(call)
    with topk.topk_settings.override(settings) if settings else contextlib.nullcontext():
        topk.launch_topk(plan, call, buffers)
    return out


def check(logits, k, lengths=None, settings=None, buffers=None) -> None:
    want = oracle(logits, k, lengths)
    assert torch.equal(reference.top_k_indices(logits, k, lengths).cpu(), want), f"seed {SEED}"
    got = run(logits, k, lengths, settings, buffers)
    assert got.dtype == torch.int32 and got.shape == (logits.shape[0], k)
    assert torch.equal(got.cpu(), want), f"seed {SEED}"


def small_split_settings(k, cols, step=256, split_steps=4, **changes) -> topk.TopKSettings:
    """The long-row path at interpreter sizes: a small sample (so about 3.5 times k
    candidates) and filter programs of ``split_steps`` steps of ``step`` columns."""
    block = max(1 << max(min(k, cols) - 1, 0).bit_length(), 32)
    base = topk.TopKSettings(splits=-(-cols // (step * split_steps)), step=step, filter_warps=4,
                             sample_block=256, block=max(8 * block, 256), select_warps=4,
                             radix_bits=4, stream_block=512, chunk=64, split_steps=split_steps,
                             place_part=64)
    return base._replace(**changes)


def usable(buffers, settings, want) -> torch.Tensor:
    """Per row: whether the select kernel ranks the candidates (else the radix selection)."""
    counts = buffers["cand_count"].cpu()
    return (counts >= want) & (counts <= settings.block)


def sampled_columns(cols: int, settings: topk.TopKSettings) -> torch.Tensor:
    """Whether the sample kernel reads each column of a full row (bool [cols])."""
    stride = topk.sample_stride(cols, settings.sample_block)
    return torch.arange(cols, device=DEVICE) % stride < topk.SAMPLE_CHUNK


# Who counts the candidates into their buckets and places them: the select kernel (a
# program a row), or the count and place kernels (16 programs a row at these sizes).
PLACEMENTS = {"select-kernel": dict(place_part=0), "count-and-place": dict(place_part=64)}


def check_bucket_range(buffers, settings, placement, rows) -> None:
    """The rows' bucket range (meta[:, :2]) is the placement's own: from the largest
    candidate pair down to the smallest (select kernel), or from the largest candidate key
    with every column bit set down to the threshold's key (count kernel); the shift the
    smallest that maps the span below ``block``."""
    meta, count = buffers["meta"].cpu(), buffers["cand_count"].cpu()
    cand = buffers["cand"].cpu()
    threshold = buffers["threshold"].cpu().long() & 0xFFFFFFFF
    for row in range(rows):
        pairs = [int(x) & (2**64 - 1) for x in cand[row, :count[row]]]  # as unsigned
        if placement == "count-and-place":
            top = (max(pairs) >> 32) << 32 | 0xFFFFFFFF
            bottom = int(threshold[row]) << 32
        else:
            top, bottom = max(pairs), min(pairs)
        shift = next(s for s in range(65) if (top - bottom) >> s < settings.block)
        assert int(meta[row, 0]) & (2**64 - 1) == top, (row, placement)
        assert int(meta[row, 1]) == shift, (row, placement)


# ----------------------------------------------------------------------------- exactness
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", KINDS)
def test_short_rows_match_the_oracle(kind, dtype):
    salt = KINDS.index(kind) * 2 + (dtype == "bf16")
    logits = make_logits(kind, 5, 300, DTYPES[dtype], seed=salt)
    g = generator(salt)
    check(logits, 37, random_lengths(5, 300, g))


@pytest.mark.parametrize("kind", ["normal", "few-distinct", "specials"])
def test_without_lengths(kind):
    check(make_logits(kind, 3, 517, torch.float32, seed=3), 64)


@pytest.mark.parametrize("k", [1, 5, 64, 200, 300])
def test_k_up_to_and_past_cols(k):
    check(make_logits("few-distinct", 4, 200, torch.float32, seed=k), k)


def test_k_much_larger_than_cols():
    g = generator(1)
    check(make_logits("normal", 3, 20, torch.float32, seed=2), 100, random_lengths(3, 20, g))


def test_lengths_zero_and_negative_give_minus_one():
    logits = make_logits("normal", 3, 100, torch.float32)
    lengths = torch.tensor([0, -5, 1], dtype=torch.int32, device=DEVICE)
    got = run(logits, 4, lengths).cpu()
    assert got[:2].eq(-1).all() and got[2].tolist() == [0, -1, -1, -1]
    check(logits, 4, lengths)


def test_one_column():
    check(make_logits("normal", 3, 1, torch.float32), 3)


def test_ragged_lengths_from_context():
    context_lens = torch.tensor([1, 40, 300, 299], dtype=torch.int32, device=DEVICE)
    lengths = topk.lengths_from_context(context_lens, 2, 300)
    assert lengths.tolist() == [0, 1, 39, 40, 299, 300, 298, 299]
    check(make_logits("normal", 8, 300, torch.bfloat16, seed=7), 50, lengths)


@pytest.mark.parametrize("dtype", DTYPES)
def test_row_stride_and_out(dtype):
    """A strided view of wider rows, written into a strided out whose padding stays."""
    logits = make_logits("specials", 4, 250, DTYPES[dtype], row_stride=301, seed=5)
    k = 40
    store = torch.full((4, k + 9), SENTINEL, dtype=torch.int32, device=DEVICE)
    out = store[:, :k]
    result = topk.top_k_indices(logits, k, out=out, backend="triton")
    assert result.data_ptr() == out.data_ptr()
    assert torch.equal(out.cpu(), oracle(logits, k))
    assert store[:, k:].eq(SENTINEL).all()


@pytest.mark.parametrize("backend", ["reference", "triton"])
def test_out_with_reference_and_triton(backend):
    logits = make_logits("normal", 2, 100, torch.float32)
    out = torch.full((2, 8), SENTINEL, dtype=torch.int32, device=DEVICE)
    assert topk.top_k_indices(logits, 8, out=out, backend=backend) is out
    assert torch.equal(out.cpu(), oracle(logits, 8))


def test_rows_past_the_block_by_radix_selection():
    """A row wider than the select kernel's block: its top k found by radix selection
    streamed from the row, several steps of columns."""
    g = generator(4)
    logits = make_logits("few-distinct", 3, 1500, torch.float32, seed=4)
    settings = topk.TopKSettings(0, 0, 0, 0, block=128, select_warps=4, radix_bits=4,
                                 stream_block=512)
    check(logits, 100, random_lengths(3, 1500, g), settings)


@pytest.mark.parametrize("path", ["ranked-whole", "radix"])
@pytest.mark.parametrize("kind", ["few-distinct", "all-equal", "signed-zeros", "specials"])
def test_direct_rows_both_paths(kind, path):
    """A short row ranked whole in registers, or (a block narrower than the row) its top k
    by radix passes, then ranked."""
    g = generator(12)
    logits = make_logits(kind, 3, 700, torch.float32, seed=12)
    settings = topk.topk_settings(3, 700, 90)
    assert settings.splits == 0 and settings.block >= 700
    if path == "radix":
        settings = settings._replace(block=128, stream_block=256)
    check(logits, 90, random_lengths(3, 700, g), settings)


def test_ties_at_the_k_th_value():
    """The k-th value repeated across the row: the lowest columns of the tie come first."""
    logits = torch.randn(2, 1000, generator=generator(15))
    logits[:, 100::3] = 1.5  # the k-th largest is 1.5, shared by many columns
    logits[0, 999] = 1.5
    check(logits.to(DEVICE), 64)


@pytest.mark.parametrize("radix_bits", [4, 8])
@pytest.mark.parametrize("kind", ["normal", "few-distinct", "signed-zeros"])
def test_radix_digit_widths(kind, radix_bits):
    """Both digit widths of the radix selection (a block narrower than the row)."""
    logits = make_logits(kind, 2, 900, torch.float32, seed=radix_bits)
    settings = topk.topk_settings(2, 900, 50)._replace(radix_bits=radix_bits, block=64,
                                                       stream_block=256)
    check(logits, 50, None, settings)


@pytest.mark.parametrize("chunk, width", [(32, 1), (64, 2), (512, 16)])
@pytest.mark.parametrize("kind", ["normal", "few-distinct", "all-equal", "magnitudes"])
def test_ranking_steps(kind, chunk, width):
    """Ranking programs of few or many pairs, comparing few or many bucket members a
    step: crowded buckets (few values) and sparse ones (magnitudes: a wide range). (A
    bucket crowded past the rank grid's first chunks, whose ranks those chunks miss:
    ``test_ranking_a_crowded_bucket_past_the_rank_grid``.)"""
    g = generator(16)
    logits = make_logits(kind, 3, 600, torch.float32, seed=16)
    settings = topk.topk_settings(3, 600, 200)._replace(chunk=chunk, width=width)
    buffers = {}
    check(logits, 200, random_lengths(3, 600, g), settings, buffers)
    assert buffers["rank_grid"] == (3, topk.rank_programs(settings, 200, 600))


@pytest.mark.parametrize("chunk", [32, 256])
def test_ranking_a_crowded_bucket_past_the_rank_grid(chunk):
    """One outlier stretches the buckets' range, so that the rest of the row (ascending,
    in a narrow range) shares one bucket, placed there in column order: the reverse of
    its ranks. The first ranks then lie at the end of the bucket, past what the rank
    grid's programs cover with one chunk each: their further chunks must rank them."""
    cols, k = 600, 200
    row = 1.0 + torch.arange(cols, dtype=torch.float32) * 1e-6
    row[0] = 1e30
    logits = torch.stack([row, row.flip(0), torch.randn(cols, generator=generator(3))]).to(DEVICE)
    settings = topk.topk_settings(3, cols, k)._replace(chunk=chunk)
    buffers = {}
    check(logits, k, None, settings, buffers)
    _, programs = buffers["rank_grid"]
    assert int(buffers["meta"][0, 2]) == cols > programs * chunk


# ----------------------------------------------------------------------------- long rows
@pytest.mark.parametrize("placement", PLACEMENTS)
@pytest.mark.parametrize("split_steps", [1, 3], ids=["1-step", "3-steps"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", ["normal", "magnitudes", "specials"])
def test_long_rows_through_candidates(kind, dtype, split_steps, placement):
    g = generator(6)
    cols, k = 3000, 100
    logits = make_logits(kind, 3, cols, DTYPES[dtype], seed=6)
    lengths = torch.tensor([cols, 2000, 2999], dtype=torch.int32, device=DEVICE)
    buffers = {}
    settings = small_split_settings(k, cols, split_steps=split_steps, **PLACEMENTS[placement])
    check(logits, k, lengths, settings, buffers)
    assert usable(buffers, settings, torch.tensor([k, k, k])).all()  # no fallback
    check_bucket_range(buffers, settings, placement, 3)
    check(logits, k, random_lengths(3, cols, g), settings)


@pytest.mark.parametrize("digit_bits, threshold_bits", [(1, 16), (2, 16), (4, 16), (1, 12)],
                         ids=["1-bit-passes", "2-bit-passes", "4-bit-passes", "12-bits"])
@pytest.mark.parametrize("rows_kind", ["full-rows", "short-rows", "offset"])
def test_sample_threshold_is_the_sampled_key(digit_bits, threshold_bits, rows_kind):
    """The sample kernel's threshold: the r-th largest key of the row's sampled columns (r =
    expected hits + 4 standard deviations + 8), ``threshold_bits`` bits of it past the bits
    every sampled key at or above it shares (found 1, 2 or 4 bits a pass: for rows of
    either sign its top bits; for rows of one sign or offset far from 0, finer); sampled
    columns past a row's length never count."""
    check_sample_threshold(digit_bits, threshold_bits, rows_kind)


@pytest.mark.gpu
@pytest.mark.parametrize("threshold_bits", [16, 12])
@pytest.mark.parametrize("rows_kind", ["full-rows", "short-rows", "offset"])
def test_sample_threshold_by_shared_digit_counts(threshold_bits, rows_kind):
    """``shared_sample``: the same threshold from two passes of digit counts in shared
    memory (inline PTX)."""
    check_sample_threshold(1, threshold_bits, rows_kind, shared_sample=True)


def plan_of(logits, k) -> topk.TopKPlan:
    """The checked call of top-``k`` of ``logits`` (no lengths) into an output beside them."""
    return topk.check_topk(topk.top_k_indices_into.op.bind(
        logits, None, torch.empty(logits.shape[0], k, dtype=torch.int32, device=logits.device)))


def launches_of(logits, k, settings) -> topk.TopKLaunches:
    return topk._launches(plan_of(logits, k), settings)


def check_sample_threshold(digit_bits, threshold_bits, rows_kind, **changes):
    cols, k = 3000, 100
    settings = small_split_settings(k, cols, sample_digit_bits=digit_bits,
                                    threshold_bits=threshold_bits, **changes)
    logits = make_logits("normal", 2, cols, torch.float32, seed=17)
    if changes.get("shared_sample"):
        assert launches_of(logits, k, settings).sample.state.fixed["SHARED_SAMPLE"]
    lengths = None
    if rows_kind == "short-rows":  # the short row all negative: columns past it never count
        lengths = torch.tensor([cols, 1900], dtype=torch.int32, device=DEVICE)
        logits[1] = -logits[1].abs() - 1
    elif rows_kind == "offset":  # a common offset: the top 16 bits would leave ~1/3 in
        logits[0] += 50
        logits[1] -= 1000
    buffers = {}
    check(logits, k, lengths, settings, buffers)
    stride = topk.sample_stride(cols, settings.sample_block)
    got = buffers["threshold"].cpu().long() & 0xFFFFFFFF
    for row in range(2):
        n = cols if lengths is None else int(lengths[row])
        columns = [c for c in range(n) if c % stride < topk.SAMPLE_CHUNK]
        keys = reference.kernel_keys(logits[row, columns].cpu())
        m = len(columns)
        expected = -(-min(k, n) * m // n)
        rank = expected + int(math.sqrt(expected) * 4.0) + 8
        want = reference.sample_threshold(keys, rank, threshold_bits, digit_bits)
        assert int(got[row]) == want, (row, n)
        if rows_kind == "full-rows" and threshold_bits == 16:  # both signs: the top 16 bits
            assert want == int(keys.sort(descending=True).values[rank - 1]) & 0xFFFF0000
        if rows_kind == "offset":
            assert usable(buffers, settings, torch.full((2,), k)).all()


@pytest.mark.parametrize("placement", PLACEMENTS)
def test_long_rows_overflowing_the_candidates(placement):
    """Rows of equal values: every column reaches the threshold; the select kernel finds
    the top k in the row itself."""
    cols, k = 3000, 100
    logits = make_logits("all-equal", 2, cols, torch.float32)
    buffers = {}
    settings = small_split_settings(k, cols, **PLACEMENTS[placement])
    check(logits, k, None, settings, buffers)
    assert (buffers["cand_count"].cpu() > settings.block).all()


def test_long_rows_of_few_values():
    """Long runs of ties among the candidates (or past the capacity): exact either way."""
    g = generator(13)
    cols, k = 2500, 150
    logits = make_logits("few-distinct", 3, cols, torch.float32, seed=13)
    check(logits, k, random_lengths(3, cols, g), small_split_settings(k, cols))


def test_long_rows_whose_candidates_fit_the_block_or_not():
    """The smallest block that holds every row's candidates ranks them all; the largest
    that holds none sends every row to the radix selection; exact either way."""
    cols, k = 3000, 100
    logits = make_logits("normal", 4, cols, torch.float32, seed=14)
    buffers = {}
    check(logits, k, None, small_split_settings(k, cols), buffers)
    counts = buffers["cand_count"].cpu()
    fits = 1 << (int(counts.max()) - 1).bit_length()
    short = 1 << (int(counts.min()) - 1).bit_length() - 1
    assert short >= 128  # the radix selection's survivors (k) fit
    for block, ranked in ((fits, True), (short, False)):
        settings = small_split_settings(k, cols, block=block)
        buffers = {}
        check(logits, k, None, settings, buffers)
        assert usable(buffers, settings, torch.full((4,), k)).eq(ranked).all()


@pytest.mark.parametrize("placement", PLACEMENTS)
def test_long_rows_whose_sample_misleads(placement):
    """The sample sees only large values, the row has few: fewer candidates than k, so
    the select kernel reads the row itself."""
    cols, k = 3000, 300
    settings = small_split_settings(k, cols, sample_block=64, **PLACEMENTS[placement])
    logits = make_logits("normal", 2, cols, torch.float32)
    logits[:, sampled_columns(cols, settings)] += 100  # exactly the sampled columns
    buffers = {}
    check(logits, k, None, settings, buffers)
    assert (buffers["cand_count"].cpu() < k).all()


@pytest.mark.parametrize("extra", [20, 200], ids=["few", "crowded"])
@pytest.mark.parametrize("placement", PLACEMENTS)
def test_long_rows_larger_than_the_sample_saw(placement, extra):
    """The row's largest values in columns the sample skips (also tied with each other or
    with the sample's largest key): the bucket range starts at the row's largest
    candidate, wherever the sample's largest lies, so they spread over the buckets and
    rank exactly."""
    cols, k = 3000, 300
    settings = small_split_settings(k, cols, **PLACEMENTS[placement])
    logits = make_logits("normal", 3, cols, torch.float32, seed=18)
    sampled = sampled_columns(cols, settings)
    # The row's own values above its sample's largest (which the seed decides, tens of them
    # at times) would share bucket 0 with the planted ones: kept below it.
    top = logits[:, sampled].max(1, keepdim=True).values
    logits[:, ~sampled] = torch.minimum(logits[:, ~sampled], top - 0.5)
    big = (~sampled).nonzero().flatten()[torch.randperm(int((~sampled).sum()),
                                                        generator=generator(18))[:extra]]
    logits[0, big.to(DEVICE)] += 50
    logits[1, big.to(DEVICE)] = 7.0  # one tied value above the sample's largest
    logits[2, big.to(DEVICE)] = logits[2, sampled].max()  # ties with the sample's largest key
    buffers = {}
    check(logits, k, None, settings, buffers)
    assert usable(buffers, settings, torch.full((3,), k)).all()
    check_bucket_range(buffers, settings, placement, 3)


@pytest.mark.parametrize("placement", PLACEMENTS)
def test_long_rows_of_candidates_a_few_keys_apart(placement):
    """Candidates whose keys all lie within fewer than ``block`` steps of the threshold:
    the bucket range is at its narrowest (shift 32: a bucket per key), ties broken by
    column within a bucket."""
    cols, k = 3000, 300
    settings = small_split_settings(k, cols, **PLACEMENTS[placement])
    g = generator(19)
    one = 0x3F800000  # 1.0f: its key's low 16 bits are zero, as the threshold's are
    top = settings.block // 2 - 1
    bits = one + torch.randint(0, top, (2, cols), generator=g, dtype=torch.int32)
    assert sampled_columns(cols, settings)[0]
    bits[:, 0] = one + top  # a sampled column: no candidate lies above the sample's largest
    logits = bits.view(torch.float32)
    low = torch.rand(2, cols, generator=g) < 0.4
    low[:, 0] = False
    logits[low] = -10 + torch.randn(int(low.sum()), generator=g)
    logits = logits.to(DEVICE)
    buffers = {}
    check(logits, k, None, settings, buffers)
    assert usable(buffers, settings, torch.full((2,), k)).all()
    check_bucket_range(buffers, settings, placement, 2)


@pytest.mark.parametrize("dtype", DTYPES)
def test_subnormals_rank_when_the_cpu_flushes_them(dtype):
    """Subnormals rank by value even with ``torch.set_flush_denormal(True)``, under which
    the CPU's float compares read them as zeros (the reference ranks by the bits)."""
    width = 32 if dtype == "fp32" else 16
    sign = 1 << (width - 1)
    bits = torch.tensor([1, 0, sign | 1, sign, 2, 1 << (width - 10)], dtype=torch.int64)
    int_type = torch.int32 if dtype == "fp32" else torch.int16
    logits = (bits - (bits >= sign).long() * (2 * sign)).to(int_type).view(DTYPES[dtype])
    want = torch.tensor([[5, 4, 0, 1, 3, 2]], dtype=torch.int32)  # +/-0.0 tie: by column
    if not torch.set_flush_denormal(True):
        pytest.skip("this CPU cannot flush subnormals")
    try:
        for backend in ("reference", "triton"):
            got = topk.top_k_indices(logits[None].to(DEVICE), 6, backend=backend)
            assert torch.equal(got.cpu(), want), backend
    finally:
        torch.set_flush_denormal(False)


def test_k_2048_short_rows():
    g = generator(8)
    logits = make_logits("few-distinct", 2, 2600, torch.bfloat16, seed=8)
    check(logits, 2048, random_lengths(2, 2600, g))


def test_k_2048_long_rows():
    cols = 6000
    logits = make_logits("normal", 1, cols, torch.float32, seed=9)
    settings = small_split_settings(2048, cols, sample_block=1024, step=1024, block=4096)
    buffers = {}
    check(logits, 2048, None, settings, buffers)
    assert 2048 <= int(buffers["cand_count"][0]) <= settings.block


@pytest.mark.parametrize("pdl", [0, 1, 2], ids=["plain-launch", "pdl-early", "pdl-at-exit"])
def test_dependent_launch_gives_the_same_indices(pdl):
    """With and without programmatic dependent launch (a launch option on sm_90+, the
    constexpr waits compiled out elsewhere): the same result."""
    logits = make_logits("normal", 2, 9000, torch.float32, seed=3)
    settings = topk.topk_settings(2, 9000, 300)._replace(pdl=pdl)
    check(logits, 300, None, settings)


def test_default_settings_long_rows():
    """topk_settings' own choice for a row past the direct width."""
    cols = 4100
    logits = make_logits("normal", 1, cols, torch.float32, seed=10)
    assert topk.topk_settings(1, cols, 16).splits > 0 or DEVICE != "cpu"
    check(logits, 16)


@pytest.mark.parametrize("rows, cols, k", [(1, 131072, 2048), (64, 65536, 2048),
                                           (512, 8192, 2048), (4, 300000, 64),
                                           (2, 32768, 64), (1, 200000, 16),
                                           (2, 20000, 8192), (2, 20000, 16384),
                                           (1, 2**31 - 2**16, 2048)])
def test_gpu_settings_are_consistent(rows, cols, k):
    """The settings chosen for the GPU: filter programs cover the row, the block covers
    min(k, cols) (and the row, read directly), warps hold 32 pairs a thread or fewer."""
    s = topk.topk_settings(rows, cols, k, interpreted=False)
    assert s.block >= min(k, cols) and s.block & (s.block - 1) == 0
    assert s.block <= 32 * 32 * s.select_warps
    if s.splits == 0:
        assert s.block >= cols
    else:
        assert s.splits * s.step * s.split_steps >= cols and s.splits <= topk.MAX_GRID_Y
        assert s.block >= 2 * min(k, cols) or s.block == topk.MAX_SORTED
        expected = topk.expected_candidates(cols, k, s.sample_block)
        assert 5 * expected <= 4 * s.block or s.block == topk.MAX_SORTED
        assert s.sample_block & (s.sample_block - 1) == 0
    # Short launches count and place their candidates over several programs a row.
    placed = rows * cols < topk.FILTER_STEPS_FROM and rows <= topk.PLACE_MAX_ROWS
    assert s.place_part == (min(topk.PLACE_PART, s.block) if s.splits and placed else 0)
    assert s.place_part == 0 or s.block % s.place_part == 0
    assert s.place_warps * 32 * 32 >= s.block  # at most 32 buckets a thread
    # Early release only while the filter's programs leave SMs free.
    if s.splits:
        early = rows * s.splits <= topk.PDL_MAX_PROGRAMS
        assert s.pdl == (topk.PDL_EARLY if early else topk.PDL_AT_EXIT)
    else:
        assert s.pdl == topk.PDL_NONE


def test_dependent_launch_rule_at_the_bench_shapes():
    expected = {(1, 131072): topk.PDL_EARLY, (64, 8192): topk.PDL_AT_EXIT,
                (64, 65536): topk.PDL_AT_EXIT, (128, 65536): topk.PDL_AT_EXIT,
                (512, 8192): topk.PDL_AT_EXIT, (4, 4096): topk.PDL_NONE}
    for (rows, cols), mode in expected.items():
        assert topk.topk_settings(rows, cols, 2048, interpreted=False).pdl == mode


def test_count_and_place_rule_at_the_bench_shapes():
    """Short launches of at most 64 rows (one row of 131072, 64 x 8192, 16 x 65536) count
    and place their candidates over several programs a row; from 4M elements, or 65 rows,
    the select kernel places them."""
    expected = {(1, 131072): 512, (64, 8192): 512, (64, 65536): 0, (128, 65536): 0,
                (512, 8192): 0, (128, 8192): 0, (8, 65536): 512, (16, 65536): 512,
                (32, 65536): 512, (1, 262144): 512, (4, 4096): 0}
    for (rows, cols), part in expected.items():
        s = topk.topk_settings(rows, cols, 2048, interpreted=False)
        assert s.place_part == part, (rows, cols)


@pytest.mark.parametrize("mode", [0, 1, 2], ids=["none", "early", "at-exit"])
def test_dependent_launch_modes_reach_the_launches(monkeypatch, mode):
    """Where the GPU has dependent launch, every kernel gets the mode as USE_PDL and the
    launch option with it (compiled, not run, here); elsewhere neither."""
    logits = torch.randn(2, 9000)
    plan = plan_of(logits, 300)
    settings = topk.topk_settings(2, 9000, 300, interpreted=False)._replace(pdl=mode)
    for place_part in (0, 64):  # the select kernel, or the count and place kernels
        settings = settings._replace(place_part=place_part)
        launches = topk._launches(plan, settings)
        kernels = [launch for launch in launches if callable(launch)]
        assert len(kernels) == (5 if place_part else 4)
        for launch in kernels:
            assert launch.state.fixed["USE_PDL"] == topk.PDL_NONE
            assert "launch_pdl" not in launch.state.launch_options
    monkeypatch.setattr(topk, "pdl_supported", lambda device: True)
    gpu_plan = dataclasses.replace(plan, device=torch.device("cuda", 0), launches={})
    for place_part in (0, 64):
        launches = topk._launches(gpu_plan, settings._replace(place_part=place_part))
        check_pdl_mode([launch for launch in launches if callable(launch)], mode)


@pytest.mark.parametrize("block, warps, fits", [(4096, 16, True), (4096, 8, True),
                                                 (128, 4, True), (8192, 16, False),
                                                 (64, 4, False)])
def test_shared_memory_settings_reach_the_select_kernel_on_nvidia_only(monkeypatch, block,
                                                                       warps, fits):
    """``shared_slots`` makes the select kernel count in shared memory (``SHARED_SLOTS``) on
    an NVIDIA GPU where the block fits (a whole number of pairs a thread, at most
    ``SHARED_SLOTS_MAX_BLOCK``); never here. The settings take it where the select kernel
    orders a row's candidates, not where the count and place kernels do, nor for rows read
    whole."""
    assert topk.shared_slots_fit(block, warps) == fits
    assert topk.topk_settings(512, 8192, 2048, interpreted=False).shared_slots
    assert not topk.topk_settings(1, 131072, 2048, interpreted=False).shared_slots  # placed
    assert not topk.topk_settings(8, 1000, 64, interpreted=False).shared_slots  # read whole
    logits = torch.randn(2, 9000)
    plan = plan_of(logits, 64)
    settings = topk.topk_settings(2, 9000, 64, interpreted=False)._replace(
        place_part=0, block=block, select_warps=warps, shared_slots=False)
    slots = settings._replace(shared_slots=True)

    def mode(plan, settings):
        return topk._launches(plan, settings).select.state.fixed["SHARED_SLOTS"]

    assert not mode(plan, settings) and not mode(plan, slots)
    monkeypatch.setattr(topk.checks, "nvidia_capability", lambda device: (9, 0))
    gpu_plan = dataclasses.replace(plan, device=torch.device("cuda", 0), launches={})
    assert not mode(gpu_plan, settings)
    assert mode(gpu_plan, slots) == fits


def emulated_pairs(kind: str, block: int, g: torch.Generator) -> tuple[list[int], list[bool]]:
    """``block`` pairs (unsigned 64-bit: key high, ~column low) and which are valid."""
    valid = (torch.rand(block, generator=g) < 0.8).tolist()
    if kind == "none-valid":
        valid = [False] * block
    if kind == "crowded":  # few keys: long runs in a bucket, ties broken by the column
        keys = torch.randint(0x80000000, 0x80000004, (block,), generator=g)
    elif kind == "outlier":  # one pair far above the rest: the others share a few buckets
        keys = torch.randint(0x80000000, 0x80000100, (block,), generator=g)
        keys[0] = 0xFFFF0000
        valid[0] = True
    else:
        keys = torch.randint(0, 2**32, (block,), generator=g)
    columns = torch.randperm(block, generator=g)
    return [int(k) << 32 | (~int(c) & 0xFFFFFFFF) for k, c in zip(keys, columns, strict=True)], valid


@pytest.mark.parametrize("kind", ["random", "crowded", "outlier", "none-valid"])
@pytest.mark.parametrize("pack, threads", [(1, 8), (2, 4), (8, 4), (1, 96)])
def test_shared_memory_statements_on_an_emulated_block(pack, threads, kind):
    """The select kernel's slots statement (``shared_slots_ptx``), its text run on an
    emulated block (``ptx_emulator``) with the pairs dealt to the threads in a random
    order, as any Triton layout deals them: the counts are the buckets', each bucket's
    slots its pairs' places. A second copy of the statement fails to assemble."""
    block = pack * threads
    g = generator(block + len(kind))
    pairs, valid = emulated_pairs(kind, block, g)
    live = [p for p, v in zip(pairs, valid, strict=True) if v]
    top = max(live, default=0)
    bottom = min(live, default=0)
    shift = next(s for s in range(65) if (top - bottom) >> s < block)
    bucket = [min((top - p) >> shift, block - 1) if v else 0 for p, v in zip(pairs, valid, strict=True)]
    deal = torch.randperm(block, generator=g).view(threads, pack).tolist()
    emulated = Block(seed=block)
    slots_text = topk_kernels.shared_slots_ptx(pack, 4 * block)  # as _place declares it
    results = emulated.run(slots_text, [
        [0] * 2 * pack + [bucket[i] for i in mine] + mine + [int(valid[i]) for i in mine]
        for mine in deal], outputs=2 * pack)
    slot, count = [0] * block, [0] * block
    for mine, out in zip(deal, results, strict=True):
        for e, i in enumerate(mine):
            slot[i], count[i] = out[e], out[pack + e]
    assert count == [sum(1 for b, v in zip(bucket, valid, strict=True) if v and b == x) for x in range(block)]
    for x in range(block):
        assert sorted(slot[i] for i in range(block) if valid[i] and bucket[i] == x) == list(
            range(count[x]))
    with pytest.raises(ValueError, match="duplicate definition"):
        emulated.run(slots_text, [], outputs=0)


@pytest.mark.parametrize("bits", [16, 15, 12])
@pytest.mark.parametrize("kind", ["normal", "offset", "one-sign", "nan", "few-values",
                                  "narrow", "all-equal"])
@pytest.mark.parametrize("pack, threads", [(2, 8), (4, 32), (2, 96)])
def test_sample_threshold_statement_on_an_emulated_block(pack, threads, kind, bits):
    """The sample kernel's threshold statement (``shared_threshold_ptx``), its text run on an
    emulated block: the rank-th largest counted key to ``bits`` bits past the bits the
    counted keys share, as ``sample_threshold`` decides it a bit a pass (sampled columns
    past the row hold key 0 and do not count; NaN's key 0 counts). A second copy of the
    statement in a kernel (Triton splitting a thread's keys over two) fails to assemble."""
    g = generator(pack * threads + len(kind) + bits)
    size = pack * threads
    x = torch.randn(size, generator=g)
    if kind == "offset":
        x += 1000
    elif kind == "one-sign":
        x = -x.abs() - 50
    elif kind == "nan":
        x[torch.rand(size, generator=g) < 0.2] = NAN
    elif kind == "few-values":
        x = torch.randint(0, 3, (size,), generator=g).float()
    elif kind == "narrow":  # keys a few units apart: more than 16 bits shared
        x = (1.0 + torch.randint(0, 40, (size,), generator=g) * 2.0**-23).float()
    elif kind == "all-equal":
        x = torch.full((size,), 2.5)
    keys = reference.kernel_keys(x)
    valid = torch.rand(size, generator=g) < 0.9
    keys = torch.where(valid, keys, 0)
    counted = keys[valid]
    m = len(counted)
    largest, smallest = int(counted.max()), int(counted.min())
    deal = torch.randperm(size, generator=g).view(threads, pack).tolist()
    for rank in sorted({1, max(m // 3, 1), m}):
        want = reference.sample_threshold(counted, rank, bits)
        assert reference.sample_threshold_from_prefix(counted, rank, bits) == want
        emulated = Block(seed=rank)
        results = emulated.run(topk_kernels.shared_threshold_ptx(pack), [
            [0] * pack + [int(keys[i]) for i in mine] + [int(valid[i]) for i in mine]
            + [rank] * pack + [largest] * pack + [smallest] * pack + [bits] * pack
            for mine in deal], outputs=pack)
        assert {value for out in results for value in out} == {want}, (kind, rank)
    with pytest.raises(ValueError, match="duplicate definition"):
        emulated.run(topk_kernels.shared_threshold_ptx(pack), [], outputs=0)


@pytest.mark.parametrize("room", ["room", "overflow"])
@pytest.mark.parametrize("share", [0.0, 0.3, 1.0], ids=["none-taken", "some-taken", "all-taken"])
@pytest.mark.parametrize("threads", [32, 96])
def test_warp_append_statement_on_an_emulated_block(threads, share, room):
    """The filter's warp append (``_WARP_APPEND_PTX``), its text run on an emulated block
    with the elements dealt to the threads in a random order: each warp reserves its
    taken pairs with one atomic add on the row's counter (which earlier programs have
    moved already), every taken pair lands once in its own slot below the capacity, no
    word before the counter's start, past the capacity or outside the buffer changes, and
    the counter ends at the total taken, past the capacity too (the select kernel reads an
    overflow there)."""
    n = topk_kernels.WARP_APPEND_ELEMENTS
    size = n * threads
    g = generator(threads + int(10 * share) + len(room))
    taken = (torch.rand(size, generator=g) < share).tolist()
    keys = torch.randint(0, 2**32, (size,), generator=g).tolist()
    total = sum(taken)
    before = 7  # pairs earlier programs appended
    capacity = before + total + 3 if room == "room" else before + total // 2
    emulated = Block(seed=size)
    poison = 0xDEADBEEF
    row = emulated.allocate_global(2 * (capacity + 4), fill=poison)
    counter = emulated.allocate_global(1, fill=before)
    deal = torch.randperm(size, generator=g).view(threads, n).tolist()
    results = emulated.run(topk_kernels._WARP_APPEND_PTX.value, [
        [0] * n + [int(taken[i]) for i in mine] + [keys[i] for i in mine] + mine
        + [row] * n + [counter] * n + [capacity] * n for mine in deal], outputs=n)
    assert all(out == [0] * n for out in results)
    assert emulated.load_global(counter) == before + total
    words = [emulated.load_global(row + 4 * w) for w in range(2 * (capacity + 4))]
    slots = [(words[2 * s], words[2 * s + 1]) for s in range(capacity + 4)]
    written = slots[before:min(capacity, before + total)]
    assert all(slot == (poison, poison) for slot in slots[:before] + slots[before + len(written):])
    pairs = [(i, keys[i]) for i in range(size) if taken[i]]
    assert len(set(written)) == len(written) and set(written) <= set(pairs)
    if room == "room":
        assert sorted(written) == pairs


def check_pdl_mode(kernels, mode):
    for launch in kernels:
        assert launch.state.fixed["USE_PDL"] == mode
        assert launch.state.launch_options.get("launch_pdl", False) == (mode != topk.PDL_NONE)


@pytest.mark.parametrize("k", [1, 8, 37])
def test_small_k_on_long_rows_uses_the_candidates(k):
    """A small k on a long row: the sample predicts several times k candidates, and the
    default block holds them (no fallback to the radix selection)."""
    cols = 5000
    logits = make_logits("normal", 2, cols, torch.float32, seed=k)
    settings = topk.topk_settings(2, cols, k)
    assert settings.splits > 0
    buffers = {}
    check(logits, k, None, settings, buffers)
    counts = buffers["cand_count"].cpu()
    assert ((counts >= k) & (counts <= settings.block)).all(), (counts, settings.block)


def test_repeated_calls_agree():
    logits = make_logits("few-distinct", 3, 3000, torch.float32, seed=11)
    settings = small_split_settings(64, 3000)
    first = run(logits, 64, None, settings)
    assert torch.equal(run(logits, 64, None, settings), first)


def test_default_backend_and_empty_rows():
    logits = make_logits("normal", 0, 50, torch.float32)
    assert topk.top_k_indices(logits, 3).shape == (0, 3)
    empty_cols = torch.empty((2, 0), device=DEVICE)
    assert topk.top_k_indices(empty_cols, 3).eq(-1).all()


# ----------------------------------------------------------------------------- helpers
def test_lengths_from_context_shapes():
    one_d = torch.tensor([5, 100], dtype=torch.int64)
    assert topk.lengths_from_context(one_d, 1, 50).tolist() == [5, 50]
    assert topk.lengths_from_context(one_d, 3, 200).tolist() == [3, 4, 5, 98, 99, 100]
    two_d = torch.tensor([[3, 9], [-1, 70]], dtype=torch.int32)
    assert topk.lengths_from_context(two_d, 2, 60).tolist() == [3, 9, 0, 60]
    assert topk.lengths_from_context(two_d, 2, 60).dtype == torch.int32


# ----------------------------------------------------------------------------- errors
def bad_calls():
    """(id, exception, words the message must contain, call)."""
    x = make_logits("normal", 4, 64, torch.float32)
    lengths = torch.full((4,), 10, dtype=torch.int32, device=DEVICE)
    out = torch.empty((4, 8), dtype=torch.int32, device=DEVICE)
    wide = make_logits("normal", 8, 64, torch.float32)
    lengths8 = torch.full((8,), 10, dtype=torch.int32, device=DEVICE)
    f = topk.top_k_indices
    return [
        ("k-zero", ValueError, "k", lambda: f(x, 0)),
        ("k-negative", ValueError, "k", lambda: f(x, -3)),
        ("k-float", TypeError, "k", lambda: f(x, 2.0)),
        ("k-bool", TypeError, "k", lambda: f(x, True)),
        ("logits-dtype", TypeError, "logits", lambda: f(x.half(), 8)),
        ("logits-int", TypeError, "logits", lambda: f(x.int(), 8)),
        ("logits-not-tensor", TypeError, "logits", lambda: f([[1.0]], 1)),
        ("logits-1d", ValueError, "logits", lambda: f(x[0], 8)),
        ("logits-stride1", ValueError, "logits.stride(1)", lambda: f(x.t(), 2)),
        ("lengths-dtype", TypeError, "lengths", lambda: f(x, 8, lengths.long())),
        ("lengths-size", ValueError, "lengths", lambda: f(x, 8, lengths[:3])),
        ("lengths-2d", ValueError, "lengths", lambda: f(x, 8, lengths.view(2, 2))),
        ("lengths-stride", ValueError, "lengths.stride(0)",
         lambda: f(x, 8, torch.zeros(8, dtype=torch.int32, device=DEVICE)[::2])),
        ("out-dtype", TypeError, "out", lambda: f(x, 8, out=out.long())),
        ("out-shape", ValueError, "out", lambda: f(x, 4, out=out)),
        ("out-stride1", ValueError, "out.stride(1)",
         lambda: f(x, 4, out=torch.empty((4, 8), dtype=torch.int32, device=DEVICE)[:, ::2])),
        ("out-overlap", ValueError, "out.stride(0)",
         lambda: f(x, 8, out=out[:1].expand(4, 8))),
        ("backend", ValueError, "backend", lambda: f(x, 8, backend="cuda")),
        # Checked before the result is allocated (rows x 2**31 - 1 would not fit).
        ("lengths-before-out", TypeError, "lengths",
         lambda: f(wide, 2**31 - 1, lengths8.float())),
        ("backend-before-out", ValueError, "backend", lambda: f(wide, 2**31 - 1, backend="gpu")),
        ("k-too-large", NotImplementedError, "k",
         lambda: f(torch.zeros((1, topk.MAX_SORTED + 1), device=DEVICE), topk.MAX_SORTED + 1,
                   backend="triton")),
        ("context-dtype", TypeError, "context_lens",
         lambda: topk.lengths_from_context(lengths.float(), 1, 64)),
        ("context-shape", ValueError, "context_lens",
         lambda: topk.lengths_from_context(lengths.view(2, 2), 3, 64)),
        ("next_n", ValueError, "next_n", lambda: topk.lengths_from_context(lengths, 0, 64)),
        ("num_cols", TypeError, "num_cols", lambda: topk.lengths_from_context(lengths, 1, 6.0)),
    ]


@pytest.mark.parametrize("name, error, words, call", bad_calls(), ids=[c[0] for c in bad_calls()])
def test_bad_arguments_name_themselves(name, error, words, call):
    with pytest.raises(error, match=words.replace("(", r"\(").replace(")", r"\)")):
        call()


def test_bad_out_is_not_written():
    x = make_logits("normal", 2, 64, torch.float32)
    out = torch.full((2, 8), SENTINEL, dtype=torch.int32, device=DEVICE)
    with pytest.raises(ValueError, match="lengths"):
        topk.top_k_indices(x, 8, torch.zeros(3, dtype=torch.int32, device=DEVICE), out=out)
    assert out.eq(SENTINEL).all()


@pytest.mark.parametrize("backend", ["reference", "triton"])
def test_out_sharing_memory_with_an_input_is_rejected(backend):
    """``out`` over ``lengths`` (or the logits' bytes) is an error before anything is
    written; side by side in one buffer, apart, is fine."""
    rows, k = 3, 8
    x = make_logits("normal", rows, 64, torch.float32, seed=2)
    buf = torch.full((rows + rows * k + 1,), SENTINEL, dtype=torch.int32, device=DEVICE)
    lengths = buf[:rows]
    lengths.copy_(torch.tensor([64, 5, 0], dtype=torch.int32))
    over = buf[rows - 1:rows - 1 + rows * k].view(rows, k)
    with pytest.raises(ValueError, match="out: expected memory apart from lengths"):
        topk.top_k_indices(x, k, lengths, out=over, backend=backend)
    assert buf[rows:].eq(SENTINEL).all() and lengths.tolist() == [64, 5, 0]
    logits_bytes = x.view(torch.int32)[:, :k]
    with pytest.raises(ValueError, match="out: expected memory apart from logits"):
        topk.top_k_indices(x, k, out=logits_bytes, backend=backend)
    apart = buf[rows:rows + rows * k].view(rows, k)
    topk.top_k_indices(x, k, lengths, out=apart, backend=backend)
    assert torch.equal(apart.cpu(), oracle(x, k, lengths))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_other_device_is_rejected():
    x = make_logits("normal", 2, 64, torch.float32)
    with pytest.raises(ValueError, match="lengths.device"):
        topk.top_k_indices(x, 8, torch.zeros(2, dtype=torch.int32))


# ----------------------------------------------------------------------------- GPU
ISSUE_SHAPES = [(1, 131072), (64, 8192), (64, 65536), (128, 65536), (512, 8192)]


@pytest.mark.gpu
@pytest.mark.parametrize("rows, cols", ISSUE_SHAPES, ids=[f"{r}x{c}" for r, c in ISSUE_SHAPES])
@pytest.mark.parametrize("kind, dtype", [("normal", "fp32"), ("normal", "bf16"),
                                         ("few-distinct", "fp32"), ("specials", "fp32")])
def test_issue_shapes_k_2048(rows, cols, kind, dtype):
    logits = make_logits(kind, rows, cols, DTYPES[dtype], seed=rows + cols)
    g = generator(rows)
    for lengths in (None, random_lengths(rows, cols, g)):
        want = reference.top_k_indices(logits, 2048, lengths)
        assert torch.equal(topk.top_k_indices(logits, 2048, lengths), want)


@pytest.mark.gpu
@pytest.mark.parametrize("k", [8192, 16384])
@pytest.mark.parametrize("kind", ["normal", "few-distinct"])
def test_count_and_place_at_the_largest_blocks(kind, k):
    """A short launch of long rows and a large k: the count and place kernels at blocks
    of 16384 buckets (the place kernel at 16 warps), lengths cutting the rows anywhere."""
    rows, cols = 2, 20000
    settings = topk.topk_settings(rows, cols, k)
    assert settings.place_part and settings.block == topk.MAX_SORTED
    logits = make_logits(kind, rows, cols, torch.float32, seed=k)
    for lengths in (None, random_lengths(rows, cols, generator(k))):
        check(logits, k, lengths, settings)


@pytest.mark.gpu
@pytest.mark.parametrize("split_steps", [1, 3], ids=["1-step", "3-steps"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", ["normal", "specials", "few-distinct"])
@pytest.mark.parametrize("placement", PLACEMENTS)
def test_warp_append_filter_on_odd_rows(placement, kind, dtype, split_steps):
    """Filter steps of 1024 columns at four warps: on NVIDIA each warp appends its own
    candidates (``WARP_APPEND``), here with rows that end inside a step and lengths that
    cut steps anywhere; the candidates are exactly the row's and fit the buffer."""
    g = generator(7)
    cols, k = 5000, 100
    logits = make_logits(kind, 3, cols, DTYPES[dtype], seed=7)
    lengths = torch.tensor([cols, 1500, 4999], dtype=torch.int32, device=DEVICE)
    settings = small_split_settings(k, cols, step=1024, split_steps=split_steps,
                                    **PLACEMENTS[placement])
    buffers = {}
    check(logits, k, lengths, settings, buffers)
    if kind != "few-distinct":  # (ties at the threshold may overflow the buffer: exact anyway)
        assert usable(buffers, settings, torch.tensor([k, k, k])).all()
    check(logits, k, random_lengths(3, cols, g), settings)


# (rows, cols, k): rows read whole at blocks of 128 to 4096 pairs (one to eight a
# thread), candidates of long rows at 16 and 8 warps (eight and sixteen a thread).
SHARED_SLOTS_SHAPES = [(3, 100, 64), (5, 1000, 300), (4, 4096, 2048), (512, 8192, 2048),
                       (128, 8192, 2048), (64, 65536, 2048)]


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["normal", "few-distinct", "all-equal", "specials"])
@pytest.mark.parametrize("rows, cols, k", SHARED_SLOTS_SHAPES,
                         ids=[f"{r}x{c}-k{k}" for r, c, k in SHARED_SLOTS_SHAPES])
def test_select_kernel_counting_in_shared_memory(rows, cols, k, kind):
    """``shared_slots``: the select kernel's bucket counts and slots from atomic adds on
    shared memory (inline PTX) give the reference's indices, crowded buckets (few distinct
    values, all equal) and ragged lengths included."""
    settings = topk.topk_settings(rows, cols, k)._replace(place_part=0, shared_slots=True)
    assert topk.shared_slots_fit(settings.block, settings.select_warps)
    logits = make_logits(kind, rows, cols, torch.float32, seed=rows + cols + k)
    assert launches_of(logits, k, settings).select.state.fixed["SHARED_SLOTS"]
    for lengths in (None, random_lengths(rows, cols, generator(cols))):
        check(logits, k, lengths, settings)


@pytest.mark.gpu
@pytest.mark.parametrize("rows, cols", [(64, 65536), (1, 131072)],
                         ids=["select-kernel", "count-and-place"])
def test_cuda_graph_capture(rows, cols):
    logits = make_logits("normal", rows, cols, torch.float32)
    lengths = torch.randint(0, cols, (rows,), dtype=torch.int32, device=DEVICE)
    out = torch.empty((rows, 2048), dtype=torch.int32, device=DEVICE)
    topk.top_k_indices(logits, 2048, lengths, out=out)  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        topk.top_k_indices(logits, 2048, lengths, out=out)
    logits.copy_(torch.randn_like(logits))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, reference.top_k_indices(logits, 2048, lengths))
