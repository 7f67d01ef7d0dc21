"""The committed protobuf code (etcd's messages for the HA log, HDFS's for Hadoop's client)
is protoc's output for the committed schema (``make proto``): nobody edited it by hand or
forgot to regenerate it after changing a ``.proto``."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("folder", ["meta/ha/etcdpb", "fs/hdfs/pb"])
def test_the_generated_code_is_what_protoc_makes_of_the_schema(tmp_path, folder):
    protoc = pytest.importorskip("grpc_tools.protoc",
                                 reason="grpcio-tools (the test extra) ships protoc")
    here = ROOT / folder
    protos = sorted(p.relative_to(ROOT).as_posix() for p in here.glob("*.proto"))
    assert protos, here
    # protoc names its output by the .proto's path under the include root: copy the
    # schema to the same place under tmp_path and generate beside it
    (tmp_path / "in" / folder).mkdir(parents=True)
    for proto in protos:
        shutil.copy(ROOT / proto, tmp_path / "in" / proto)
    (tmp_path / "out").mkdir()
    assert protoc.main(["protoc", f"-I{tmp_path / 'in'}", f"--python_out={tmp_path / 'out'}",
                        f"--pyi_out={tmp_path / 'out'}", *protos]) == 0
    made = sorted(p.relative_to(tmp_path / "out") for p in (tmp_path / "out").rglob("*_pb2.py*"))
    committed = sorted(p.relative_to(ROOT) for p in here.glob("*_pb2.py*"))
    assert made == committed and len(made) == 2 * len(protos), (made, committed)
    for path in made:
        assert (tmp_path / "out" / path).read_text() == (ROOT / path).read_text(), path
