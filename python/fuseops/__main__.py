"""Command line: ``python -m fuseops info|bench|demo|gdb-init``."""

from __future__ import annotations

import argparse
import sys


def _cmd_info(args: argparse.Namespace) -> int:
    import torch

    import fuseops

    info = fuseops.build_info()
    rows = [
        ("fuseops", info["version"]),
        ("built against torch", info["torch_version"]),
        ("running torch", torch.__version__),
        ("C++11 ABI", "yes" if info["cxx11_abi"] else "no"),
        ("CPU kernel builds", ", ".join(info["cpu_capabilities"])),
        ("CPU build in use", info["selected_cpu_capability"]),
        (
            "CUDA kernels",
            f"yes (CUDA {info['cuda_version']}, architectures "
            f"{', '.join(info['cuda_architectures'])})"
            if info["cuda"]
            else "no",
        ),
        *([("CUDA status", info["cuda_status"])] if info["cuda"] else []),
        ("library", fuseops.library_path),
        ("CMake prefix path", fuseops.cmake_prefix_path),
        ("threads", str(torch.get_num_threads())),
    ]
    width = max(len(name) for name, _ in rows)
    for name, value in rows:
        print(f"{name:<{width}}  {value}")
    return 0


def _cmd_gdb_init(args: argparse.Namespace) -> int:
    from . import gdb

    print("\n".join(gdb.gdb_init_lines()))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fuseops", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("info", help="print how fuseops was built").set_defaults(func=_cmd_info)
    sub.add_parser(
        "gdb-init", help="print the lines that make gdb load the fuseops tensor printers"
    ).set_defaults(func=_cmd_gdb_init)
    from . import bench, demo

    bench_parser = sub.add_parser(
        "bench",
        help="time fuseops against its peers (eager, torch.compile, native), "
        "check results, write table, JSON, CSV and chart",
        description=bench.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    bench.add_arguments(bench_parser)
    bench_parser.set_defaults(func=bench.run)
    demo_parser = sub.add_parser(
        "demo",
        help="train a small Llama-style model with torch.nn and with fuseops modules",
        description=demo.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    demo.add_arguments(demo_parser)
    demo_parser.set_defaults(func=demo.run)
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
