"""``FileStatus``: what the metadata server says of one path, as every client reads it
(the wire form is PROTOCOL.md "status"; ``from_wire`` is its one reader).

No trio and no I/O: the blocking one-shot client (``fs.blockingrpc``) and the trio client
(``fs.client``) both build it.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

#: entries a listing asks for per page
LIST_PAGE = 1000


@dataclass
class FileStatus:
    """What the metadata server knows about one path (PROTOCOL.md "status")."""

    name: str
    path: str
    ino: int
    type: str              # "file" | "dir" | "symlink"
    mode: int              # permission bits only, e.g. 0o644
    owner: str
    group: str
    mtime_ns: int
    atime_ns: int
    ctime_ns: int
    length: int
    replication: int
    block_size: int
    symlink: str | None
    under_construction: bool
    children: int
    subdirs: int = 0       # directories: subdirectory count (link count 2 + subdirs)
    # ``get_file_status(path, locations=True)`` of a readable file: what
    # ``get_block_locations`` answers for the whole file (``open(path, located=...)``)
    locations: dict | None = None
    # a folder with a quota: ``{ns, ds, ns_used, ds_used}`` (-1 = none)
    quota: dict | None = None

    @property
    def is_dir(self) -> bool:
        return self.type == "dir"

    @property
    def is_file(self) -> bool:
        return self.type == "file"

    @property
    def is_symlink(self) -> bool:
        return self.type == "symlink"

    @classmethod
    def from_wire(cls, obj: dict) -> "FileStatus":
        """Missing or null keys take their defaults, unknown keys are ignored (a newer or
        older server); runs once per listed entry, so no per-call ``fields()``."""
        get = obj.get
        return cls(*[default if (value := get(name)) is None else value
                     for name, default in _STATUS_DEFAULTS])


_STATUS_DEFAULTS = tuple(
    (f.name, {"name": "", "path": "", "ino": 0, "type": "file", "mode": 0, "owner": "",
              "group": "", "mtime_ns": 0, "atime_ns": 0, "ctime_ns": 0, "length": 0,
              "replication": 0, "block_size": 0, "symlink": None,
              "under_construction": False, "children": 0, "subdirs": 0,
              "locations": None, "quota": None}[f.name])
    for f in fields(FileStatus))


def iter_pages(list_page, path: str):
    """Entries of a directory sorted by name (a file yields itself), fetched as the
    iteration goes by ``list_page(path, start_after) -> (entries, more)``: the one paging
    loop of the blocking clients."""
    start_after = ""
    while True:
        entries, more = list_page(path, start_after)
        yield from entries
        if not more or not entries:
            return
        start_after = entries[-1].name
