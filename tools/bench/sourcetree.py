"""A synthetic source tree for ``leasefs bench apps``: generated from a seed, written as a tar
archive, and checked after extraction against what was generated.

Why synthetic: a real source tree would have to be downloaded or shipped, and its shape
would change with every release; a seeded generator gives the same ~4,700 entries on every
machine and every run, so figures from different days stay comparable. The shape is that of
a real project: folders nested up to ``MAX_DEPTH`` deep with a few big folders and many small
ones, ~9 % folders, ~0.5 % relative symlinks, files mostly 100 B - 30 KiB (log-normal around
3 KiB) with a long tail up to 1 MiB, a few executable scripts, and compressible text-like
content (lines of code-like tokens), so git's zlib work is realistic too.

Verification must catch a broken filesystem, not just a missing file: ``manifest`` describes
every entry (kind, executable bit, size and CRC32C of the bytes, or the link target), the
extracted tree's manifest must equal the generated one, and ``git_tree_id`` computes the id
git must give the committed tree (blob and tree objects hashed as git does).

Concurrency contract: plain functions on the caller's thread; a ``SourceTree`` is immutable.
"""

from __future__ import annotations

import hashlib
import io
import math
import os
import random
import stat
import tarfile
from dataclasses import dataclass

import crc32c

TOP = "tree"                # the one folder the archive extracts to
MTIME = 1_700_000_000       # every entry's mtime: the archive is byte-identical per seed
MAX_DEPTH = 7
DIR_SHARE, LINK_SHARE = 0.09, 0.005
MIN_FILE, SMALL_MAX, TAIL_MAX = 100, 30 << 10, 1 << 20
TAIL_SHARE = 0.015          # files drawn from the long tail (30 KiB - 1 MiB)
TYPICAL_FILE = 3 << 10      # median of the small files
POOL_SIZE = TAIL_MAX + (1 << 20)

DIR_WORDS = ("src", "lib", "include", "core", "net", "fs", "drivers", "util", "tests", "docs",
             "tools", "scripts", "arch", "kernel", "mm", "block", "crypto", "sound", "video",
             "common", "internal", "api", "cmd", "pkg", "config", "build", "examples", "bench",
             "io", "parser", "codec", "ipc", "sched", "storage", "proto", "client", "server")
FILE_WORDS = ("main", "util", "buffer", "queue", "hash", "list", "tree", "alloc", "lock",
              "thread", "socket", "stream", "codec", "parse", "token", "error", "config", "log",
              "time", "file", "inode", "cache", "index", "table", "map", "string", "vector",
              "test", "bench", "init", "probe", "device", "driver", "crc", "zlib", "state")
EXTENSIONS = ((".c", 22), (".h", 16), (".py", 12), (".js", 6), (".go", 5), (".rs", 5),
              (".md", 5), (".txt", 3), (".json", 3), (".yaml", 2), (".sh", 2), (".S", 2),
              (".cc", 5), (".java", 4), ("", 2))
EXECUTABLE = (".sh",)
TOKENS = ("int", "void", "struct", "return", "if", "else", "for", "while", "const", "static",
          "unsigned", "char", "size_t", "self", "def", "import", "NULL", "true", "false",
          "err", "ret", "len", "buf", "ctx", "node", "next", "prev", "data", "count", "flags",
          "offset", "value", "key", "entry", "page", "block", "state", "lock", "mutex")


@dataclass(frozen=True)
class Entry:
    rel: str                  # path inside the archive, starting with TOP
    kind: str                 # "d", "f" or "l"
    mode: int = 0o755         # permission bits
    data: bytes = b""         # file content
    target: str = ""          # symlink target (relative)


@dataclass(frozen=True)
class SourceTree:
    entries: tuple            # Entry, each folder before what it holds

    @property
    def files(self) -> int:
        return sum(1 for e in self.entries if e.kind == "f")

    @property
    def dirs(self) -> int:
        return sum(1 for e in self.entries if e.kind == "d")

    @property
    def links(self) -> int:
        return sum(1 for e in self.entries if e.kind == "l")

    @property
    def total(self) -> int:
        return sum(len(e.data) for e in self.entries)


# --------------------------------------------------------------------------- generation

