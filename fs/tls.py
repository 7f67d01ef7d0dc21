"""Optional wire encryption (``tls = "on"``): TLS under the RPC frames and the data-transfer
stream, and the cluster's own certificate authority.

What it is: every connection to a metadata server's RPC port or a block server's data port is
wrapped in ``trio.SSLStream`` (TLS 1.2 at least, 1.3 when both ends have it) before the
first frame; the client verifies the server's certificate against ``tls_ca_file`` and the
host name or IP address it connected to. Servers do not ask clients for certificates: block
servers prove themselves to the metadata server with the cluster key (``fs.nodeauth``), users
are who they say (docs/OPERATIONS.md "Security").

Zero set-up on one machine: the metadata server (or ``leasefs cluster up`` before it starts
anything) creates a CA in ``<meta data>/tls/`` (``ca.crt``, ``ca.key`` mode 0600) and issues
its own certificate from it for 127.0.0.1, ::1, localhost, the machine's host name and the
bind/advertised host. Block servers get theirs from ``cluster up`` (or
``leasefs tls issue``): the CA key stays with the metadata server's files and is never read
by a long-running block server (docs/design/security.md "Wire encryption"). ``cluster up --ha`` keeps one
CA in ``<home>/tls/`` and issues every metadata server's certificate too
(``server_settings``), so that one CA file verifies them all.

Transport semantics: ``https_compatible=True`` on both ends, so a close is a plain TCP close
(no close_notify to wait for: our shielded closes never block on the network) and EOF reads
as EOF as it does without TLS. That is safe here because every leasefs message is length
delimited: a connection cut short is always seen as a cut frame or packet, never as a shorter
message.

A server with TLS peeks at the first byte of each connection: a peer that does not start a
TLS handshake (byte 0x16) gets one plaintext error frame of its protocol saying the port
speaks TLS only, and the connection closes; a handshake that fails or does not finish within
``HANDSHAKE_TIMEOUT`` closes it with a warning naming the peer. A TLS client that reaches a
plaintext server gets ``TlsError`` naming the address and "the server does not speak TLS".

Concurrency contract: key and certificate generation and every file read are blocking and run
before ``trio.run`` or in ``trio.to_thread``; ``ClientTls.context`` loads its context once in
a worker thread (later calls return it without blocking); ``connect``/``accept`` run in the
caller's task on its trio thread.
"""

from __future__ import annotations

import datetime
import errno
import fcntl
import ipaddress
import logging
import os
import socket
import ssl
import stat
from dataclasses import dataclass

import trio

from . import tcpliveness
from .datafolder import make_private_folder
from .errors import InvalidArgument, ServerUnavailable, TlsError
from .rpcbase import format_address

log = logging.getLogger(__name__)

TLS_DIR = "tls"
CA_CERT = "ca.crt"
CA_KEY = "ca.key"
HANDSHAKE_TIMEOUT = 10.0      # seconds a server gives a peer to finish its TLS handshake
HANDSHAKE_BYTE = 0x16         # first byte of every TLS record carrying a handshake
CA_DAYS = 3650
CERT_DAYS = 825               # what browsers still accept; reissued when 30 days are left
RENEW_BEFORE = datetime.timedelta(days=30)


# --------------------------------------------------------------------------- files


def tls_dir(data_dir) -> str:
    return os.path.join(str(data_dir), TLS_DIR)


def ca_paths(meta_data_dir) -> tuple[str, str]:
    """``(ca.crt, ca.key)`` of the cluster CA kept with a metadata server's data."""
    folder = tls_dir(meta_data_dir)
    return os.path.join(folder, CA_CERT), os.path.join(folder, CA_KEY)


def default_hosts(*extra: str) -> list[str]:
    """Names a certificate of a server on this machine is issued for: loopback, the host
    name, and ``extra`` (bind and advertised hosts) unless they are wildcards."""
    hosts = ["127.0.0.1", "::1", "localhost", socket.gethostname()]
    for host in extra:
        if host and host not in ("0.0.0.0", "::", "*"):
            hosts.append(host)
    return list(dict.fromkeys(h.strip("[]") for h in hosts if h))


