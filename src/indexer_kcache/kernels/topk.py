"""Top-k selection: a short list of candidates per row, then their exact order by counting.

Every eligible element ``(value, column)`` of a row is ranked by a pair of 32-bit words,
compared as one unsigned 64-bit number (high word first):

* ``key``: the value's float32 bits mapped so that unsigned order is the ranking order
  (-0.0 made +0.0 first; NaN below every number);
* ``low = ~column``: among equal keys the lower column ranks higher.

Pairs are distinct, so a row's top k are its k largest pairs, and the position of a pair
in the result is the number of the row's pairs above it: its rank.

``topk_select_kernel`` (a program per row) takes a source of at most ``BLOCK`` pairs into
registers and places them (``_place``): it cuts the range between the largest and the
smallest pair into ``BLOCK`` buckets of equal width, counts the pairs per bucket with
atomic adds (which also give each pair a slot in its bucket) and writes the pairs bucket
by bucket to a scratch row. (Or ``topk_count_kernel`` and ``topk_place_kernel`` do the
same for a row's candidates, several programs a row: counting them into buckets of the
range from the row's largest candidate key down to the threshold, then writing them.)
``topk_rank_kernel`` (programs per row and chunk of the scratch row) then ranks each pair
as its bucket's start plus the number of the bucket's pairs above it. For smoothly spread
values buckets hold a pair or two, so ranking costs a few compares per pair, where a
sorting network costs a few hundred (``tl.sort``'s cost: BENCHMARKS.md, "The top-k"); a
crowded bucket (a long run of equal values, or an outlier that stretches the range)
costs the square of its size, exact all the same. Only the pairs of buckets that start
within the first ``k`` ranks are ranked.

The source is the row itself when it fits; a longer row's candidates otherwise:
``topk_sample_kernel`` picks a key threshold from a fixed sample of the row (a little
below the sample's share of the k) and ``topk_filter_kernel`` appends every pair whose key
reaches it to the row's candidate buffer. The threshold only decides the amount of work,
never the result: when the candidates are fewer than the k, or overflow the buffer, the
select kernel (or the count kernel's program 0) finds the row's k largest pairs by radix
selection streamed from memory (``RADIX_BITS`` bits a pass, key bits first, then column
bits while ties remain) and places those.

Every kernel reads only eligible columns (``column < min(lengths[row], cols)``) and writes
only inside its buffers, whatever the lengths say.
"""

import triton
import triton.language as tl

from .dependent_launch import wait_for_previous_kernel

SIGN_BIT = tl.constexpr(0x80000000)
ABS_MASK = tl.constexpr(0x7FFFFFFF)
INF_BITS = tl.constexpr(0x7F800000)  # the magnitude of +-inf; larger magnitudes are NaN
WORD_MASK = tl.constexpr(0xFFFFFFFF)
# tl.histogram spreads its bins over a warp's lanes: fewer than 32 bins cost as much as 32.
MIN_BINS = tl.constexpr(32)
# _positions scans rows of this many elements (a thread's share of a block, typically).
SCAN_WIDTH = 16
# The sample's rank: expected hits plus this many standard deviations (Poisson) plus a
# constant; with a sample of >= 128 expected hits the candidates are about 1.4 times the
# wanted count, rarely below it or past twice it.
MARGIN_SIGMAS = tl.constexpr(4.0)
MARGIN_EXTRA = tl.constexpr(8)
# Rows' candidate counters lie a 128-byte line apart: the filter's atomic adds on one line
# are served one after another, so counters sharing a line would serialize every row's.
COUNTER_STRIDE = tl.constexpr(32)
# A row's counters (int32 ``cand_count[row * COUNTER_ROW + ...]``): the candidate count at
# 0 and, a line further, the largest candidate key (uint32 bits; ``TRACK_MAX``).
COUNTER_ROW = tl.constexpr(2 * COUNTER_STRIDE)
MAX_KEY_FIELD = tl.constexpr(COUNTER_STRIDE)


# Elements a thread that one warp-append statement takes (its inline PTX's pack).
WARP_APPEND_ELEMENTS = 8


def _warp_append_ptx(n: int) -> str:
    """PTX that appends a warp's taken pairs with one atomic add (NVIDIA only). A thread
    passes ``n`` elements: per element register, the warp's ballot gives each taken
    element its place among the warp's (the lanes below it), the ``n`` ballots' counts
    stack them, lane 0 reserves the warp's total on the row's counter and broadcasts the
    base, and each taken pair below the capacity is stored there. Operands: ``n`` dummy
    results, then ``n`` each of: taken, the pairs' high words (keys), their low words,
    the row's candidate buffer, its counter, the capacity. The ballots, the atomic and
    the stores are one statement with no result in use, so that Triton neither
    duplicates it into a second layout (each copy would add to the counter) nor drops
    it."""
    taken, high, low, row, counter, capacity = (n * (1 + i) for i in range(6))
    predicates = ", ".join(f"p{e}" for e in range(n))
    ballots = ", ".join(f"b{e}" for e in range(n))
    lines = ["{", f".reg .pred {predicates}, first, q;",
             f".reg .b32 {ballots}, lt, total, base, part, pos;", ".reg .b64 addr;"]
    lines += [f"setp.ne.u32 p{e}, ${taken + e}, 0;" for e in range(n)]
    lines += [f"vote.sync.ballot.b32 b{e}, p{e}, 0xffffffff;" for e in range(n)]
    lines += ["mov.u32 lt, %lanemask_lt;", "mov.u32 total, 0;"]
    for e in range(n):
        lines += [f"popc.b32 part, b{e};", "add.u32 total, total, part;"]
    lines += ["mov.u32 base, 0;", "setp.eq.u32 first, lt, 0;",
              "setp.ne.and.u32 first, total, 0, first;",
              f"@first atom.global.relaxed.gpu.add.u32 base, [${counter}], total;",
              "shfl.sync.idx.b32 base, base, 0, 0x1f, 0xffffffff;"]
    for e in range(n):
        lines += [f"and.b32 part, b{e}, lt;", "popc.b32 part, part;", "add.u32 pos, base, part;",
                  f"setp.lt.and.u32 q, pos, ${capacity + e}, p{e};",
                  f"mad.wide.u32 addr, pos, 8, ${row + e};",
                  f"@q st.global.v2.b32 [addr], {{${low + e}, ${high + e}}};",
                  f"popc.b32 part, b{e};", "add.u32 base, base, part;"]
    lines += [f"mov.b32 ${e}, 0;" for e in range(n)] + ["}"]
    return "\n".join(lines)


_WARP_APPEND_PTX = tl.constexpr(_warp_append_ptx(WARP_APPEND_ELEMENTS))
_WARP_APPEND_CONSTRAINTS = tl.constexpr(",".join(
    ["=r"] * WARP_APPEND_ELEMENTS + ["r"] * (3 * WARP_APPEND_ELEMENTS)
    + ["l"] * (2 * WARP_APPEND_ELEMENTS) + ["r"] * WARP_APPEND_ELEMENTS))
_WARP_APPEND_PACK = tl.constexpr(WARP_APPEND_ELEMENTS)


@triton.jit
def _warp_append(take, key, low, cand_row_ptr, counter_ptr, capacity):
    """Appends the taken pairs ``(key, low)`` of a block to ``cand_row`` at positions
    reserved on ``*counter_ptr``, each warp with one atomic add per eight elements a
    thread (the order among them is the warps' and lanes', not the columns'); pairs at
    positions from ``capacity`` on are counted, not stored. For blocks of a multiple of
    ``WARP_APPEND_ELEMENTS`` elements a thread. Not for the interpreter."""
    zeros = tl.zeros(take.shape, tl.int64)
    tl.inline_asm_elementwise(
        _WARP_APPEND_PTX, _WARP_APPEND_CONSTRAINTS,
        [take.to(tl.int32), key.to(tl.int32, bitcast=True), low.to(tl.int32, bitcast=True),
         zeros + cand_row_ptr.to(tl.int64), zeros + counter_ptr.to(tl.int64),
         zeros.to(tl.int32) + capacity],
        dtype=tl.int32, is_pure=False, pack=_WARP_APPEND_PACK)


@triton.constexpr_function
def _radix_bins(radix_bits):
    """Histogram bins for a digit of ``radix_bits`` bits."""
    return max(1 << radix_bits, MIN_BINS)


