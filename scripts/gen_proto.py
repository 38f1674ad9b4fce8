#!/usr/bin/env python3
"""Regenerate the gRPC/protobuf code under proto/clusterwatch/v1 from its .proto files.

Run from anywhere: `python scripts/gen_proto.py`. The output is committed; a test
(tests/project/test_packaging.py, test_generated_code_matches_the_proto_files) regenerates into a
temporary folder and fails when the committed files differ. `-I proto` makes the generated imports absolute
(`from clusterwatch.v1 import agent_pb2`), which works inside the installed package.
"""
from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTO_ROOT = ROOT / "proto"
PROTO_DIR = PROTO_ROOT / "clusterwatch" / "v1"


def generate(out_root: Path) -> list[Path]:
    """Generate Python, .pyi and gRPC stubs for every .proto file into out_root/clusterwatch/v1."""
    import grpc_tools
    from grpc_tools import protoc  # dev dependency only (pyproject extra "dev")

    protos = sorted(PROTO_DIR.glob("*.proto"))
    include = Path(grpc_tools.__file__).parent / "_proto"
    (out_root / "clusterwatch" / "v1").mkdir(parents=True, exist_ok=True)
    args = [
        "protoc",
        f"-I{PROTO_ROOT}",
        f"-I{include}",
        f"--python_out={out_root}",
        f"--pyi_out={out_root}",
        f"--grpc_python_out={out_root}",
        *[str(p.relative_to(PROTO_ROOT)) for p in protos],
    ]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed; see the message above")
    return sorted((out_root / "clusterwatch" / "v1").glob("*_pb2*.py*"))


def main() -> None:
    generate(PROTO_ROOT)
    print(f"generated into {PROTO_DIR}", file=sys.stderr)


if __name__ == "__main__":
    main()
