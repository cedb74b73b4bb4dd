"""Run our kernels as another Triton version compiles them, on this machine's Triton runtime.

A GPU machine with one Triton (say 3.6) can still check and time the code that another
(say 3.9) generates for the same kernels, for the same GPU architecture: record which
kernels a workload compiles, compile them with the other Triton wherever it is installed
(no GPU needed), then run the workload again with those binaries swapped in. The kernel
ABI (the signature's arguments, then the global and profile scratch pointers) is the same
from 3.6 to 3.9, so the runtime's launcher launches either; each swapped kernel keeps its
own shared-memory size and scratch sizes. Launch options (dependent launch, warps) are the
recorded ones.

    # on the GPU machine (Triton A): which kernels the workload compiles
    python benchmarks/triton_cubins.py record records.json -- -m indexer_kcache bench ...
    # anywhere with Triton B installed (same source tree)
    python benchmarks/triton_cubins.py build records.json cubins/ [--arch 90]
    # on the GPU machine again: the same workload with B's binaries
    python benchmarks/triton_cubins.py replay cubins/ -- -m indexer_kcache bench ...

The workload after ``--`` is a script path or ``-m module``, with its arguments. Binaries
are matched by specialization (function, argument types and alignments, constants,
options), not by source text: a revised kernel can be built and replayed against the
same records. Kernels with no binary in the folder (compiled by anything else, or a
specialization the record run did not see) keep Triton A's and are listed on stderr at
exit.
"""

from __future__ import annotations

import atexit
import json
import os
import runpy
import sys

# Compile options that decide the generated code; the rest are the backend's defaults.
OPTIONS = ("num_warps", "num_ctas", "num_stages", "maxnreg", "enable_fp_fusion", "launch_pdl",
           "launch_cooperative_grid", "debug", "sanitize_overflow")


def _encode(value):
    """A constexpr value as JSON (Triton dtypes by name)."""
    import triton.language as tl

    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, tl.dtype):
        return {"dtype": value.name}
    if isinstance(value, tl.constexpr):
        return _encode(value.value)
    raise TypeError(f"constexpr value {value!r} of type {type(value).__name__}: not recordable")


def _decode(value):
    import triton.language as tl

    return tl.dtype(value["dtype"]) if isinstance(value, dict) else value


def _constants(src) -> dict:
    """An ``ASTSource``'s compile-time constants by argument path (3.6 names them
    ``constants``)."""
    found = getattr(src, "constants", None)
    return found if found is not None else src.constexprs


def _spec(src, target, options) -> dict:
    """What decides a compiled kernel, by value: the function, its specialization and the
    code-generating options (not the source text, so that a binary built from a revised
    source replaces the kernel of the same specialization)."""
    fn = src.fn.fn
    return {"module": fn.__module__, "name": fn.__qualname__,
            "signature": dict(src.signature),
            "constexprs": [[list(p), _encode(v)] for p, v in _constants(src).items()],
            "attrs": [[list(p), a] for p, a in src.attrs.items()],
            "options": {k: options[k] for k in OPTIONS if options.get(k) is not None},
            "arch": target.arch}


def _key(spec: dict) -> str:
    import hashlib

    spec = dict(spec, constexprs=sorted(spec["constexprs"]), attrs=sorted(spec["attrs"]))
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:32]


def _ours(src) -> bool:
    fn = getattr(getattr(src, "fn", None), "fn", None)
    return fn is not None and fn.__module__.startswith("indexer_kcache")


def _hook(on_compile) -> None:
    """Route every compile through ``on_compile(src, target, options, kernel)``."""
    import triton.compiler as compiler

    original = compiler.compile

    def compile(src, target=None, options=None, **kwargs):  # noqa: A001 (Triton's name)
        kernel = original(src, target=target, options=options, **kwargs)
        return on_compile(src, target, options or {}, kernel)

    compiler.compile = compile


def _run_workload(argv: list[str]) -> None:
    if not argv:
        raise SystemExit("no workload after --")
    if argv[0] == "-m":
        sys.argv = [argv[1], *argv[2:]]
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv = list(argv)
        runpy.run_path(argv[0], run_name="__main__")


