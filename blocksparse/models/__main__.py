"""``python -m blocksparse.models export-fp16 DIR [--weights SRC]``: write the fp16 sentence-transformers copy."""

from __future__ import annotations

import argparse
import sys


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m blocksparse.models", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    exp = sub.add_parser("export-fp16", help="write a float16 copy of all-MiniLM-L6-v2 (a sentence-transformers dir)")
    exp.add_argument("out_dir", help="directory to write (created if missing)")
    exp.add_argument("--weights", default=None, help="source directory or zip (default: the installed package)")
    args = parser.parse_args(argv)
    from . import minilm

    try:
        out = minilm.export_fp16(args.out_dir, args.weights)
    except (OSError, ValueError, ImportError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    size = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    print(f"wrote {out} ({size / 2**20:.1f} MiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
