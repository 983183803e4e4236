"""``python -m nddebug.native build``: compile the native ops now (e.g. at install time).
``python -m nddebug.native ptx``: compile the GPU kernels to ``nddebug_digest.ptx`` (NVRTC)."""

from __future__ import annotations

import argparse
import time

from nddebug import native


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m nddebug.native")
    parser.add_argument("command", choices=["build", "path", "ptx"])
    parser.add_argument("--force", action="store_true", help="rebuild even if cached")
    args = parser.parse_args(argv)
    if args.command == "path":
        print(native.library_path())
        return 0
    if args.command == "ptx":
        try:
            native.PTX.write_text(native.compile_ptx(), encoding="utf-8")
        except native.NativeBuildError as exc:
            print(f"nddebug: PTX build failed: {exc}")
            return 1
        print(native.PTX)
        return 0
    start = time.perf_counter()
    try:
        path = native.build(force=args.force)
    except native.NativeBuildError as exc:
        print(f"nddebug: native build failed: {exc}")
        return 1
    print(f"{path} ({time.perf_counter() - start:.1f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