def record(path: str, argv: list[str]) -> None:
    records: dict[str, dict] = {}

    def save():
        with open(path + ".part", "w") as f:
            json.dump(records, f, indent=1)
        os.replace(path + ".part", path)

    def on_compile(src, target, options, kernel):
        if _ours(src):
            try:
                spec = _spec(src, target, options)
            except TypeError as error:  # not recordable: it keeps this Triton's binary
                print(f"triton_cubins: {src.fn.fn.__qualname__}: {error}", file=sys.stderr)
            else:
                if _key(spec) not in records:
                    records[_key(spec)] = spec
                    # Saved at every new kernel, so that a workload cut short (a timeout, a
                    # failed test run) still leaves the record of what it compiled.
                    save()
        return kernel

    atexit.register(lambda: print(f"triton_cubins: {len(records)} kernels recorded to {path}",
                                  file=sys.stderr))
    _hook(on_compile)
    _run_workload(argv)


def build(path: str, folder: str, arch: int | None) -> None:
    import importlib

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    with open(path) as f:
        records = json.load(f)
    os.makedirs(folder, exist_ok=True)
    for i, r in enumerate(records.values()):
        key = _key(r)
        fn = getattr(importlib.import_module(r["module"]), r["name"])
        src = ASTSource(fn=fn, signature=r["signature"],
                        constexprs={tuple(p): _decode(v) for p, v in r["constexprs"]},
                        attrs={tuple(p): a for p, a in r["attrs"]})
        target = GPUTarget("cuda", arch or r["arch"], 32)
        kernel = triton.compile(src, target=target, options=dict(r["options"]))
        with open(os.path.join(folder, key + ".cubin"), "wb") as f:
            f.write(kernel.asm["cubin"])
        meta = {k: getattr(kernel.metadata, k) for k in (
            "name", "shared", "global_scratch_size", "global_scratch_align",
            "profile_scratch_size", "profile_scratch_align", "num_warps")}
        meta["triton_version"] = triton.__version__
        with open(os.path.join(folder, key + ".json"), "w") as f:
            json.dump(meta, f)
        print(f"[{i + 1}/{len(records)}] {r['name']} {meta['name']} shared {meta['shared']}",
              flush=True)


def replay(folder: str, argv: list[str]) -> None:
    swapped, kept = set(), set()

    def on_compile(src, target, options, kernel):
        key = _key(_spec(src, target, options)) if _ours(src) else ""
        meta_path = os.path.join(folder, key + ".json")
        if not key or not os.path.exists(meta_path):
            kept.add(getattr(src, "name", "?"))
            return kernel
        with open(meta_path) as f:
            meta = json.load(f)
        with open(os.path.join(folder, key + ".cubin"), "rb") as f:
            cubin = f.read()
        if meta["num_warps"] != kernel.metadata.num_warps:
            raise RuntimeError(f"{kernel.name}: {meta['num_warps']} warps against "
                               f"{kernel.metadata.num_warps}")
        from triton.compiler.compiler import make_backend

        fields = {k: meta[k] for k in ("name", "shared", "global_scratch_size",
                                       "global_scratch_align", "profile_scratch_size",
                                       "profile_scratch_align")
                  if k in kernel.metadata._fields}
        kernel.metadata = kernel.metadata._replace(**fields)
        kernel.packed_metadata = make_backend(kernel.metadata.target).pack_metadata(
            kernel.metadata)
        kernel.name = meta["name"]
        kernel.kernel = cubin
        kernel.asm["cubin"] = cubin
        swapped.add(f"{kernel.name}:{meta['triton_version']}")
        return kernel

    def report():
        print(f"triton_cubins: swapped {len(swapped)} kernels ({sorted(swapped)[:3]}...), "
              f"kept {sorted(kept)}", file=sys.stderr)

    atexit.register(report)
    _hook(on_compile)
    _run_workload(argv)


def main() -> None:
    args = sys.argv[1:]
    workload = args[args.index("--") + 1:] if "--" in args else []
    head = args[:args.index("--")] if "--" in args else args
    if head[:1] == ["record"] and len(head) == 2:
        record(head[1], workload)
    elif head[:1] == ["build"] and len(head) in (3, 5):
        build(head[1], head[2], int(head[4]) if len(head) == 5 else None)
    elif head[:1] == ["replay"] and len(head) == 2:
        replay(head[1], workload)
    else:
        raise SystemExit(__doc__)


if __name__ == "__main__":
    main()