@triton.jit
def _eligible_count(lengths_ptr, row, cols, HAS_LENGTHS: tl.constexpr):
    """Eligible columns of ``row``: ``min(max(lengths[row], 0), cols)``, or ``cols``."""
    if HAS_LENGTHS:
        n = tl.minimum(tl.maximum(tl.load(lengths_ptr + row), 0), cols)
    else:
        n = cols + tl.zeros([], tl.int32)
    return n


@triton.jit
def _keys_of_bits(bits):
    """uint32 float32 bits -> uint32 keys whose unsigned order ranks the values.

    Negative numbers get their bits flipped (larger magnitude, smaller key), non-negative
    ones the sign bit set; +-0.0 both map to +0.0's key and NaN to 0, below -inf's key
    (0x007FFFFF). Integer operations only: no float compare, so no flushing of denormals.
    """
    magnitude = bits & ABS_MASK
    key = tl.where(bits >= SIGN_BIT, ~bits, bits | SIGN_BIT)
    key = tl.where(magnitude == 0, tl.full(bits.shape, SIGN_BIT, tl.uint32), key)
    return tl.where(magnitude > INF_BITS, tl.zeros_like(key), key)


@triton.jit
def _keys_of_raw(raw, IS_BF16: tl.constexpr):
    """Keys of loaded logits (bf16 widens exactly: its bits are the top half of the
    float32's)."""
    if IS_BF16:
        bits = raw.to(tl.uint16, bitcast=True).to(tl.uint32) << 16
    else:
        bits = raw.to(tl.uint32, bitcast=True)
    return _keys_of_bits(bits)


@triton.jit
def _load_keys(ptr, offsets, live, IS_BF16: tl.constexpr):
    """Keys of ``ptr[offsets]`` where ``live``."""
    return _keys_of_raw(tl.load(ptr + offsets, mask=live, other=0), IS_BF16)


@triton.constexpr_function
def _scan_width(block):
    """Elements per row of the [block // width, width] view ``_positions`` scans."""
    return min(block, SCAN_WIDTH)


