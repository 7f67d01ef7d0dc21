"""``leasefs meta`` and ``leasefs storage``: run one server process in the foreground.

Why: the same entry point serves people starting a server by hand, ``leasefs cluster up``
(detached processes) and the test harness (``--port 0 --address-file F``). Each runs the
server under ``trio.run``, writes the bound ``host:port`` to ``--address-file`` atomically
(tmp + rename) once the server listens, and exits with status 0 on SIGTERM/SIGINT after the
server's own shutdown ran.

Concurrency contract: one trio run on the main thread; signals are received as trio
events (``trio.open_signal_receiver``), never by Python signal handlers racing the loop.
"""

from __future__ import annotations

import logging
import os
import signal
import sys

import trio

from fs.datafolder import private_umask
from fs.errors import LeaseFSError, NoSpace, sole_exception
from fs.rpc import format_address, parse_address

from ..common import PROG, load_config

log = logging.getLogger(__name__)


def setup_logging(level: str | None) -> None:
    logging.basicConfig(level=getattr(logging, (level or "INFO").upper(), logging.INFO),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                        stream=sys.stderr)


def address_text(started) -> str:
    """Whatever a server reported through ``task_status.started`` → ``"host:port"``."""
    if isinstance(started, str):
        return started
    if isinstance(started, dict):
        for key in ("address", "rpc_address", "rpc", "data_address"):
            if key in started:
                return address_text(started[key])
    if isinstance(started, (tuple, list)) and len(started) >= 2:
        return format_address(started)
    raise LeaseFSError(f"server reported an address I cannot read: {started!r:.100}")


def write_address_file(path: str, address: str) -> None:
    """Write ``address`` so a reader never sees a partial file (tmp in the same dir + rename)."""
    path = os.path.abspath(path)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as fh:
        fh.write(address + "\n")
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def remove_address_file(path: str, address: str) -> None:
    try:
        with open(path) as fh:
            if fh.read().strip() != address:
                return  # a newer process owns it now
        os.unlink(path)
    except OSError:
        pass


async def serve_until_signal(start, address_file: str | None, what: str) -> None:
    """``await nursery.start(start)``, publish the address, run until SIGTERM/SIGINT."""
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async with trio.open_nursery() as nursery:

            async def server(task_status=trio.TASK_STATUS_IGNORED):
                await start(task_status=task_status)
                log.warning("%s stopped by itself", what)
                nursery.cancel_scope.cancel()

            started = await nursery.start(server)
            address = address_text(started)
            if address_file:
                write_address_file(address_file, address)
            log.info("%s running at %s (pid %d)", what, address, os.getpid())
            try:
                async for signum in signals:
                    log.info("%s: %s received, shutting down", what, signal.Signals(signum).name)
                    break
            finally:
                nursery.cancel_scope.cancel()
                if address_file:
                    remove_address_file(address_file, address)


def _run(start, args, what: str) -> int:
    try:
        trio.run(serve_until_signal, start, args.address_file, what)
    except BaseException as group:
        exc = sole_exception(group)
        if isinstance(exc, LeaseFSError):
            text = str(exc)
        elif isinstance(exc, OSError):  # port in use, data folder not writable, ...
            text = (exc.strerror or str(exc)) + (f": {exc.filename}" if exc.filename else "")
        elif isinstance(exc, KeyboardInterrupt):
            return 130
        else:
            raise
        log.error("%s failed: %s", what, text)
        print(f"{PROG} {args.command}: {text}", file=sys.stderr)
        return 1
    return 0


def find_journal_dir(directory: str) -> str:
    """Accept the journal folder itself or a metadata data folder that holds it."""
    def has_segments(d):
        try:
            return any(name.startswith("edits_") for name in os.listdir(d))
        except OSError:
            return False
    if has_segments(directory):
        return directory
    try:
        subdirs = sorted(e.path for e in os.scandir(directory) if e.is_dir())
    except OSError:
        return directory
    for preferred in ("journal", "edits", "current"):
        candidate = os.path.join(directory, preferred)
        if candidate in subdirs and has_segments(candidate):
            return candidate
    for candidate in subdirs:
        if has_segments(candidate):
            return candidate
    return directory


def data_folder_of(given: str, journal_dir: str) -> str:
    """The metadata data folder a check names: the one holding the namespace store (its
    ``db`` folder) next to the journal, else the journal's parent."""
    if os.path.isdir(os.path.join(given, "db")):
        return given
    return os.path.dirname(os.path.abspath(journal_dir))


def store_applied_txid(data_dir: str) -> tuple[int | None, str]:
    """The applied txid of the namespace store in ``data_dir`` (its ``db`` folder), or
    None and why not; the check then judges the journal alone. ``NoSpace`` when a start
    would refuse for want of room (the store is opened as a start opens it)."""
    import plyvel

    from meta.schema import keys
    from meta.start_space import open_store

    db = os.path.join(data_dir, "db")
    if not os.path.isdir(db):
        return None, "no namespace store (db folder) next to the journal"
    try:
        store = open_store(data_dir, create=False)
    except (plyvel.Error, OSError) as exc:   # e.g. the running server holds its lock
        why = exc.args[0].decode(errors="replace") if exc.args and isinstance(
            exc.args[0], bytes) else str(exc)
        return None, f"namespace store {db} not readable (is the server running?): {why}"
    try:
        return int(keys.read_counter(store, keys.APPLIED_TXID)), f"namespace store {db}"
    finally:
        store.close()