def _write_private(path: str, data: bytes) -> None:
    """Write ``path`` whole or not at all, mode 0600 from its creation."""
    tmp = f"{path}.tmp-{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)


class _DirLock:
    """An exclusive ``flock`` on ``<folder>/.lock``: the metadata server and ``cluster up``
    never write half a pair of files over each other."""

    def __init__(self, folder: str):
        make_private_folder(os.path.dirname(folder))   # the server's data folder
        os.makedirs(folder, mode=0o700, exist_ok=True)
        self.fd = os.open(os.path.join(folder, ".lock"), os.O_RDWR | os.O_CREAT, 0o600)

    def __enter__(self):
        fcntl.flock(self.fd, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc):
        os.close(self.fd)


def check_private(path: str, what: str) -> None:
    """``TlsError`` unless ``path`` exists and only its owner may read it."""
    try:
        info = os.stat(path)
    except OSError as exc:
        raise TlsError(f"{what} {path}: {exc.strerror or exc}") from None
    if info.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise TlsError(f"{what} {path}: readable by others (mode "
                       f"{stat.S_IMODE(info.st_mode):o}); chmod 600 it")


# --------------------------------------------------------------------------- certificates


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.timezone.utc)


def ensure_ca(meta_data_dir) -> str:
    """The cluster CA certificate's path, with the CA created (EC P-256, 10 years, key mode
    0600) when ``<meta data>/tls/ca.crt`` does not exist. Blocking."""
    return ensure_ca_in(tls_dir(meta_data_dir))