@triton.jit
def _positions(take, BLOCK: tl.constexpr):
    """int32 ``[BLOCK]``: for each taken element, the number of taken elements before it
    (in order). Scanned as a [BLOCK // W, W] view, along the rows (within a thread) and
    then over the row sums: fewer instructions than one scan over BLOCK."""
    W: tl.constexpr = _scan_width(BLOCK)
    grid = tl.reshape(take.to(tl.int32), [BLOCK // W, W])
    inner = tl.cumsum(grid, 1)
    per_row = tl.sum(grid, 1)
    before = tl.cumsum(per_row, 0) - per_row
    return tl.reshape(inner + before[:, None], [BLOCK]) - 1


@triton.jit
def _pair(key, low):
    """The pair as one unsigned 64-bit number (key high, ~column low)."""
    return (key.to(tl.uint64) << 32) | low.to(tl.uint64)


@triton.jit
def _digit_counts(key, low, valid, decided_key, partial, shift, LOW_WORD: tl.constexpr,
                  RADIX_BITS: tl.constexpr):
    """Histogram of the digit at ``shift`` of the current word (the key, or ``low`` once
    the key is ``decided_key``) over the valid elements whose bits above the digit equal
    ``partial``."""
    if LOW_WORD:
        word = low
        group = valid & (key == decided_key)
    else:
        word = key
        group = valid
    shifted = word >> shift
    # Two shifts: for the first digit the bits above it are a shift by 32 (undefined).
    group = group & (((shifted >> (RADIX_BITS - 1)) >> 1) == partial)
    digit = (shifted & ((1 << RADIX_BITS) - 1)).to(tl.int32)
    return tl.histogram(digit, _radix_bins(RADIX_BITS), mask=group)


@triton.jit
def _choose_digit(counts, need):
    """The digit of the need-th largest element of the group, given the group's digit
    counts: (digit, count above it, count of it)."""
    bins = tl.arange(0, counts.numel)
    at_or_above = tl.cumsum(counts, 0, reverse=True)
    digit = tl.sum((at_or_above >= need).to(tl.int32), 0) - 1
    above = tl.sum(tl.where(bins > digit, counts, 0), 0)
    inside = tl.sum(tl.where(bins == digit, counts, 0), 0)
    return digit, above, inside


@triton.jit
def _source_block(start, row_ptr, cand_row_ptr, source_len, use_candidates,
                  IS_BF16: tl.constexpr, FROM_CANDIDATES: tl.constexpr, BLOCK: tl.constexpr):
    """Elements ``start .. start + BLOCK`` of the select kernel's source: (key, low, valid).
    The source is the row's candidate buffer when ``use_candidates``, else the row."""
    offsets = tl.arange(0, BLOCK)
    valid = offsets < source_len - start
    if FROM_CANDIDATES:
        if use_candidates:
            pair = tl.load(cand_row_ptr + start + offsets, mask=valid, other=0).to(
                tl.uint64, bitcast=True)
            key = (pair >> 32).to(tl.uint32)
            low = (pair & WORD_MASK).to(tl.uint32)
        else:
            key = _load_keys(row_ptr + start, offsets, valid, IS_BF16)
            low = ~(start + offsets).to(tl.uint32)
    else:
        key = _load_keys(row_ptr + start, offsets, valid, IS_BF16)
        low = ~(start + offsets).to(tl.uint32)
    return key, low, valid


@triton.jit
def _source_counts(row_ptr, cand_row_ptr, source_len, use_candidates, key0, low0, valid0,
                   decided_key, partial, shift, LOW_WORD: tl.constexpr, RADIX_BITS: tl.constexpr,
                   IS_BF16: tl.constexpr, FROM_CANDIDATES: tl.constexpr,
                   SINGLE_BLOCK: tl.constexpr, BLOCK: tl.constexpr):
    """``_digit_counts`` over the whole source (``key0, low0, valid0`` when
    ``SINGLE_BLOCK``, else read block by block)."""
    if SINGLE_BLOCK:
        counts = _digit_counts(key0, low0, valid0, decided_key, partial, shift, LOW_WORD,
                               RADIX_BITS)
    else:
        counts = tl.zeros([_radix_bins(RADIX_BITS)], tl.int32)
        for start in range(0, source_len, BLOCK):
            key, low, valid = _source_block(start, row_ptr, cand_row_ptr, source_len,
                                            use_candidates, IS_BF16, FROM_CANDIDATES, BLOCK)
            counts += _digit_counts(key, low, valid, decided_key, partial, shift, LOW_WORD,
                                    RADIX_BITS)
    return counts


@triton.jit
def _in_range(key, low, lo_key, lo_low, hi_key, hi_low):
    """``(lo_key, lo_low) <= (key, low) <= (hi_key, hi_low)``, pairs compared high word
    first."""
    above_lo = (key > lo_key) | ((key == lo_key) & (low >= lo_low))
    below_hi = (key < hi_key) | ((key == hi_key) & (low <= hi_low))
    return above_lo & below_hi


@triton.jit
def _write_range(dst_ptr, limit: tl.constexpr, lo_key, lo_low, hi_key, hi_low, row_ptr,
                 cand_row_ptr, source_len, use_candidates, key0, low0, valid0,
                 IS_BF16: tl.constexpr, FROM_CANDIDATES: tl.constexpr,
                 SINGLE_BLOCK: tl.constexpr, BLOCK: tl.constexpr):
    """Writes the source's pairs in ``[lo, hi]`` to ``dst[0 ..]`` in source order (the
    first ``limit`` of them)."""
    if SINGLE_BLOCK:
        take = valid0 & _in_range(key0, low0, lo_key, lo_low, hi_key, hi_low)
        position = tl.cumsum(take.to(tl.int32), 0) - 1
        tl.store(dst_ptr + position, _pair(key0, low0).to(tl.int64, bitcast=True),
                 mask=take & (position < limit))
    else:
        written = 0
        for start in range(0, source_len, BLOCK):
            key, low, valid = _source_block(start, row_ptr, cand_row_ptr, source_len,
                                            use_candidates, IS_BF16, FROM_CANDIDATES, BLOCK)
            take = valid & _in_range(key, low, lo_key, lo_low, hi_key, hi_low)
            position = written + tl.cumsum(take.to(tl.int32), 0) - 1
            tl.store(dst_ptr + position, _pair(key, low).to(tl.int64, bitcast=True),
                     mask=take & (position < limit))
            written += tl.sum(take.to(tl.int32), 0)


@triton.jit(do_not_specialize=["cols", "k", "sample_stride"])
def topk_sample_kernel(
    logits_ptr, row_stride, cols, lengths_ptr, k,
    sample_stride, threshold_ptr, cand_count_ptr, counts_ptr,
    IS_BF16: tl.constexpr,
    HAS_LENGTHS: tl.constexpr,
    CHUNK: tl.constexpr,
    SAMPLE_BLOCK: tl.constexpr,
    BITS: tl.constexpr,
    DIGIT_BITS: tl.constexpr,
    ZERO_BUCKETS: tl.constexpr,
    SHARED_SAMPLE: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    """Program (row): a key threshold for the filter kernel, to ``threshold[row]`` (int32
    holding the uint32 key), and the row's counters (``COUNTER_ROW``) zero; ``counts[row,
    :ZERO_BUCKETS] = 0`` (the count kernel's buckets).

    The sample is ``SAMPLE_BLOCK`` columns, chunks of ``CHUNK`` consecutive columns every
    ``sample_stride`` columns. With ``m`` of them eligible out of ``n``, about
    ``e = want * m / n`` are expected among the row's top ``want = min(k, n)``; the
    threshold is the key of the sample's ``r``-th largest element, ``r = e +
    MARGIN_SIGMAS * sqrt(e) + MARGIN_EXTRA``, rounded down to ``BITS`` bits past the
    sampled keys' common prefix (found ``DIGIT_BITS`` a pass from the top, each pass a
    compare with every value of the digit and one sum; a pass whose digit every sampled
    key at or above the threshold so far shares, before any pass that splits them, is
    free), so that the row's elements at or above it are usually a little more than
    ``want`` whatever the logits' offset: rounding to the key's top bits alone, logits of
    50 + N(0, 1) overflowed the candidates. 0 (every element) when the sample is too small
    for ``r``. With ``SHARED_SAMPLE`` (NVIDIA, one-bit passes) the same threshold comes
    from two passes of digit counts in shared memory (``_shared_threshold``).
    """
    wait_for_previous_kernel(USE_PDL)
    tl.static_assert(BITS % DIGIT_BITS == 0, "DIGIT_BITS must divide BITS")
    row = tl.program_id(0).to(tl.int64)
    n = _eligible_count(lengths_ptr, row, cols, HAS_LENGTHS)
    want = tl.minimum(n, k)
    i = tl.arange(0, SAMPLE_BLOCK)
    column = (i // CHUNK).to(tl.int64) * sample_stride + i % CHUNK  # past 2**31 for wide rows
    valid = column < n
    # Columns past the row get key 0, below every trial value that decides (each but a
    # digit 0, whose count is never read, is > 0): the passes compare keys only.
    key = tl.where(valid, _load_keys(logits_ptr + row * row_stride, column, valid, IS_BF16), 0)
    m = tl.sum(valid.to(tl.int32), 0)
    # Expected sample hits, rounded up, plus a few standard deviations and a constant.
    expected = ((want.to(tl.int64) * m + n - 1) // tl.maximum(n, 1)).to(tl.int32)
    spread = tl.sqrt(tl.maximum(expected, 0).to(tl.float32)) * MARGIN_SIGMAS
    rank = expected + spread.to(tl.int32) + MARGIN_EXTRA
    threshold = tl.zeros([], tl.uint32)
    if SHARED_SAMPLE:  # the same threshold by digit counts in shared memory (NVIDIA)
        tl.static_assert((DIGIT_BITS == 1) & (BITS <= 16), "the one-bit rule, 16 bits at most")
        largest, smallest = tl.reduce((key, tl.where(valid, key, WORD_MASK)), 0, _max_min)
        value = _shared_threshold(key, valid, rank, largest, smallest, BITS, SAMPLE_BLOCK)
        value = tl.where((want > 0) & (rank <= m), value, 0)
        tl.store(threshold_ptr + row + i * 0, value, mask=i == 0)  # (all the same)
    elif (want > 0) & (rank <= m):
        # The group: the sampled keys that agree with the threshold's decided digits, those
        # in [threshold, threshold + 2**(shift + DIGIT_BITS)); `above` of the sampled keys
        # lie at or above the threshold, `beyond` above the group (beyond < rank <= above).
        above = m
        beyond = tl.zeros([], tl.int32)
        spent = tl.zeros([], tl.int32)  # bits decided since the first pass that split the group
        split = m < 0  # False
        shift = tl.full([], 32 - DIGIT_BITS, tl.int32)
        while (spent < BITS) & (shift >= 0):
            if DIGIT_BITS == 1:  # a bit a pass: one trial value, one sum
                count = tl.sum((key >= (threshold | (1 << shift.to(tl.uint32)))).to(tl.int32), 0)
                digit = (count >= rank).to(tl.uint32)
                at = tl.where(count >= rank, count, above)  # keys at or above the chosen
                past = tl.where(count >= rank, beyond, count)  # keys past the chosen digit
            else:  # the counts at every value of the next digit in one sum
                digits = tl.arange(0, 1 << DIGIT_BITS).to(tl.uint32)
                trial = threshold | (digits << shift.to(tl.uint32))
                count = tl.sum((key[:, None] >= trial[None, :]).to(tl.int32), 0)
                # (At digit 0 the trial is the threshold: `above`, which the sum of a zero
                # threshold would exceed by the columns past the row.)
                count = tl.where(digits == 0, above, count)
                digit = tl.max(tl.where(count >= rank, digits, 0), 0)
                at = tl.sum(tl.where(digits == digit, count, 0), 0)
                past = tl.sum(tl.where(digits == digit + 1, count, 0), 0) + tl.where(
                    digit == (1 << DIGIT_BITS) - 1, beyond, 0)
            split = split | (at < above) | (past > beyond)
            spent += tl.where(split, DIGIT_BITS, 0)
            threshold |= digit << shift.to(tl.uint32)
            above = at
            beyond = past
            shift -= DIGIT_BITS
    if not SHARED_SAMPLE:
        tl.store(threshold_ptr + row, threshold.to(tl.int32, bitcast=True))
    tl.store(cand_count_ptr + row * COUNTER_ROW + tl.arange(0, 2) * MAX_KEY_FIELD,
             tl.zeros([2], tl.int32))
    if ZERO_BUCKETS > 0:
        tl.store(counts_ptr + row * (2 * ZERO_BUCKETS) + tl.arange(0, ZERO_BUCKETS),
                 tl.zeros([ZERO_BUCKETS], tl.int32))


@triton.jit
def _max_min(a_max, a_min, b_max, b_min):
    return tl.maximum(a_max, b_max), tl.minimum(a_min, b_min)


@triton.jit
def _shared_threshold(key, valid, rank, largest, smallest, BITS: tl.constexpr,
                      SAMPLE_BLOCK: tl.constexpr):
    """int32 ``[SAMPLE_BLOCK]``, every element the sample kernel's threshold of its keys
    (``shared_threshold_ptx``; NVIDIA only): ``largest`` and ``smallest`` of the ``valid``
    keys, the ``rank``-th largest of them to ``BITS`` bits past the bits those two share."""
    PACK: tl.constexpr = _elements_per_thread(SAMPLE_BLOCK, tl.extra.cuda.num_warps())
    zeros = tl.zeros([SAMPLE_BLOCK], tl.int32)
    return tl.inline_asm_elementwise(
        _shared_threshold_ptx(PACK), _shared_constraints(1, 6, PACK),
        [key.to(tl.int32, bitcast=True), valid.to(tl.int32), zeros + rank,
         zeros + largest.to(tl.int32, bitcast=True), zeros + smallest.to(tl.int32, bitcast=True),
         zeros + BITS], dtype=tl.int32, is_pure=False, pack=PACK)


@triton.jit
def _filter_block(row_ptr, block, end, offsets, IS_BF16: tl.constexpr, BLOCK: tl.constexpr):
    """The raw logits of columns ``block .. block + BLOCK`` (a vector load when the block
    is wholly below ``end``), and which of them are below ``end``."""
    live = offsets < (end - block).to(tl.int32)
    if block + BLOCK <= end:
        raw = tl.load(row_ptr + block + offsets)
    else:
        raw = tl.load(row_ptr + block + offsets, mask=live, other=0)
    return raw, live


@triton.jit(do_not_specialize=["cols", "capacity"])
def topk_filter_kernel(
    logits_ptr, row_stride, cols, lengths_ptr,
    split_cols, threshold_ptr, cand_ptr, cand_count_ptr, capacity,
    IS_BF16: tl.constexpr,
    HAS_LENGTHS: tl.constexpr,
    BLOCK: tl.constexpr,
    WARP_APPEND: tl.constexpr,
    TRACK_MAX: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    """Program (row, split): appends the pairs of columns ``[split * split_cols,
    (split + 1) * split_cols)`` whose key is at least ``threshold[row]`` to ``cand[row]``
    (int64 ``[rows, capacity]``), ``BLOCK`` columns a step, reserving room with one atomic
    add a step on the row's counter ``cand_count[row * COUNTER_ROW]`` (which ends as
    the row's candidate count, even past ``capacity``: only what fits is written). The
    order of the candidates varies from run to run; the result does not.

    With ``WARP_APPEND`` (NVIDIA), each warp reserves room for its own
    candidates (``_warp_append``: ballots and one atomic add per eight elements a thread),
    instead of the block's sum, atomic and scan with their barriers and shared memory.

    With ``TRACK_MAX``, the program's largest candidate key also goes to the row's
    ``MAX_KEY_FIELD`` counter by an atomic max (the count kernel's bucket range).

    Each step's block is loaded a step ahead, so that the load is in flight while the step
    before waits for its atomic (``split_cols`` is a multiple of ``BLOCK``)."""
    wait_for_previous_kernel(USE_PDL)
    row = tl.program_id(0).to(tl.int64)
    split = tl.program_id(1)
    n = _eligible_count(lengths_ptr, row, cols, HAS_LENGTHS)
    threshold = tl.load(threshold_ptr + row).to(tl.uint32, bitcast=True)
    row_ptr = logits_ptr + row * row_stride
    cand_row_ptr = cand_ptr + row * capacity
    counter_ptr = cand_count_ptr + row * COUNTER_ROW
    start = split.to(tl.int64) * split_cols
    end = tl.minimum(start + split_cols, n)
    offsets = tl.arange(0, BLOCK)
    largest = tl.zeros([BLOCK], tl.uint32)  # TRACK_MAX: the taken keys' running maximum
    next_raw, next_live = _filter_block(row_ptr, start, end, offsets, IS_BF16, BLOCK)
    for block in range(start, end, BLOCK):
        raw, live = next_raw, next_live
        next_raw, next_live = _filter_block(row_ptr, block + BLOCK, end, offsets, IS_BF16, BLOCK)
        key = _keys_of_raw(raw, IS_BF16)
        take = live & (key >= threshold)
        if TRACK_MAX:
            largest = tl.maximum(largest, tl.where(take, key, 0))
        if WARP_APPEND:
            _warp_append(take, key, ~(block + offsets).to(tl.uint32), cand_row_ptr, counter_ptr,
                         capacity)
        else:
            taken = tl.sum(take.to(tl.int32), 0)
            if taken > 0:
                base = tl.atomic_add(counter_ptr, taken, sem="relaxed")
                position = base + _positions(take, BLOCK)
                kept = take & (position < capacity)
                pair = _pair(key, ~(block + offsets).to(tl.uint32))
                tl.store(cand_row_ptr + position, pair.to(tl.int64, bitcast=True), mask=kept)
    if TRACK_MAX:
        top_key = tl.max(largest, 0)
        if top_key > 0:  # a candidate key (every key but NaN's is above 0)
            tl.atomic_max((counter_ptr + MAX_KEY_FIELD).to(tl.pointer_type(tl.uint32)),
                          top_key, sem="relaxed")


@triton.jit
def _radix_survivors(want, row_ptr, cand_row_ptr, source_len, use_candidates, scratch_row_ptr,
                     low_skip, IS_BF16: tl.constexpr, FROM_CANDIDATES: tl.constexpr,
                     SINGLE_BLOCK: tl.constexpr, BLOCK: tl.constexpr,
                     SORT_BLOCK: tl.constexpr, RADIX_BITS: tl.constexpr, COMPACT: tl.constexpr):
    """Radix selection of the source's ``want`` largest pairs (``want >= 1``), written to
    ``scratch_row[:want]`` in source order."""
    DIGITS: tl.constexpr = 32 // RADIX_BITS
    slots = tl.arange(0, SORT_BLOCK)
    if SINGLE_BLOCK:
        key0, low0, valid0 = _source_block(0, row_ptr, cand_row_ptr, source_len,
                                           use_candidates, IS_BF16, False, BLOCK)
    else:  # not read
        key0, low0, valid0 = want.to(tl.uint32), want.to(tl.uint32), want < 0
    # Radix selection of the want-th largest pair, key digits first. Invariant:
    # 1 <= need <= the size of the group (the pairs whose decided digits equal the
    # prefix); every pair above the group is a survivor.
    need = want
    decided_key = tl.zeros([], tl.uint32)  # the key's digits decided so far
    threshold_key = tl.zeros([], tl.uint32)
    threshold_low = tl.zeros([], tl.uint32)
    searching = want > 0
    # COMPACT: once the group fits SORT_BLOCK, it is copied to the scratch row and the
    # remaining passes read that copy (in registers) instead of the whole source.
    compacted = want < 0
    group_key = tl.zeros([SORT_BLOCK], tl.uint32)
    group_low = tl.zeros([SORT_BLOCK], tl.uint32)
    group_valid = slots < 0
    for word in tl.static_range(2):
        if word == 0:
            first = 0
            partial = tl.zeros([], tl.uint32)
        else:
            first = low_skip
            partial = tl.cast((1 << (RADIX_BITS * low_skip)) - 1, tl.uint32)
        for d in range(first, DIGITS):
            if searching:
                shift = tl.cast(32 - RADIX_BITS * (d + 1), tl.uint32)
                if compacted:
                    counts = _digit_counts(group_key, group_low, group_valid, decided_key,
                                           partial, shift, word == 1, RADIX_BITS)
                else:
                    counts = _source_counts(
                        row_ptr, cand_row_ptr, source_len, use_candidates, key0, low0,
                        valid0, decided_key, partial, shift, word == 1, RADIX_BITS, IS_BF16,
                        FROM_CANDIDATES, SINGLE_BLOCK, BLOCK)
                digit, above, inside = _choose_digit(counts, need)
                need -= above
                partial = (partial << RADIX_BITS) | digit.to(tl.uint32)
                # When need equals the digit's count the whole bucket is taken: the
                # threshold is the prefix followed by zero bits.
                searching = inside != need
                below = (tl.full([], 1, tl.uint32) << shift) - 1  # the undecided bits
                if word == 0:
                    decided_key = partial
                    threshold_key = partial << shift
                    # The group: keys with these top bits, any column.
                    lo_key, lo_low = threshold_key, tl.zeros([], tl.uint32)
                    hi_key, hi_low = threshold_key | below, tl.full([], WORD_MASK, tl.uint32)
                else:
                    threshold_low = partial << shift
                    # The group: this key, columns with these top bits of ~column.
                    lo_key, lo_low = decided_key, threshold_low
                    hi_key, hi_low = decided_key, threshold_low | below
                if COMPACT:
                    if searching & (~compacted) & (inside <= SORT_BLOCK):
                        _write_range(scratch_row_ptr, SORT_BLOCK, lo_key, lo_low, hi_key,
                                     hi_low, row_ptr, cand_row_ptr, source_len,
                                     use_candidates, key0, low0, valid0, IS_BF16,
                                     FROM_CANDIDATES, SINGLE_BLOCK, BLOCK)
                        tl.debug_barrier()
                        pair = tl.load(scratch_row_ptr + slots, mask=slots < inside, other=0,
                                       cache_modifier=".cg").to(tl.uint64, bitcast=True)
                        group_key = (pair >> 32).to(tl.uint32)
                        group_low = (pair & WORD_MASK).to(tl.uint32)
                        group_valid = slots < inside
                        compacted = inside >= 0  # True

    # The survivors (exactly want of them: the pairs at or above the threshold) into
    # the scratch row, once every thread is done with the group's copy there.
    tl.debug_barrier()
    _write_range(scratch_row_ptr, SORT_BLOCK, threshold_key, threshold_low, WORD_MASK,
                 WORD_MASK, row_ptr, cand_row_ptr, source_len, use_candidates, key0, low0,
                 valid0, IS_BF16, FROM_CANDIDATES, SINGLE_BLOCK, BLOCK)



@triton.jit
def _shift_for(span, BLOCK: tl.constexpr):
    """The smallest ``shift`` with ``span >> shift < BLOCK`` (uint64), by halving steps."""
    shift = tl.zeros([], tl.uint64)
    for step in tl.static_range(5, -1, -1):  # 32, 16, ..., 1: at most 63 in all
        wider = (span >> (shift + (1 << step))) >= BLOCK
        shift += tl.where(wider, 1 << step, 0).to(tl.uint64)
    return shift + ((span >> shift) >= BLOCK).to(tl.uint64)


@triton.jit
def _bucket_of(pair, top, shift, BUCKETS: tl.constexpr):
    """Pair ``x``'s bucket, ``(top - x) >> shift``: larger pairs, lower buckets; pairs
    above ``top`` in bucket 0, and none past the last."""
    below = tl.where(pair < top, top - pair, 0)
    return tl.minimum(below >> shift, BUCKETS - 1).to(tl.int32)


@triton.jit
def _buckets(pair, valid, BLOCK: tl.constexpr):
    """(top, shift, bucket): ``BLOCK`` buckets from the largest ``valid`` pair to the
    smallest, and each pair's (0 for the others)."""
    top = tl.max(tl.where(valid, pair, 0), 0)
    bottom = ~tl.max(tl.where(valid, ~pair, 0), 0)
    shift = _shift_for(top - bottom, BLOCK)
    return top, shift, tl.where(valid, _bucket_of(pair, top, shift, BLOCK), 0)


@triton.jit
def _place(pair, valid, want, counts_row_ptr, sorted_row_ptr, meta_row_ptr,
           BLOCK: tl.constexpr, SHARED_SLOTS: tl.constexpr):
    """Writes the ``valid`` pairs of ``pair`` (uint64 ``[BLOCK]``) to ``sorted_row`` (int64
    ``[BLOCK]``) bucket by bucket, over ``BLOCK`` buckets from the largest pair to the
    smallest, counted here by atomic adds (``_write_placed`` does the rest): in shared
    memory with ``SHARED_SLOTS`` (``_shared_slots``), else on ``counts_row``."""
    top, shift, bucket = _buckets(pair, valid, BLOCK)
    bins = tl.arange(0, BLOCK)
    if SHARED_SLOTS:
        slot, count = _shared_slots(bucket, bins, valid, BLOCK, 4 * BLOCK)
        tl.store(counts_row_ptr + bins, count)  # for the rank kernel
    else:
        tl.store(counts_row_ptr + bins, tl.zeros([BLOCK], tl.int32))
        tl.debug_barrier()
        # The old count is the pair's slot in its bucket (atomics give every pair its own).
        slot = tl.atomic_add(counts_row_ptr + bucket, tl.full([BLOCK], 1, tl.int32),
                             mask=valid, sem="relaxed")
        tl.debug_barrier()
        count = tl.load(counts_row_ptr + bins, cache_modifier=".cg")
    _write_placed(pair, valid, bucket, slot, count, top, shift, want, counts_row_ptr,
                  sorted_row_ptr, meta_row_ptr, BLOCK)


# The select kernel's shared array (inline PTX): declared once at function scope by the
# slots statement. A second copy of the declaration (Triton splitting a thread's elements
# over two statements) fails to assemble instead of counting twice.
SHARED_ARRAY = "topk_shared"


def shared_slots_ptx(pack: int, array_bytes: int) -> str:
    """PTX of ``_shared_slots`` for ``pack`` elements a thread, counting into the first 4
    bytes a bucket of an ``array_bytes`` shared array it declares (a counter for each
    index of ``bins``).

    Operands: ``pack`` slots and ``pack`` counts (results), then ``pack`` each of: the
    elements' buckets, their indices (``bins``), whether they count. The counters are
    static shared memory of the kernel's own, which no Triton operation touches: zeroed
    through ``bins`` (every counter is some thread's element), a barrier, one shared atomic
    add per counted element (the old value is its slot), a barrier, each element's
    counter read back through ``bins``, and a barrier before anything writes there
    again."""
    slot, count, bucket, index, take = (pack * i for i in range(5))
    lines = [f".shared .align 16 .b8 {SHARED_ARRAY}[{array_bytes}];", "{",
             ".reg .pred p;", ".reg .b32 base, address;", f"mov.u32 base, {SHARED_ARRAY};"]
    for e in range(pack):
        lines += [f"mad.lo.u32 address, ${index + e}, 4, base;", "st.shared.u32 [address], 0;"]
    lines.append("bar.sync 0;")
    for e in range(pack):
        lines += [f"setp.ne.u32 p, ${take + e}, 0;", f"mad.lo.u32 address, ${bucket + e}, 4, base;",
                  f"mov.u32 ${slot + e}, 0;", f"@p atom.shared.add.u32 ${slot + e}, [address], 1;"]
    lines.append("bar.sync 0;")
    for e in range(pack):
        lines += [f"mad.lo.u32 address, ${index + e}, 4, base;",
                  f"ld.shared.u32 ${count + e}, [address];"]
    lines += ["bar.sync 0;", "}"]
    return "\n".join(lines)


# The sample threshold statement's shared words: 256 digit counts, 16 sums of 16 of them,
# the chosen digit and the count above it.
_THRESHOLD_BINS = 256
_THRESHOLD_SUMS = _THRESHOLD_BINS * 4  # byte offsets
_THRESHOLD_CHOICE = _THRESHOLD_SUMS + 16 * 4


def shared_threshold_ptx(pack: int) -> str:
    """PTX of ``_shared_threshold`` for ``pack`` keys a thread: the sample kernel's threshold
    (``reference.topk.sample_threshold_from_prefix``) from two passes of 8-bit digit
    counts in shared memory, instead of a block-wide sum for each of its bits.

    Operands: ``pack`` thresholds (results, all the same), then ``pack`` each of: the keys,
    whether they count, the rank, the largest and the smallest counted key, the bits (the
    last four the same in each). The counted keys are shifted left past the bits the
    largest and the smallest share (``shared``; a shift by 32 gives 0 in PTX). Each pass
    counts the keys of the group (every counted key, then those whose first digit is the
    chosen one) by their next 8 bits with shared atomic adds (one a warp and digit:
    ``match.any``), sums the counts 16 at a time, and the one digit whose count above it
    is below the rank still needed and reaches it with its own count is written out;
    barriers between. The threshold is the largest key's shared bits and the two digits,
    rounded to ``bits`` of them."""
    key, take, rank, largest, smallest, bits = (pack * (1 + i) for i in range(6))
    sums, choice = _THRESHOLD_SUMS, _THRESHOLD_CHOICE
    # (A function-scope name: a second copy of the statement fails to assemble.)
    lines = [".reg .b32 topk_threshold_once;", "{",
             f".shared .align 16 .b32 topk_bins[{_THRESHOLD_BINS + 16 + 2}];",
             ".reg .pred p, q;",
             ".reg .b32 base, address, tid, threads, shared, need, chosen, digit, word, b, g, "
             f"above, count, limit, t, lanes, rel<{pack}>;",
             "mov.u32 base, topk_bins;", "mov.u32 tid, %tid.x;", "mov.u32 threads, %ntid.x;",
             f"xor.b32 word, ${largest}, ${smallest};", "clz.b32 shared, word;"]
    lines += [f"shl.b32 rel{e}, ${key + e}, shared;" for e in range(pack)]
    lines += [f"mov.u32 need, ${rank};", "mov.u32 chosen, 0;"]
    for n in (1, 2):
        lines += ["mov.u32 b, tid;", f"zero_{n}:",
                  f"setp.ge.u32 p, b, {_THRESHOLD_BINS + 16};", f"@p bra zero_done_{n};",
                  "mad.lo.u32 address, b, 4, base;", "st.shared.u32 [address], 0;",
                  "add.u32 b, b, threads;", f"bra zero_{n};", f"zero_done_{n}:", "bar.sync 0;"]
        for e in range(pack):
            if n == 1:
                lines += [f"setp.ne.u32 p, ${take + e}, 0;", f"shr.u32 digit, rel{e}, 24;"]
            else:
                lines += [f"shr.u32 word, rel{e}, 24;", "setp.eq.u32 p, word, chosen;",
                          f"setp.ne.and.u32 p, ${take + e}, 0, p;", f"shr.u32 digit, rel{e}, 16;",
                          "and.b32 digit, digit, 255;"]
            # Lanes of a digit add together: the lowest adds their number (the digits of
            # the sample's top bits are few, and same-address atomics queue).
            lines += ["selp.b32 word, digit, 4294967295, p;",
                      "match.any.sync.b32 t, word, 4294967295;", "mov.u32 lanes, %lanemask_lt;",
                      "and.b32 lanes, lanes, t;", "setp.eq.and.u32 q, lanes, 0, p;",
                      "popc.b32 count, t;", "mad.lo.u32 address, digit, 4, base;",
                      "@q red.shared.add.u32 [address], count;"]
        lines += ["bar.sync 0;",
                  # Sums of 16 counts, one a thread (or more, fewer threads than sums).
                  "mov.u32 g, tid;", f"sums_{n}:", "setp.ge.u32 p, g, 16;", f"@p bra sums_done_{n};",
                  "mov.u32 count, 0;", "mul.lo.u32 b, g, 16;", "add.u32 limit, b, 16;",
                  f"sum_{n}:", "setp.ge.u32 q, b, limit;", f"@q bra sum_done_{n};",
                  "mad.lo.u32 address, b, 4, base;", "ld.shared.u32 t, [address];",
                  "add.u32 count, count, t;", "add.u32 b, b, 1;", f"bra sum_{n};", f"sum_done_{n}:",
                  "mad.lo.u32 address, g, 4, base;", f"st.shared.u32 [address+{sums}], count;",
                  "add.u32 g, g, threads;", f"bra sums_{n};", f"sums_done_{n}:", "bar.sync 0;",
                  # Each digit: the count above it (later sums, then its sum's later digits).
                  "mov.u32 b, tid;", f"digits_{n}:", f"setp.ge.u32 p, b, {_THRESHOLD_BINS};",
                  f"@p bra digits_done_{n};", "mov.u32 above, 0;", "shr.u32 g, b, 4;",
                  "add.u32 g, g, 1;", f"later_sums_{n}:", "setp.ge.u32 q, g, 16;",
                  f"@q bra later_sums_done_{n};", "mad.lo.u32 address, g, 4, base;",
                  f"ld.shared.u32 t, [address+{sums}];", "add.u32 above, above, t;",
                  "add.u32 g, g, 1;", f"bra later_sums_{n};", f"later_sums_done_{n}:",
                  "add.u32 g, b, 1;", "or.b32 limit, b, 15;", "add.u32 limit, limit, 1;",
                  f"later_digits_{n}:", "setp.ge.u32 q, g, limit;",
                  f"@q bra later_digits_done_{n};", "mad.lo.u32 address, g, 4, base;",
                  "ld.shared.u32 t, [address];", "add.u32 above, above, t;", "add.u32 g, g, 1;",
                  f"bra later_digits_{n};", f"later_digits_done_{n}:",
                  "mad.lo.u32 address, b, 4, base;", "ld.shared.u32 count, [address];",
                  "setp.lt.u32 q, above, need;", "add.u32 t, above, count;",
                  "setp.le.and.u32 q, need, t, q;", f"add.u32 address, base, {choice};",
                  "@q st.shared.u32 [address], b;", "@q st.shared.u32 [address+4], above;",
                  "add.u32 b, b, threads;", f"bra digits_{n};", f"digits_done_{n}:", "bar.sync 0;",
                  f"add.u32 address, base, {choice};", "ld.shared.u32 digit, [address];",
                  "ld.shared.u32 above, [address+4];", "sub.u32 need, need, above;"]
        # (No barrier after the read: the choice is written again only after the next
        # pass's third barrier, and the counts are not read after it.)
        lines += ["mov.u32 chosen, digit;"] if n == 1 else [
            "shl.b32 chosen, chosen, 8;", "or.b32 chosen, chosen, digit;"]
    # The two digits rounded to `bits`, under the shared bits of the largest key.
    lines += ["mov.u32 t, 16;", f"sub.u32 t, t, ${bits};", "mov.u32 word, 65535;",
              "shl.b32 word, word, t;", "and.b32 chosen, chosen, word;",
              "shl.b32 chosen, chosen, 16;", "shr.u32 chosen, chosen, shared;",
              "mov.u32 word, 4294967295;", "shr.u32 word, word, shared;", "not.b32 word, word;",
              f"and.b32 word, word, ${largest};"]
    lines += [f"or.b32 ${e}, chosen, word;" for e in range(pack)]
    lines.append("}")
    return "\n".join(lines)


# (Plain functions above, for tests that run the statements on an emulated block.)
_shared_slots_ptx = triton.constexpr_function(shared_slots_ptx)
_shared_threshold_ptx = triton.constexpr_function(shared_threshold_ptx)


@triton.constexpr_function
def _shared_constraints(outputs, inputs, pack):
    return ",".join(["=r"] * (outputs * pack) + ["r"] * (inputs * pack))


@triton.constexpr_function
def _elements_per_thread(block, warps):
    return block // (32 * warps)


@triton.jit
def _shared_slots(bucket, bins, valid, BLOCK: tl.constexpr, ARRAY_BYTES: tl.constexpr):
    """(slot, count) int32 ``[BLOCK]``: each ``valid`` element's slot in its ``bucket``
    (the number of elements counted there before it, in no fixed order) and the count of
    bucket ``bins[i]``, by atomic adds on shared memory (NVIDIA only; one PTX statement a
    thread: ``BLOCK`` a whole multiple of the program's threads). Declares the kernel's
    shared array, ``ARRAY_BYTES`` long."""
    PACK: tl.constexpr = _elements_per_thread(BLOCK, tl.extra.cuda.num_warps())
    return tl.inline_asm_elementwise(
        _shared_slots_ptx(PACK, ARRAY_BYTES), _shared_constraints(2, 3, PACK),
        [bucket, bins, valid.to(tl.int32)], dtype=(tl.int32, tl.int32), is_pure=False,
        pack=PACK)


@triton.jit
def _write_placed(pair, valid, bucket, slot, count, top, shift, want, counts_row_ptr,
                  sorted_row_ptr, meta_row_ptr, BLOCK: tl.constexpr):
    """Writes the ``valid`` pairs, each of ``bucket`` (``_bucket_of(pair, top, shift)``)
    with its own ``slot`` there, to ``sorted_row`` bucket by bucket, given the buckets'
    ``count`` (already in ``counts_row[:BLOCK]``, int32); the buckets' starts to
    ``counts_row[BLOCK:]``, and to ``meta_row`` (int64 ``[4]``) ``top``, ``shift``, the
    number of pairs in the buckets that start below ``want`` (where every rank below
    ``want`` lies), and ``want``."""
    bins = tl.arange(0, BLOCK)
    start = tl.cumsum(count, 0) - count
    tl.store(counts_row_ptr + BLOCK + bins, start)  # for the rank kernel
    # Each pair's bucket start from registers (through shared memory), not read back.
    first = tl.gather(start, bucket, 0)
    tl.store(sorted_row_ptr + first + slot, pair.to(tl.int64, bitcast=True), mask=valid)
    _store_range(meta_row_ptr, top, shift)
    _store_extent(meta_row_ptr, start, count, want)


@triton.jit
def _store_range(meta_row_ptr, top, shift):
    """``meta_row[:2] = top, shift``: the bucket range."""
    field = tl.arange(0, 2)
    tl.store(meta_row_ptr + field,
             tl.where(field == 0, top.to(tl.int64, bitcast=True), shift.to(tl.int64)))


@triton.jit
def _store_extent(meta_row_ptr, start, count, want):
    """``meta_row[2:4] = end, want``: ``end`` the number of pairs in the buckets (``start``,
    ``count``) that start below ``want``, where every rank below ``want`` lies."""
    end = tl.sum(tl.where(start < want, count, 0), 0)
    field = tl.arange(0, 2)
    tl.store(meta_row_ptr + 2 + field, tl.where(field == 0, end, want).to(tl.int64))


@triton.jit
def _fill_unranked(out_row_ptr, want, k, WIDTH: tl.constexpr):
    """``out_row[want:k] = -1`` (no column), ``WIDTH`` a step; counted in int64, as ``k``
    may lie within a step of ``2**31``."""
    for first in range(0, k.to(tl.int64), WIDTH):
        rank = first + tl.arange(0, WIDTH)
        tl.store(out_row_ptr + rank, tl.full([WIDTH], -1, tl.int32),
                 mask=(rank >= want) & (rank < k))


@triton.jit(do_not_specialize=["cols", "k", "capacity", "low_skip"])
def topk_select_kernel(
    logits_ptr, row_stride, cols, lengths_ptr, k, low_skip,
    cand_ptr, cand_count_ptr, capacity,
    scratch_ptr, counts_ptr, meta_ptr, out_ptr, out_row_stride,
    IS_BF16: tl.constexpr,
    HAS_LENGTHS: tl.constexpr,
    FROM_CANDIDATES: tl.constexpr,
    BLOCK: tl.constexpr,
    STREAM_BLOCK: tl.constexpr,
    RADIX_BITS: tl.constexpr,
    SHARED_SLOTS: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    """Program (row): the pairs that ``topk_rank_kernel`` ranks, placed bucket by bucket
    (``_place``), for the row's ``want = min(k, eligible)`` first ranks; ``out[row, want:k]
    = -1``.

    The pairs (at most ``BLOCK``, a power of two ``>= min(k, cols)``):
    ``cand[row, :count]`` (``count = cand_count[row * COUNTER_ROW]``) when
    ``FROM_CANDIDATES`` and that count lies in
    ``[want, capacity]`` (``capacity <= BLOCK``); else the row's eligible columns when
    they fit ``BLOCK``; else the row's top ``want``, found by radix selection streamed
    from the row ``STREAM_BLOCK`` columns a step. ``scratch`` (int64 ``[rows, BLOCK]``:
    the radix selection's survivors, then the placed pairs), ``counts`` (int32 ``[rows, 2 *
    BLOCK]``) and ``meta`` (int64 ``[rows, 4]``) are for the rank kernel.

    ``low_skip``: leading digits of ``~column`` that are all ones for every column
    (``cols <= 2**(32 - RADIX_BITS * low_skip)``), at most ``32 // RADIX_BITS - 1``: the
    radix tie passes start below them.

    NVIDIA only: with ``SHARED_SLOTS`` the pairs are counted into their buckets in shared
    memory (``_shared_slots``) instead of on ``counts``.
    """
    wait_for_previous_kernel(USE_PDL)
    tl.static_assert(32 % RADIX_BITS == 0, "RADIX_BITS must divide 32")
    row = tl.program_id(0).to(tl.int64)
    n = _eligible_count(lengths_ptr, row, cols, HAS_LENGTHS)
    want = tl.minimum(n, k)
    row_ptr = logits_ptr + row * row_stride
    scratch_row_ptr = scratch_ptr + row * BLOCK
    i = tl.arange(0, BLOCK)
    use_candidates = want < 0  # False
    cand_count = n
    cand = tl.zeros([BLOCK], tl.uint64)  # not read unless FROM_CANDIDATES
    counts_row_ptr = counts_ptr + row * (2 * BLOCK)
    meta_row_ptr = meta_ptr + row * 4
    if FROM_CANDIDATES:
        # The whole buffer is asked for with the count, not after it (a round trip less);
        # what lies past the count is masked below.
        cand = tl.load(cand_ptr + row * capacity + i, mask=i < capacity, other=0).to(
            tl.uint64, bitcast=True)
        cand_count = tl.load(cand_count_ptr + row * COUNTER_ROW)
        use_candidates = (cand_count >= want) & (cand_count <= capacity)
    if use_candidates:
        valid = i < cand_count
        pair = tl.where(valid, cand, 0)
    elif n <= BLOCK:
        valid = i < n
        pair = _pair(_load_keys(row_ptr, i, valid, IS_BF16), ~i.to(tl.uint32))
    else:
        _radix_survivors(want, row_ptr, row_ptr, n, use_candidates, scratch_row_ptr,
                         low_skip, IS_BF16, False, False, STREAM_BLOCK, BLOCK,
                         RADIX_BITS, True)
        tl.debug_barrier()  # the survivors, written by every thread of the program
        valid = i < want
        pair = tl.load(scratch_row_ptr + i, mask=valid, other=0, cache_modifier=".cg").to(
            tl.uint64, bitcast=True)
    # The survivors are in registers: every thread is past them before _place writes.
    _place(pair, valid, want, counts_row_ptr, scratch_row_ptr, meta_row_ptr, BLOCK,
           SHARED_SLOTS)
    _fill_unranked(out_ptr + row * out_row_stride, want, k, BLOCK)


@triton.jit(do_not_specialize=["cols", "k", "capacity", "low_skip"])
def topk_count_kernel(
    logits_ptr, row_stride, cols, lengths_ptr, k, low_skip,
    threshold_ptr, cand_ptr, cand_count_ptr, capacity, cand_slot_ptr, counts_ptr, meta_ptr,
    IS_BF16: tl.constexpr,
    HAS_LENGTHS: tl.constexpr,
    BLOCK: tl.constexpr,
    PART: tl.constexpr,
    RADIX_BITS: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    """Program (row, part): counts the candidates ``part * PART ..`` of ``cand[row]`` into
    ``BLOCK`` buckets (``counts[row, :BLOCK]``, zeroed by the sample kernel) by atomic adds,
    each candidate's old count (its slot in its bucket) to ``cand_slot`` beside it, so that
    ``topk_place_kernel`` places them without atomics; spread over several programs a row
    where ``topk_select_kernel`` has one.

    The buckets cut the range from the row's largest candidate key (``TRACK_MAX`` of the
    filter kernel: no pair lies above it) down to the threshold, into ``meta[row, :2]``
    (``top``, ``shift``, as ``_place`` sets them). A row whose candidates are fewer than
    ``want = min(k, eligible)`` or past ``capacity`` is left to its program 0: it writes
    the row's top ``want`` pairs to ``cand[row, :want]`` by radix selection streamed from
    the row ``PART`` columns a step, then counts them over their own range, ``PART`` a
    step (its other programs return)."""
    wait_for_previous_kernel(USE_PDL)
    row = tl.program_id(0).to(tl.int64)
    part = tl.program_id(1)
    n = _eligible_count(lengths_ptr, row, cols, HAS_LENGTHS)
    want = tl.minimum(n, k)
    counter_ptr = cand_count_ptr + row * COUNTER_ROW
    cand_row_ptr = cand_ptr + row * capacity
    slot_row_ptr = cand_slot_ptr + row * capacity
    counts_row_ptr = counts_ptr + row * (2 * BLOCK)
    meta_row_ptr = meta_ptr + row * 4
    i = part * PART + tl.arange(0, PART)
    # The candidates are asked for with their count (a round trip less); past it, masked.
    pair = tl.load(cand_row_ptr + i, mask=i < capacity, other=0).to(tl.uint64, bitcast=True)
    cand_count = tl.load(counter_ptr)
    top_key = tl.load(counter_ptr + MAX_KEY_FIELD).to(tl.uint32, bitcast=True)
    threshold = tl.load(threshold_ptr + row).to(tl.uint32, bitcast=True)
    if (cand_count >= want) & (cand_count <= capacity):
        top = _pair(top_key, tl.full([], WORD_MASK, tl.uint32))
        bottom = threshold.to(tl.uint64) << 32  # at or below every candidate
        shift = _shift_for(tl.where(top > bottom, top - bottom, 0), BLOCK)
        valid = i < cand_count
        bucket = tl.where(valid, _bucket_of(pair, top, shift, BLOCK), 0)
        slot = tl.atomic_add(counts_row_ptr + bucket, tl.full([PART], 1, tl.int32), mask=valid,
                             sem="relaxed")
        tl.store(slot_row_ptr + i, slot, mask=valid)
        if part == 0:
            _store_range(meta_row_ptr, top, shift)
    elif part == 0:
        row_ptr = logits_ptr + row * row_stride
        _radix_survivors(want, row_ptr, row_ptr, n, False, cand_row_ptr, low_skip, IS_BF16,
                         False, False, PART, BLOCK, RADIX_BITS, False)
        tl.debug_barrier()  # the survivors, written by every thread of the program
        lanes = tl.arange(0, PART)
        top = tl.zeros([], tl.uint64)
        bottom = tl.full([], WORD_MASK, tl.uint64) << 32 | WORD_MASK
        for first in range(0, want, PART):
            valid = first + lanes < want
            pair = tl.load(cand_row_ptr + first + lanes, mask=valid, other=0,
                           cache_modifier=".cg").to(tl.uint64, bitcast=True)
            top = tl.maximum(top, tl.max(tl.where(valid, pair, 0), 0))
            bottom = tl.minimum(bottom, ~tl.max(tl.where(valid, ~pair, 0), 0))
        shift = _shift_for(top - bottom, BLOCK)
        for first in range(0, want, PART):
            valid = first + lanes < want
            pair = tl.load(cand_row_ptr + first + lanes, mask=valid, other=0,
                           cache_modifier=".cg").to(tl.uint64, bitcast=True)
            bucket = tl.where(valid, _bucket_of(pair, top, shift, BLOCK), 0)
            slot = tl.atomic_add(counts_row_ptr + bucket, tl.full([PART], 1, tl.int32),
                                 mask=valid, sem="relaxed")
            tl.store(slot_row_ptr + first + lanes, slot, mask=valid)
        _store_range(meta_row_ptr, top, shift)


@triton.jit(do_not_specialize=["cols", "k", "capacity"])
def topk_place_kernel(
    cols, lengths_ptr, k, cand_ptr, cand_count_ptr, capacity, cand_slot_ptr,
    scratch_ptr, counts_ptr, meta_ptr, out_ptr, out_row_stride,
    HAS_LENGTHS: tl.constexpr,
    BLOCK: tl.constexpr,
    PART: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    """Program (row, part): writes the pairs ``part * PART ..`` that ``topk_count_kernel``
    counted (``cand[row, :count]``, ``count`` the candidates', or ``want`` where the count
    kernel selected them) to ``scratch[row]`` bucket by bucket, at their bucket's start
    (the prefix sum of ``counts[row, :BLOCK]``, which every program of the row takes) plus
    their slot; the bucket starts of its share of the buckets to ``counts[row, BLOCK:]``;
    program 0 the rest of ``meta[row]`` (as ``_write_placed``) and ``out[row, want:k] =
    -1``. What ``topk_rank_kernel`` reads, as the select kernel leaves it."""
    wait_for_previous_kernel(USE_PDL)
    row = tl.program_id(0).to(tl.int64)
    part = tl.program_id(1)
    n = _eligible_count(lengths_ptr, row, cols, HAS_LENGTHS)
    want = tl.minimum(n, k)
    i = part * PART + tl.arange(0, PART)
    bins = tl.arange(0, BLOCK)
    counts_row_ptr = counts_ptr + row * (2 * BLOCK)
    meta_row_ptr = meta_ptr + row * 4
    # Everything asked for at once: what lies past the count is masked below.
    pair = tl.load(cand_ptr + row * capacity + i, mask=i < capacity, other=0).to(
        tl.uint64, bitcast=True)
    slot = tl.load(cand_slot_ptr + row * capacity + i, mask=i < capacity, other=0)
    count = tl.load(counts_row_ptr + bins)
    top = tl.load(meta_row_ptr).to(tl.uint64, bitcast=True)
    shift = tl.load(meta_row_ptr + 1).to(tl.uint64)
    cand_count = tl.load(cand_count_ptr + row * COUNTER_ROW)
    placed = tl.where((cand_count >= want) & (cand_count <= capacity), cand_count, want)
    valid = i < placed
    bucket = tl.where(valid, _bucket_of(pair, top, shift, BLOCK), 0)
    start = tl.cumsum(count, 0) - count
    tl.store(counts_row_ptr + BLOCK + bins, start, mask=bins // PART == part)  # its share
    first = tl.gather(start, bucket, 0)
    tl.store(scratch_ptr + row * BLOCK + first + slot, pair.to(tl.int64, bitcast=True),
             mask=valid)
    if part == 0:
        _store_extent(meta_row_ptr, start, count, want)
        _fill_unranked(out_ptr + row * out_row_stride, want, k, PART)


@triton.jit
def _rank_chunk(x, p, end, want, top, shift, counts_row_ptr, sorted_row_ptr, out_row_ptr,
                BLOCK: tl.constexpr, WIDTH: tl.constexpr):
    """Ranks the placed pairs ``x`` at positions ``p`` of the sorted row (those below
    ``end``) and writes ``out_row[rank] = column`` for the ranks below ``want``."""
    live = p < end
    x = tl.where(live, x, 0)
    b = tl.where(live, _bucket_of(x, top, shift, BLOCK), 0)
    b_start = tl.load(counts_row_ptr + BLOCK + b, mask=live, other=0)
    b_count = tl.load(counts_row_ptr + b, mask=live, other=0)
    above = tl.zeros_like(b_start)
    lanes = tl.arange(0, WIDTH)
    for member in range(0, tl.max(b_count, 0), WIDTH):
        j = member + lanes
        inside = j[None, :] < b_count[:, None]
        y = tl.load(sorted_row_ptr + b_start[:, None] + j[None, :], mask=inside,
                    other=0).to(tl.uint64, bitcast=True)
        above += tl.sum((inside & (y > x[:, None])).to(tl.int32), 1)
    rank = b_start + above
    column = (~(x & WORD_MASK).to(tl.uint32)).to(tl.int32)
    tl.store(out_row_ptr + rank, column, mask=live & (rank < want))


@triton.jit
def topk_rank_kernel(
    scratch_ptr, counts_ptr, meta_ptr, out_ptr, out_row_stride,
    BLOCK: tl.constexpr,
    CHUNK: tl.constexpr,
    WIDTH: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    """Program (row, c): ranks the pairs placed by the select kernel in the chunks ``c,
    c + programs, ...`` of ``CHUNK`` pairs of ``scratch[row]``, those below its ``end``
    (``meta[row, 2]``), each as its bucket's start plus the number of its bucket's pairs
    above it (``WIDTH`` compared a step), and writes ``out[row, rank] = column`` for the
    ranks below ``want`` (``meta[row, 3]``).

    ``end`` is ``want`` plus at most the last bucket's size less one: a grid of about
    ``want / CHUNK + 1`` programs a row leaves a second chunk to a program only when that
    bucket is crowded, and launches no program that would find nothing to rank."""
    wait_for_previous_kernel(USE_PDL)
    row = tl.program_id(0).to(tl.int64)
    first = tl.program_id(1) * CHUNK
    meta_row_ptr = meta_ptr + row * 4
    sorted_row_ptr = scratch_ptr + row * BLOCK
    p = first + tl.arange(0, CHUNK)
    # The first chunk is asked for with the meta, not after it (a round trip less):
    # p < BLOCK stays inside the row, and pairs from ``end`` on are masked.
    x = tl.load(sorted_row_ptr + p, mask=p < BLOCK, other=0).to(tl.uint64, bitcast=True)
    top = tl.load(meta_row_ptr).to(tl.uint64, bitcast=True)
    shift = tl.load(meta_row_ptr + 1).to(tl.uint64)
    end = tl.load(meta_row_ptr + 2).to(tl.int32)
    want = tl.load(meta_row_ptr + 3).to(tl.int32)
    counts_row_ptr = counts_ptr + row * (2 * BLOCK)
    out_row_ptr = out_ptr + row * out_row_stride
    if first < end:
        _rank_chunk(x, p, end, want, top, shift, counts_row_ptr, sorted_row_ptr, out_row_ptr,
                    BLOCK, WIDTH)
    stride = tl.num_programs(1) * CHUNK
    for later in range(first + stride, end, stride):
        p = later + tl.arange(0, CHUNK)
        x = tl.load(sorted_row_ptr + p, mask=p < end, other=0).to(tl.uint64, bitcast=True)
        _rank_chunk(x, p, end, want, top, shift, counts_row_ptr, sorted_row_ptr, out_row_ptr,
                    BLOCK, WIDTH)
