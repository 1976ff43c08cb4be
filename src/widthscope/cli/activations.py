"""``widthscope activations``: the command line of :func:`widthscope.linear.activations.audit`.

A thin adapter: it checks the names and the grid, and the room for ``--json``, before the audit
runs, then prints the table and writes the JSON.
"""

from __future__ import annotations

import argparse

from ..errors import WidthscopeError
from ..linear.activations import BUILTIN, MAX_K, audit, check_grid

__all__ = ["add_arguments", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--names", default=",".join(BUILTIN), help="comma-separated built-ins (%(default)s) or module:function paths"
    )
    parser.add_argument("--K", type=int, default=6, help=f"highest derivative order, 1..{MAX_K} (default 6)")
    parser.add_argument("--threads", type=int, default=None, metavar="N", help="torch CPU threads")
    parser.add_argument(
        "--range", type=float, nargs=2, default=(-5.0, 5.0), metavar=("LO", "HI"), help="grid interval (default -5 5)"
    )
    parser.add_argument("--grid", type=int, default=2001, help="grid points (default 2001)")
    parser.add_argument("--json", default=None, metavar="PATH", help="also write the table as JSON")


def run(args: argparse.Namespace) -> int:
    from .._io import atomic_write_json, format_table

    names = [s for s in str(args.names).split(",") if s.strip()]
    if not names:
        raise WidthscopeError("activations: --names is empty; give e.g. --names relu,tanh")
    lo, hi = args.range
    check_grid(args.K, lo, hi, args.grid)
    if args.json:  # room for the table (about 2 numbers per order and name), before computing it
        from .._io import check_space

        check_space(args.json, 2000 + len(names) * (2 * args.K + 10) * 80)
    rows = audit(names, K=args.K, lo=lo, hi=hi, grid=args.grid)
    cols = ["name"] + [f"ratio_{k}" for k in range(1, args.K + 1)] + ["flags"]
    print(format_table(rows, cols, floatfmt=".3g", title=f"max|phi^(k)| / (k+1)! on [{lo}, {hi}], {args.grid} points"))
    if args.json:
        atomic_write_json(args.json, {"K": args.K, "range": list(args.range), "grid": args.grid, "rows": rows})
        print(f"wrote {args.json}")
    return 0