def ensure_ca_in(folder) -> str:
    """``ensure_ca`` with the CA's files directly in ``folder`` (``leasefs tls ca``)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    cert_path, key_path = os.path.join(folder, CA_CERT), os.path.join(folder, CA_KEY)
    with _DirLock(os.path.dirname(cert_path)):
        if os.path.exists(cert_path) and os.path.exists(key_path):
            return cert_path
        key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME,
                                             f"leasefs cluster CA ({socket.gethostname()})")])
        now = _now()
        ski = x509.SubjectKeyIdentifier.from_public_key(key.public_key())
        cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
                .public_key(key.public_key()).serial_number(x509.random_serial_number())
                .not_valid_before(now - datetime.timedelta(minutes=5))
                .not_valid_after(now + datetime.timedelta(days=CA_DAYS))
                .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
                .add_extension(x509.KeyUsage(
                    digital_signature=True, content_commitment=False, key_encipherment=False,
                    data_encipherment=False, key_agreement=False, key_cert_sign=True,
                    crl_sign=True, encipher_only=False, decipher_only=False), critical=True)
                .add_extension(ski, critical=False)
                .sign(key, hashes.SHA256()))
        _write_private(key_path, key.private_bytes(serialization.Encoding.PEM,
                                                   serialization.PrivateFormat.PKCS8,
                                                   serialization.NoEncryption()))
        # the certificate last: its presence says the pair is whole
        _write_private(cert_path, cert.public_bytes(serialization.Encoding.PEM))
        os.chmod(cert_path, 0o644)   # public: clients elsewhere get a copy
        log.info("created the cluster CA %s (key %s, mode 0600)", cert_path, key_path)
    return cert_path


def _san_entries(hosts) -> list:
    from cryptography import x509

    out = []
    for host in hosts:
        try:
            out.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            out.append(x509.DNSName(host))
    return out


def _covers(cert_path: str, ca_cert_path: str, hosts) -> bool:
    """``cert_path`` is issued by this CA, for every one of ``hosts``, and not about to
    expire."""
    from cryptography import x509

    try:
        with open(cert_path, "rb") as fh:
            cert = x509.load_pem_x509_certificate(fh.read())
        with open(ca_cert_path, "rb") as fh:
            ca = x509.load_pem_x509_certificate(fh.read())
        cert.verify_directly_issued_by(ca)
        names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except Exception:   # unreadable, not ours, no names (cryptography raises several types)
        return False
    if not all(entry in list(names) for entry in _san_entries(hosts)):
        return False
    return cert.not_valid_after_utc - _now() > RENEW_BEFORE


def issue(ca_cert_path: str, ca_key_path: str, out_dir, hosts, *,
          name: str = "server") -> tuple[str, str]:
    """``(<out>/<name>.crt, <out>/<name>.key)``: a server certificate from the CA for
    ``hosts`` (IP addresses and DNS names as subject alternative names), reissued when the
    one there is not from this CA, misses a host or expires within 30 days. Blocking."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    out_dir = str(out_dir)
    cert_path = os.path.join(out_dir, f"{name}.crt")
    key_path = os.path.join(out_dir, f"{name}.key")
    hosts = list(dict.fromkeys(hosts))
    with _DirLock(out_dir):
        if os.path.exists(key_path) and _covers(cert_path, ca_cert_path, hosts):
            return cert_path, key_path
        check_private(ca_key_path, "cluster CA key")
        try:
            with open(ca_cert_path, "rb") as fh:
                ca = x509.load_pem_x509_certificate(fh.read())
            with open(ca_key_path, "rb") as fh:
                ca_key = serialization.load_pem_private_key(fh.read(), password=None)
        except (OSError, ValueError) as exc:
            raise TlsError(f"cluster CA {ca_cert_path}: cannot be read: {exc}") from None
        key = ec.generate_private_key(ec.SECP256R1())
        now = _now()
        cert = (x509.CertificateBuilder()
                .subject_name(x509.Name([x509.NameAttribute(
                    NameOID.COMMON_NAME, f"leasefs {name} {hosts[0] if hosts else ''}".strip())]))
                .issuer_name(ca.subject).public_key(key.public_key())
                .serial_number(x509.random_serial_number())
                .not_valid_before(now - datetime.timedelta(minutes=5))
                .not_valid_after(min(now + datetime.timedelta(days=CERT_DAYS),
                                     ca.not_valid_after_utc))
                .add_extension(x509.SubjectAlternativeName(_san_entries(hosts)), critical=False)
                .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
                .add_extension(x509.KeyUsage(
                    digital_signature=True, content_commitment=False, key_encipherment=False,
                    data_encipherment=False, key_agreement=False, key_cert_sign=False,
                    crl_sign=False, encipher_only=False, decipher_only=False), critical=True)
                .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]),
                               critical=False)
                .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()),
                               critical=False)
                .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(
                    ca_key.public_key()), critical=False)
                .sign(ca_key, hashes.SHA256()))
        _write_private(key_path, key.private_bytes(serialization.Encoding.PEM,
                                                   serialization.PrivateFormat.PKCS8,
                                                   serialization.NoEncryption()))
        _write_private(cert_path, cert.public_bytes(serialization.Encoding.PEM))
        log.info("issued %s for %s from the cluster CA", cert_path, ", ".join(hosts))
    return cert_path, key_path


def server_settings(ca_home, data_dir, hosts, name: str) -> dict:
    """The settings a server on this machine needs for ``tls = on``: the CA kept in
    ``<ca_home>/tls/`` (created when missing) and a certificate issued from it for ``hosts``
    into ``<data_dir>/tls/<name>.crt`` (kept while it still covers them). Blocking."""
    ca_cert = ensure_ca(ca_home)
    cert, key = issue(ca_cert, ca_paths(ca_home)[1], tls_dir(data_dir), hosts, name=name)
    return {"tls_ca_file": ca_cert, "tls_cert_file": cert, "tls_key_file": key}


def block_server_settings(meta_data_dir, storage_data_dir, hosts) -> dict:
    """``server_settings`` of a block server whose CA is the metadata server's: what
    ``cluster up`` and the test harnesses hand their block servers. Blocking."""
    return server_settings(meta_data_dir, storage_data_dir, hosts, "storage")


# --------------------------------------------------------------------------- contexts


