"""``torch.library`` registration: the store and the readers as ops of ``indexer_kcache``.

The ops are opaque to the compiler (a Python kernel behind the dispatcher), so
``torch.compile(fullgraph=True)`` sees one call, functionalizes the mutation of
``k_cache`` and puts it back in place, and CUDA graphs capture the Triton launch inside.
A low-level ``Library`` keeps the eager dispatch cost to a microsecond or two.
"""

import torch

from . import layout, readers, store

NAMESPACE = "indexer_kcache"
_lib = torch.library.Library(NAMESPACE, "DEF")

_lib.define(
    "indexer_k_norm_rope_store(Tensor k_pre, Tensor positions, Tensor cos_sin_cache, "
    "Tensor rms_norm_weight, float rms_norm_eps, Tensor(a!) k_cache, Tensor kv_slot_mapping, "
    "int compress_ratio, bool use_fp4_cache, int mxfp4_n_per_tile=0, *, bool? mx_scales=None, "
    "bool? shuffle=None, str? backend=None, bool check_bounds=False, bool? enable_pdl=None, "
    f"int mxfp4_d_per_tile={layout.MXFP4_D_PER_TILE}, int? mxfp4_scale_lanes=None) -> ()"
)
_lib.impl("indexer_k_norm_rope_store", store.store_impl, "CompositeExplicitAutograd")


@torch.library.register_fake(f"{NAMESPACE}::indexer_k_norm_rope_store", lib=_lib)
def _store_fake(k_pre, positions, cos_sin_cache, rms_norm_weight, rms_norm_eps, k_cache,
                kv_slot_mapping, compress_ratio, use_fp4_cache, mxfp4_n_per_tile=0, *,
                mx_scales=None, shuffle=None, backend=None, check_bounds=False, enable_pdl=None,
                mxfp4_d_per_tile=layout.MXFP4_D_PER_TILE, mxfp4_scale_lanes=None):
    store.plan_store(k_pre, positions, cos_sin_cache, rms_norm_weight, rms_norm_eps, k_cache,
                     kv_slot_mapping, compress_ratio, use_fp4_cache, mxfp4_n_per_tile,
                     mx_scales, shuffle, backend, check_bounds, enable_pdl, mxfp4_d_per_tile,
                     mxfp4_scale_lanes)

_READER_OPTIONS = ("bool? shuffle=None, int mxfp4_n_per_tile=0, str? backend=None, bool check_bounds=True, "
                   f"int mxfp4_d_per_tile={layout.MXFP4_D_PER_TILE}, int? mxfp4_scale_lanes=None")
_lib.define(f"gather_indexer_k(Tensor k_cache, Tensor slots, bool use_fp4_cache, *, "
            f"{_READER_OPTIONS}) -> (Tensor, Tensor)")
_lib.define(f"gather_indexer_k_by_blocks(Tensor k_cache, Tensor block_table, Tensor cu_seq_lens, "
            f"bool use_fp4_cache, *, {_READER_OPTIONS}) -> (Tensor, Tensor)")
_lib.define(f"dequantize_indexer_k(Tensor k_cache, Tensor slots, bool use_fp4_cache, *, "
            f"bool? mx_scales=None, {_READER_OPTIONS}) -> Tensor")
_lib.impl("gather_indexer_k", readers.gather_impl, "CompositeExplicitAutograd")
_lib.impl("gather_indexer_k_by_blocks", readers.gather_by_blocks_impl, "CompositeExplicitAutograd")
_lib.impl("dequantize_indexer_k", readers.dequantize_impl, "CompositeExplicitAutograd")


def _empty_rows(k_cache, num_rows, use_fp4_cache):
    values = k_cache.new_empty((num_rows, layout.value_bytes(use_fp4_cache)))
    return values, k_cache.new_empty((num_rows, layout.SCALE_BYTES))


@torch.library.register_fake(f"{NAMESPACE}::gather_indexer_k", lib=_lib)
def _gather_fake(k_cache, slots, use_fp4_cache, **options):
    return _empty_rows(k_cache, slots.shape[0], use_fp4_cache)


@torch.library.register_fake(f"{NAMESPACE}::gather_indexer_k_by_blocks", lib=_lib)
def _gather_by_blocks_fake(k_cache, block_table, cu_seq_lens, use_fp4_cache, **options):
    # The row count is cu_seq_lens[-1]: data, not metadata.
    return _empty_rows(k_cache, torch.library.get_ctx().new_dynamic_size(), use_fp4_cache)


@torch.library.register_fake(f"{NAMESPACE}::dequantize_indexer_k", lib=_lib)
def _dequantize_fake(k_cache, slots, use_fp4_cache, **options):
    return k_cache.new_empty((slots.shape[0], layout.HEAD_DIM), dtype=torch.float32)
