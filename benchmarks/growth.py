"""The growth benchmark of issues 11 and 19 (not part of ``run_all.py``: it is a study, not a timing).

Grows a block at every insertion point of a suite of models trained to a plateau (LLaMA-style at
widths 16/32, a tanh MLP and a narrow ResNet-20 on digits) and of two planted-block cases, 5 model
seeds and 3 block seeds each, and compares growth criteria and growth itself against training the
original model for the same FLOPs and grow-then-train-all. Resumable: finished (model, seed) cells
are kept in ``OUT/cells``. Same as ``widthscope grow-bench``.

    OMP_NUM_THREADS=1 python benchmarks/growth.py [--quick] [--out DIR]

Results: docs/interventions.md §5 (rendered from the committed rows by growth_summary.py).
"""
import sys

from widthscope.cli import main

if __name__ == "__main__":
    sys.exit(main(["grow-bench", "--threads", "1", *sys.argv[1:]]))