def client_context(ca_file: str) -> ssl.SSLContext:
    """Verifies servers against ``ca_file`` and the host connected to. Blocking (reads it)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_verify_locations(cafile=ca_file)
    except (OSError, ssl.SSLError) as exc:
        raise TlsError(f"tls_ca_file {ca_file}: {getattr(exc, 'strerror', None) or exc}") \
            from None
    return context


def server_context(cert_file: str, key_file: str) -> ssl.SSLContext:
    """Serves ``cert_file`` (its chain, PEM) with ``key_file`` (mode 0600). Blocking."""
    check_private(key_file, "tls_key_file")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    # no session resumption is used (each connection is new): do not send tickets
    context.num_tickets = 0
    try:
        context.load_cert_chain(cert_file, key_file)
    except (OSError, ssl.SSLError) as exc:
        raise TlsError(f"tls_cert_file {cert_file} / tls_key_file {key_file}: "
                       f"{getattr(exc, 'strerror', None) or exc}") from None
    return context


class ClientTls:
    """The client side of one CA file: its context, loaded once in a worker thread."""

    def __init__(self, ca_file: str):
        self.ca_file = ca_file
        self._context: ssl.SSLContext | None = None

    async def context(self) -> ssl.SSLContext:
        if self._context is None:
            self._context = await trio.to_thread.run_sync(client_context, self.ca_file)
        return self._context


_CLIENTS: dict[str, ClientTls] = {}


def client(config) -> ClientTls | None:
    """What the connections of a process with ``config`` verify servers with; None when
    ``tls`` is off. ``InvalidArgument`` when it is on without ``tls_ca_file``."""
    if config.tls != "on":
        return None
    if not config.tls_ca_file:
        raise InvalidArgument("tls = on needs tls_ca_file: the cluster's CA certificate "
                              "(<meta data>/tls/ca.crt; clients of 'leasefs cluster up' "
                              "find it by themselves)")
    found = _CLIENTS.get(config.tls_ca_file)
    if found is None:
        found = _CLIENTS[config.tls_ca_file] = ClientTls(config.tls_ca_file)
    return found


@dataclass
class ServerTls:
    """A server's TLS: its context and how long a peer may take to finish its handshake."""

    context: ssl.SSLContext
    timeout: float = HANDSHAKE_TIMEOUT


def meta_server_tls(config, data_dir, host: str) -> tuple[ServerTls, str]:
    """``(server TLS, CA file)`` of a metadata server: its configured certificate, else
    one issued from the cluster CA in ``<data>/tls/`` (created when missing). Blocking."""
    if config.tls_cert_file:
        if not config.tls_key_file:
            raise InvalidArgument("tls_cert_file is set without tls_key_file")
        return (ServerTls(server_context(config.tls_cert_file, config.tls_key_file)),
                config.tls_ca_file)
    ca_cert, ca_key = ca_paths(data_dir)
    if config.tls_ca_file and os.path.abspath(config.tls_ca_file) != os.path.abspath(ca_cert):
        raise InvalidArgument(f"tls_ca_file is {config.tls_ca_file} but no tls_cert_file is "
                              f"set: the metadata server issues its own certificate only "
                              f"from its own CA ({ca_cert}); set tls_cert_file and "
                              f"tls_key_file to one from your CA")
    ensure_ca(data_dir)
    cert, key = issue(ca_cert, ca_key, tls_dir(data_dir),
                      default_hosts(host, config.advertise_host), name="meta")
    return ServerTls(server_context(cert, key)), ca_cert


def block_server_tls(config) -> ServerTls:
    """A block server's TLS from ``tls_cert_file``/``tls_key_file``. Blocking."""
    if not (config.tls_cert_file and config.tls_key_file):
        raise InvalidArgument("tls = on: a block server needs tls_cert_file and tls_key_file, "
                              "a certificate from the cluster's CA (leasefs cluster up issues "
                              "them; elsewhere: leasefs tls issue --ca-dir <meta data>/tls "
                              "--host HOST --out DIR)")
    if not config.tls_ca_file:
        raise InvalidArgument("tls = on: a block server needs tls_ca_file (the cluster's CA "
                              "certificate, <meta data>/tls/ca.crt) to verify the metadata "
                              "server and the other block servers")
    return ServerTls(server_context(config.tls_cert_file, config.tls_key_file))