def run_meta(args) -> int:
    if args.check_journal:
        # an offline check's store open writes LevelDB files too; the umask is given back,
        # as the check may run inside another program (the tests call main())
        umask = private_umask()
        try:
            return check_journal_command(args)
        finally:
            os.umask(umask)
    private_umask()   # LevelDB's files, the journal: for the server's whole life
    if not args.data:
        from ..formatting import UsageError
        raise UsageError("meta needs --data DIR (or --check-journal DIR)")
    setup_logging(getattr(args, "log_level", None))
    config = load_config(args)
    host = args.host or config.bind_host
    port = args.port if args.port is not None else parse_address(config.meta_address, 8020)[1]
    if args.http_port is not None:
        http_port = args.http_port
    else:  # with --port 0 (tests, several clusters) a fixed status port would collide
        http_port = 0 if port == 0 else config.meta_http_port
    if args.hdfs_port is not None:
        hdfs_port = args.hdfs_port
    else:  # as the status page's
        hdfs_port = 0 if port == 0 else config.meta_hdfs_port
    from meta.serverrun import run_meta_server

    async def start(task_status=trio.TASK_STATUS_IGNORED):
        await run_meta_server(config, args.data, host=host, port=port, http_port=http_port,
                              hdfs_port=hdfs_port, task_status=task_status)

    return _run(start, args, "metadata server")


def check_journal_command(args) -> int:
    """``leasefs meta --check-journal``: the same checks a start makes, without starting."""
    from meta.journal.files import check_journal
    directory = find_journal_dir(args.check_journal)
    if not os.path.isdir(directory):  # a mistyped folder is not a corrupt journal
        cause = "not a directory" if os.path.exists(directory) else \
            "no such file or directory"
        print(f"{PROG} meta --check-journal: {directory}: {cause}", file=sys.stderr)
        return 1
    try:
        applied, store_note = store_applied_txid(data_folder_of(args.check_journal,
                                                                directory))
    except NoSpace as exc:   # a start would refuse: so does the check
        print(f"{PROG} meta --check-journal: {exc}", file=sys.stderr)
        return 1
    print(f"{store_note}" + (f": applied txid {applied}" if applied is not None else ""))
    try:
        lines = check_journal(directory, store_applied=applied)
    except LeaseFSError as exc:
        where = ""
        if getattr(exc, "file", None) and str(exc.file) not in str(exc):
            where = f" ({exc.file}" + (f" at offset {exc.offset}" if getattr(exc, "offset", None)
                                       is not None else "") + ")"
        print(f"{PROG} meta --check-journal: {directory}: CORRUPT: {exc}{where}",
              file=sys.stderr)
        return 1
    for line in lines:
        print(line)
    return 0


def run_storage(args) -> int:
    setup_logging(getattr(args, "log_level", None))
    config = load_config(args)
    from ..common import command_meta_address
    meta_address = command_meta_address(args)
    host = args.host or config.bind_host
    port = args.port if args.port is not None else config.storage_port
    private_umask()   # replica files: the server user's alone
    from storage.server import run_block_server

    async def start(task_status=trio.TASK_STATUS_IGNORED):
        await run_block_server(config, args.data, meta_address=meta_address, host=host,
                               port=port, task_status=task_status)

    return _run(start, args, "block server")


def register(sub, common) -> None:
    p = sub.add_parser("meta", parents=[common], help="run the metadata server (foreground)",
                       description="Run the metadata server (NameNode role) until SIGTERM/SIGINT.")
    p.add_argument("--data", help="data folder (LevelDB namespace + edit journal)")
    p.add_argument("--host", default=None, help="address to bind (default: bind_host setting)")
    p.add_argument("--port", type=int, default=None, help="RPC port (default 8020; 0 = any free)")
    p.add_argument("--http-port", type=int, default=None,
                   help="status page port (default 9870, or off when --port is 0; 0 = off)")
    p.add_argument("--hdfs-port", type=int, default=None,
                   help="port for Hadoop's client, hdfs:// (default the meta_hdfs_port "
                        "setting, 9000, or off when --port is 0; 0 = off)")
    p.add_argument("--address-file", default=None,
                   help="write the bound HOST:PORT here once listening (atomic)")
    p.add_argument("--check-journal", metavar="DIR", default=None,
                   help="verify a journal (or metadata data) folder offline and exit")
    p.set_defaults(func=run_meta, raw=True)

    p = sub.add_parser("storage", parents=[common], help="run one block server (foreground)",
                       description="Run a block server (DataNode role) until SIGTERM/SIGINT.")
    p.add_argument("--data", required=True, help="data folder (replicas)")
    p.add_argument("--host", default=None,
                   help="address to bind and advertise (default: bind_host setting; 0.0.0.0 "
                        "advertises this host's address toward the metadata server; "
                        "advertise_host overrides)")
    p.add_argument("--port", type=int, default=None, help="data port (default 9866; 0 = any free)")
    p.add_argument("--address-file", default=None,
                   help="write the bound HOST:PORT here once listening (atomic)")
    p.set_defaults(func=run_storage, raw=True)