def _text_pool(rng: random.Random, size: int) -> bytes:
    """Code-like lines: compressible like source (a few hundred distinct tokens)."""
    lines = []
    total = 0
    words = FILE_WORDS + TOKENS
    while total < size:
        indent = " " * (4 * rng.randrange(4))
        shape = rng.randrange(6)
        a, b, c = rng.choice(words), rng.choice(words), rng.choice(words)
        if shape == 0:
            line = f"{indent}{a}_{b} = {c}({rng.choice(TOKENS)}, {rng.randrange(4096)});"
        elif shape == 1:
            line = f"static int {a}_{b}(struct {c} *{rng.choice(TOKENS)})\n{{"
        elif shape == 2:
            line = f"{indent}/* {a} {b} {c} {rng.choice(words)} {rng.choice(words)} */"
        elif shape == 3:
            line = f"{indent}if ({a} != {b}) return -{c.upper()};"
        elif shape == 4:
            line = f"#include <{a}/{b}.h>"
        else:
            line = f"{indent}}}" if rng.random() < 0.5 else ""
        lines.append(line)
        total += len(line) + 1
    return ("\n".join(lines) + "\n").encode()[:size]


def _file_size(rng: random.Random) -> int:
    if rng.random() < TAIL_SHARE:
        return int(math.exp(rng.uniform(math.log(SMALL_MAX), math.log(TAIL_MAX))))
    size = int(rng.lognormvariate(math.log(TYPICAL_FILE), 1.0))
    return max(MIN_FILE, min(SMALL_MAX, size))


def _unique(name: str, taken: set) -> str:
    base, ext = os.path.splitext(name)
    n = 1
    while name in taken:
        n += 1
        name = f"{base}{n}{ext}"
    taken.add(name)
    return name


def generate(entries: int, seed: int) -> SourceTree:
    """``entries`` archive members (the top folder included), fixed by ``seed``."""
    if entries < 10:
        raise ValueError("a source tree needs at least 10 entries")
    rng = random.Random(seed)
    n_dirs = max(2, round(entries * DIR_SHARE))
    n_links = max(1, round(entries * LINK_SHARE))
    n_files = entries - n_dirs - n_links
    pool = _text_pool(rng, POOL_SIZE)

    dirs = [TOP]
    depth = {TOP: 0}
    names = {TOP: set()}
    for _ in range(n_dirs - 1):
        # squaring the draw favours early (shallow, central) folders, as real trees do
        parent = dirs[int(len(dirs) * rng.random() ** 2)]
        while depth[parent] >= MAX_DEPTH:
            parent = os.path.dirname(parent)
        rel = f"{parent}/{_unique(rng.choice(DIR_WORDS), names[parent])}"
        dirs.append(rel)
        depth[rel] = depth[parent] + 1
        names[rel] = set()

    weights = [rng.paretovariate(1.2) for _ in dirs]   # a few folders hold most files
    exts, ext_weights = zip(*EXTENSIONS)
    out = [Entry(rel=d, kind="d", mode=0o755) for d in dirs]
    files = []
    for folder in rng.choices(dirs, weights, k=n_files):
        ext = rng.choices(exts, ext_weights)[0]
        stem = rng.choice(FILE_WORDS) if ext else rng.choice(("Makefile", "README", "LICENSE"))
        if ext and rng.random() < 0.5:
            stem += "_" + rng.choice(FILE_WORDS)
        rel = f"{folder}/{_unique(stem + ext, names[folder])}"
        size = _file_size(rng)
        offset = rng.randrange(len(pool) - size)
        data = (f"// {rel}\n".encode() + pool[offset:offset + size])[:size]
        files.append(Entry(rel=rel, kind="f", mode=0o755 if ext in EXECUTABLE else 0o644,
                           data=data))
    links = []
    for _ in range(n_links):
        folder = rng.choice(dirs)
        target = rng.choice(files).rel
        rel = f"{folder}/{_unique(os.path.basename(target), names[folder])}"
        links.append(Entry(rel=rel, kind="l", mode=0o777,
                           target=os.path.relpath(target, folder)))
    return SourceTree(entries=tuple(out + files + links))


