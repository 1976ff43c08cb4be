"""The growth benchmark of issue 11 (not part of ``run_all.py``: it is a study, not a timing).

Grows a block at every insertion point of a suite of trained models (LLaMA-style at widths
32/64/128/256, a tanh MLP and a narrow ResNet-20 on digits, and a teacher–student MLP whose
student lacks one known block; 5 seeds each), records the realised held-out loss change after a
short and a long block-training budget, and compares the growth criteria against it. Resumable:
finished (model, seed) cells are kept in ``OUT/cells``. Same as ``widthscope grow-bench``.

    OMP_NUM_THREADS=1 python benchmarks/growth.py [--quick] [--out DIR]

Results and the documented wall time: docs/interventions.md §5.
"""
import sys

from widthscope.cli import main

if __name__ == "__main__":
    sys.exit(main(["grow-bench", "--threads", "1", *sys.argv[1:]]))