# --------------------------------------------------------------------------- connections


def _reason(exc: BaseException) -> str:
    cause = exc.__cause__ or exc.__context__ or exc
    if isinstance(cause, ssl.SSLCertVerificationError):
        return cause.verify_message or str(cause)
    if isinstance(cause, ssl.SSLError):
        return (cause.reason or str(cause)).replace("_", " ").lower()
    return str(cause) or type(cause).__name__


def _not_tls(exc: BaseException) -> bool:
    cause = exc.__cause__ or exc
    return isinstance(cause, ssl.SSLError) and cause.reason in (
        "WRONG_VERSION_NUMBER", "PACKET_LENGTH_TOO_LONG", "RECORD_LAYER_FAILURE",
        "UNKNOWN_PROTOCOL", "HTTP_REQUEST", "BAD_RECORD_TYPE")


async def connect(stream: trio.SocketStream, tls: ClientTls, host: str,
                  address: str) -> trio.SSLStream:
    """TLS over an open ``stream`` to ``host`` (the name or IP the certificate must carry);
    the handshake runs under the caller's timeout. ``TlsError`` for a server that does not
    speak TLS or whose certificate is not trusted (trying again will not help);
    ``ServerUnavailable`` when the connection broke during the handshake."""
    context = await tls.context()
    ssl_stream = trio.SSLStream(stream, context, server_hostname=host.strip("[]"),
                                https_compatible=True)
    try:
        await ssl_stream.do_handshake()
    except trio.BrokenResourceError as exc:
        with trio.CancelScope(shield=True):
            await stream.aclose()
        cause = exc.__cause__
        if isinstance(cause, ssl.SSLCertVerificationError):
            raise TlsError(f"TLS to {address}: the server's certificate is not trusted: "
                           f"{_reason(exc)} (tls_ca_file {tls.ca_file}: is it this cluster's "
                           f"CA, and the address a name the certificate carries?)") from None
        if _not_tls(exc):
            raise TlsError(f"TLS to {address}: the server does not speak TLS ({_reason(exc)}); "
                           f"is it running with tls = off?") from None
        if isinstance(cause, ssl.SSLError) and not isinstance(
                cause, (ssl.SSLEOFError, ssl.SSLSyscallError, ssl.SSLZeroReturnError)):
            raise TlsError(f"TLS handshake with {address} failed: {_reason(exc)}") from None
        raise ServerUnavailable(f"TLS handshake with {address}: connection lost "
                                f"({_reason(exc)})") from None
    except BaseException:
        with trio.CancelScope(shield=True):
            await stream.aclose()
        raise
    return ssl_stream


async def accept(stream: trio.SocketStream, server: ServerTls, peer: str, name: str,
                 refusals, plain_refusal: bytes) -> trio.SSLStream | None:
    """The TLS stream of an accepted connection, or None (the connection is closed, the
    reason logged through ``refusals``, a ``fs.limits.RefusalLog``): a peer that starts no
    TLS handshake gets the ``plain_refusal`` bytes (one frame of the server's protocol, in
    plaintext) first, so a client without TLS is told why instead of seeing a bare close."""
    accepted = None
    try:
        accepted = await _handshake(stream, server, peer, name, refusals, plain_refusal)
        return accepted
    finally:
        if accepted is None:
            with trio.CancelScope(shield=True):
                await stream.aclose()


#: seconds a refused plaintext peer's leftover bytes are read before the close
REFUSAL_LINGER = 1.0