def write_tar(tree: SourceTree, path: str) -> int:
    """The archive ``tar -xf`` extracts (uncompressed: the step measures the filesystem, not
    gunzip); returns its size."""
    uid, gid = os.getuid(), os.getgid()
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tar:
        for e in tree.entries:
            info = tarfile.TarInfo(e.rel)
            info.mtime, info.mode, info.uid, info.gid = MTIME, e.mode, uid, gid
            if e.kind == "d":
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            elif e.kind == "l":
                info.type, info.linkname = tarfile.SYMTYPE, e.target
                tar.addfile(info)
            else:
                info.size = len(e.data)
                tar.addfile(info, io.BytesIO(e.data))
    return os.path.getsize(path)


# --------------------------------------------------------------------------- verification

def _describe(kind: str, mode: int, data: bytes | None = None, target: str = "") -> tuple:
    if kind == "d":
        return ("d",)
    if kind == "l":
        return ("l", target)
    return ("f", bool(mode & 0o100), len(data), crc32c.crc32c(data))


def manifest(tree: SourceTree) -> dict:
    """rel -> description of every generated entry."""
    return {e.rel: _describe(e.kind, e.mode, e.data, e.target) for e in tree.entries}


def read_manifest(parent: str, ignore: tuple = (".git",)) -> dict:
    """The same description of what is on disk under ``parent/TOP`` (reads every file),
    leaving out the top-level names in ``ignore`` (what git added)."""
    found = {}
    root = os.path.join(parent, TOP)
    if not os.path.isdir(root):
        return found
    found[TOP] = ("d",)
    for folder, subdirs, files in os.walk(root):
        if folder == root:
            subdirs[:] = [n for n in subdirs if n not in ignore]
            files = [n for n in files if n not in ignore]
        for name in subdirs + files:
            path = os.path.join(folder, name)
            rel = os.path.relpath(path, parent)
            st = os.lstat(path)
            if stat.S_ISLNK(st.st_mode):
                found[rel] = ("l", os.readlink(path))
            elif stat.S_ISDIR(st.st_mode):
                found[rel] = ("d",)
            else:
                with open(path, "rb") as fh:
                    found[rel] = _describe("f", st.st_mode, fh.read())
    return found


def manifest_digest(described: dict) -> str:
    """One SHA-256 over a manifest, for the report."""
    h = hashlib.sha256()
    for rel in sorted(described):
        h.update(repr((rel, described[rel])).encode() + b"\n")
    return h.hexdigest()


def compare(expected: dict, found: dict) -> str | None:
    """None if equal, else what differs, with an example."""
    missing = sorted(set(expected) - set(found))
    extra = sorted(set(found) - set(expected))
    wrong = sorted(rel for rel in set(expected) & set(found) if expected[rel] != found[rel])
    if not (missing or extra or wrong):
        return None
    parts = [f"{len(found)} entries, expected {len(expected)}"]
    if missing:
        parts.append(f"{len(missing)} missing (e.g. {missing[0]})")
    if extra:
        parts.append(f"{len(extra)} unexpected (e.g. {extra[0]})")
    if wrong:
        parts.append(f"{len(wrong)} with wrong content, type, mode or target (e.g. {wrong[0]})")
    return "; ".join(parts)


def git_tree_id(tree: SourceTree) -> str:
    """The id of the tree ``git add -A; git commit`` must record for ``TOP``'s contents."""
    children: dict[str, list] = {}
    for e in tree.entries:
        if e.rel != TOP:
            children.setdefault(os.path.dirname(e.rel), []).append(e)

    def obj(kind: bytes, body: bytes) -> bytes:
        return hashlib.sha1(kind + b" %d\0" % len(body) + body).digest()

    def tree_of(folder: str) -> bytes | None:
        items = []
        for e in children.get(folder, ()):
            name = os.path.basename(e.rel)
            if e.kind == "d":
                sub = tree_of(e.rel)
                if sub is not None:  # git records no empty folders
                    items.append((name + "/", b"40000", name, sub))
            elif e.kind == "l":
                items.append((name, b"120000", name, obj(b"blob", os.fsencode(e.target))))
            else:
                mode = b"100755" if e.mode & 0o100 else b"100644"
                items.append((name, mode, name, obj(b"blob", e.data)))
        if not items:
            return None
        items.sort(key=lambda item: item[0].encode())
        body = b"".join(mode + b" " + name.encode() + b"\0" + sha
                        for _, mode, name, sha in items)
        return obj(b"tree", body)

    top = tree_of(TOP)
    return top.hex() if top else ""
