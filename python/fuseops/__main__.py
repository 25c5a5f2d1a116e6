"""Command line: ``python -m fuseops info|demo``."""

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
        ("CUDA kernels", f"yes (CUDA {info['cuda_version']}, architectures "
         f"{', '.join(info['cuda_architectures'])})" if info["cuda"] else "no"),
        ("library", fuseops.library_path),
        ("CMake prefix path", fuseops.cmake_prefix_path),
        ("threads", str(torch.get_num_threads())),
    ]
    width = max(len(name) for name, _ in rows)
    for name, value in rows:
        print(f"{name:<{width}}  {value}")
    return 0


def _cmd_demo(args: argparse.Namespace) -> int:
    import torch

    import fuseops

    torch.manual_seed(0)
    x = torch.randn(4, 6, requires_grad=True)
    y = fuseops.relu(x)
    y.sum().backward()
    print("x =", x.detach(), sep="\n")
    print("fuseops.relu(x) =", y.detach(), sep="\n")
    print("d/dx sum(relu(x)) =", x.grad, sep="\n")
    expected = (x.detach() > 0).to(x.dtype)
    ok = torch.equal(y.detach(), torch.relu(x.detach())) and torch.equal(x.grad, expected)
    print("matches torch.relu and its gradient:", "yes" if ok else "NO")
    return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fuseops", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("info", help="print how fuseops was built").set_defaults(func=_cmd_info)
    sub.add_parser("demo", help="relu forward and backward on a small tensor").set_defaults(
        func=_cmd_demo
    )
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