async def _tell_and_drain(stream: trio.SocketStream, message: bytes) -> None:
    """Write ``message`` (never waiting for a slow reader), half-close, and read what the
    peer sent for up to ``REFUSAL_LINGER``: closing with its hello unread would make the
    kernel send RST, which can destroy the message before the peer reads it."""
    try:
        os.write(stream.socket.fileno(), message)
        with trio.move_on_after(REFUSAL_LINGER):
            await stream.send_eof()
            while await stream.receive_some(1 << 16):
                pass
    except (OSError, trio.BrokenResourceError, trio.ClosedResourceError):
        pass


async def _handshake(stream, server: ServerTls, peer: str, name: str, refusals,
                     plain_refusal: bytes) -> trio.SSLStream | None:
    peer_host = peer.rsplit(":", 1)[0]
    with trio.move_on_after(server.timeout):
        try:
            first = await stream.socket.recv(1, socket.MSG_PEEK)
        except OSError as exc:
            log.debug("%s: connection from %s lost before its handshake: %s", name, peer, exc)
            return None
        if not first:
            return None
        if first[0] != HANDSHAKE_BYTE:
            refusals.refused(peer_host, "tls", f"{name}: refusing a connection from {peer}: "
                             f"it does not speak TLS (this server has tls = on)")
            await _tell_and_drain(stream, plain_refusal)
            return None
        ssl_stream = trio.SSLStream(stream, server.context, server_side=True,
                                    https_compatible=True)
        try:
            await ssl_stream.do_handshake()
        except trio.BrokenResourceError as exc:
            refusals.refused(peer_host, "tls", f"{name}: TLS handshake from {peer} failed: "
                             f"{_reason(exc)}")
            return None
        return ssl_stream
    refusals.refused(peer_host, "tls", f"{name}: no TLS handshake from {peer} within "
                     f"{server.timeout:g} s; closing")
    return None


__all__ = ["ClientTls", "ServerTls", "accept", "block_server_settings", "block_server_tls",
           "ca_paths", "client",
           "client_context", "connect", "default_hosts", "ensure_ca", "issue",
           "meta_server_tls", "server_context", "server_settings", "tls_dir"]


async def connect_tcp(host: str, port: int, tls=None) -> trio.abc.Stream:
    """A TCP stream to ``host:port``; with ``tls`` (an ``fs.tls.ClientTls``, None when the
    setting is off) a ``trio.SSLStream`` over it whose handshake verified the server's
    certificate for ``host`` (``TlsError`` if not; see ``connect``). Watched for TCP
    liveness (``fs.tcpliveness``). A literal IP
    address is connected directly: trio's ``open_tcp_stream`` (resolution, happy eyeballs in
    a nursery of its own) costs about three times the CPU, and data connections are opened
    per block."""
    stream = await _connect_within_liveness(host, port)
    tcpliveness.watch(stream)
    if tls is None:
        return stream
    return await connect(stream, tls, host, format_address((host, port)))


async def _connect_within_liveness(host: str, port: int) -> trio.SocketStream:
    """The TCP handshake is the peer's kernel's work: a live host answers a SYN at once
    however busy its process is, and an unanswered SYN is retransmitted after 1 s and 3 s.
    So the plain connect gets ``tcp_liveness_timeout``, as any unacknowledged segment does,
    and a host that is cut off or down costs that, not the longer ``data_connect_timeout``
    (which still bounds the TLS handshake, the process's work)."""
    seconds = tcpliveness.timeout()
    if seconds <= 0:
        return await _connect_plain(host, port)
    with trio.move_on_after(seconds):
        return await _connect_plain(host, port)
    raise TimeoutError(errno.ETIMEDOUT, f"peer unreachable (no answer to a TCP connect "
                                        f"for {seconds:g} s)")


async def _connect_plain(host: str, port: int) -> trio.SocketStream:
    for family in (socket.AF_INET, socket.AF_INET6):
        try:
            socket.inet_pton(family, host)
        except OSError:
            continue
        sock = trio.socket.socket(family, socket.SOCK_STREAM)
        try:
            await sock.connect((host, port))
        except BaseException:
            sock.close()
            raise
        return trio.SocketStream(sock)
    return await trio.open_tcp_stream(host, port)
