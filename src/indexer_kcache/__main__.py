"""``python -m indexer_kcache demo|bench``."""

from __future__ import annotations

import os
import sys


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] not in ("demo", "bench"):
        print("usage: python -m indexer_kcache {demo,bench} [options]\n"
              "  demo   store a realistic batch in every format, check it, read it back,\n"
              "         score it, pick its top-k\n"
              "  bench  time the store, the readers, the scorer and the top-k against their\n"
              "         peers (GPU; a tiny CPU sweep without one; --help for its options)")
        return 2
    import torch

    if not torch.cuda.is_available() and "TRITON_INTERPRET" not in os.environ:
        # Without a GPU, run the Triton kernels through the interpreter. The switch is read
        # when the kernels are defined, and the package is already imported by now: start
        # again with it set.
        os.environ["TRITON_INTERPRET"] = "1"
        os.execv(sys.executable, [sys.executable, "-m", "indexer_kcache", *argv])
    if argv[0] == "demo":
        from .demo import main as run
    else:
        from .bench import main as run
    return run(argv[1:])


if __name__ == "__main__":
    sys.exit(main())
