"""The reading shell commands beyond ``cat``: ``head`` (the first KiB), ``text`` (``cat``
that decompresses ``.gz``/``.bz2``/``.zst`` by extension) and ``getmerge`` (files of a
directory, in name order, concatenated into one local file), as their ``hdfs dfs`` namesakes.

Why together: all three stream cluster files to a local sink and share the "a directory is
not a file" rule and the broken-pipe rule (a reader that leaves is not an error).

Concurrency contract: synchronous, the CLI's main thread; files read one after the other
through the command's client.
"""

from __future__ import annotations

import bz2
import gzip
import shutil
import sys

from fs import paths
from fs.errors import IsDirectory, LeaseFSError, NotSupported

from ..common import Command, command_parser
from ..formatting import UsageError, split_file_url
from . import transfer
from .core import user_path

ITEM_ERRORS = (LeaseFSError, OSError, EOFError)   # EOFError: a truncated .gz/.bz2
HEAD_BYTES = 1024


def _stdout():
    return getattr(sys.stdout, "buffer", sys.stdout)


def _file_path(cmd: Command, raw: str) -> str:
    path = user_path(raw)
    if cmd.client.get_file_status(path).type == "dir":
        raise IsDirectory(f"{path}: is a directory")
    return path


def cmd_head(cmd: Command):
    out = _stdout()
    raw = cmd.args.path
    try:
        with cmd.client.open(_file_path(cmd, raw)) as reader:
            data = b""
            while len(data) < HEAD_BYTES:
                chunk = reader.read(HEAD_BYTES - len(data))
                if not chunk:
                    break
                data += chunk
        out.write(data)
        out.flush()
    except ITEM_ERRORS as exc:
        cmd.fail(raw, exc)


def decompressor(path: str, reader):
    """A file object decompressing ``reader`` as ``path``'s extension says (or ``reader``)."""
    if path.endswith(".gz"):
        return gzip.GzipFile(fileobj=reader, mode="rb")
    if path.endswith(".bz2"):
        return bz2.BZ2File(reader, mode="rb")
    if path.endswith(".zst"):
        try:
            import zstandard
        except ImportError:
            raise NotSupported("cannot decompress .zst: the Python package 'zstandard' is "
                               "not installed") from None
        return zstandard.ZstdDecompressor().stream_reader(reader)
    return reader


def cmd_text(cmd: Command):
    out = _stdout()
    for raw in cmd.args.paths:
        try:
            path = _file_path(cmd, raw)
            with cmd.client.open(path) as reader:
                shutil.copyfileobj(decompressor(path, reader), out, 1 << 20)
            out.flush()
        except ITEM_ERRORS as exc:
            cmd.fail(raw, exc)


def merge_sources(cmd: Command, raw: str) -> list[str]:
    """The files ``raw`` stands for: itself, or the files (not subdirectories) directly in
    it, in name order, as hdfs dfs -getmerge."""
    path = user_path(raw)
    st = cmd.client.get_file_status(path)
    if st.type != "dir":
        return [path]
    return sorted(paths.join(path, s.name) for s in cmd.client.iter_status(path)
                  if s.type == "file")


def cmd_getmerge(cmd: Command):
    a = cmd.args
    if len(a.args) < 2:
        raise UsageError("needs SRC... LOCALDST")
    *srcs, dst = a.args
    files = []
    for raw in srcs:
        try:
            files += [(raw, f) for f in merge_sources(cmd, raw)]
        except ITEM_ERRORS as exc:
            cmd.fail(raw, exc)
    try:
        sink = open(split_file_url(dst)[1], "wb")
    except OSError as exc:
        cmd.fail(dst, exc)
        return
    with sink:
        for raw, path in files:
            try:
                with cmd.client.open(path) as reader:
                    if a.skip_empty and reader.length == 0:
                        continue
                    transfer.pump(reader, sink)
                if a.newline:
                    sink.write(b"\n")
            except ITEM_ERRORS as exc:
                cmd.fail(path, exc)


def register(sub, common) -> None:
    p = command_parser(sub, "head", common, "the first kilobyte of a file",
                description="leasefs head PATH: the first 1 KiB of a file on stdout, as hdfs "
                            "dfs -head.\n\nexample:\n  leasefs head /logs/app.log")
    p.add_argument("path", metavar="PATH")
    p.set_defaults(func=cmd_head)

    p = command_parser(sub, "text", common, "write files to stdout, decompressing .gz/.bz2/.zst",
                description="leasefs text PATH...: like cat, but a name ending .gz, .bz2 or .zst "
                            "is decompressed (.zst needs the Python package zstandard).\n\n"
                            "example:\n  leasefs text /logs/app.log.gz | grep ERROR")
    p.add_argument("paths", nargs="+", metavar="PATH")
    p.set_defaults(func=cmd_text)

    p = command_parser(sub, "getmerge", common, "concatenate cluster files into one local file",
                description="leasefs getmerge [-nl] [--skip-empty-file] SRC... LOCALDST\n"
                            "A directory SRC stands for the files directly in it, in name "
                            "order.\n\nexamples:\n  leasefs getmerge /out/job1 result.csv\n"
                            "  leasefs getmerge -nl /logs/a /logs/b all.log",
                usage="leasefs getmerge [options] SRC... LOCALDST")
    p.add_argument("-nl", dest="newline", action="store_true",
                   help="add a newline after each file")
    p.add_argument("-skip-empty-file", "--skip-empty-file", dest="skip_empty",
                   action="store_true", help="skip empty files (also no -nl newline for them)")
    p.add_argument("args", nargs="+", metavar="PATH", help="SRC... LOCALDST")
    p.set_defaults(func=cmd_getmerge)
