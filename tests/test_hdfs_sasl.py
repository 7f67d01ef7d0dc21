"""fs.hdfs.sasl (Hadoop's TOKEN / DIGEST-MD5 negotiation, server side), fs.hdfs.writable and
fs.hdfs.tokenfile (HDFS delegation token identifiers, Hadoop's token storage file), in
pure Python: RFC 2831's worked example, a DIGEST-MD5 client written here from the RFC, the
refusals. Hadoop's own client and reader are exercised in test_hdfs_token_java.py."""

from __future__ import annotations

import base64
import hashlib
import os
import re

import pytest

from fs import delegation
from fs.delegation import TokenId
from fs.errors import AuthenticationFailed, InvalidArgument
from fs.hdfs import sasl, tokenfile, writable
from fs.hdfs.pb.ipc_pb2 import RpcSaslProto

MASTER = delegation.master_key(b"k" * 32)
TOKEN = TokenId(42, "alice", "bob", 1732870000.123, 1733474800.456)
PASSWORD = delegation.password(MASTER, TOKEN)


# ----------------------------------------------------------------- a client from the RFC
def md5hex(data: bytes) -> str:
    return hashlib.md5(data).hexdigest()


def client_response(challenge: bytes, identifier: bytes, password: bytes, *,
                    cnonce="OA6MHXh6VqTrRk", nc="00000001", qop="auth",
                    uri="/default", nonce=None, extra="") -> tuple[bytes, str]:
    """RFC 2831 2.1.2 digest-response for a Hadoop token, and the rspauth it expects."""
    fields = dict(re.findall(r'([a-z-]+)="?([^",]*)"?', challenge.decode()))
    username = base64.b64encode(identifier).decode()
    passwd = base64.b64encode(password).decode()
    realm, nonce = fields["realm"], nonce or fields["nonce"]
    a1 = (hashlib.md5(f"{username}:{realm}:{passwd}".encode()).digest()
          + f":{nonce}:{cnonce}".encode())

    def kd(a2: str) -> str:
        return md5hex(f"{md5hex(a1)}:{nonce}:{nc}:{cnonce}:{qop}:{md5hex(a2.encode())}"
                      .encode())

    body = (f'charset=utf-8,username="{username}",realm="{realm}",nonce="{nonce}",nc={nc},'
            f'cnonce="{cnonce}",digest-uri="{uri}",maxbuf=65536,'
            f'response={kd("AUTHENTICATE:" + uri)},qop={qop}{extra}')
    return body.encode(), "rspauth=" + kd(":" + uri)


def lookup(identifier: bytes):
    """As the metadata server's: decode, recompute the password, refuse unknown tokens."""
    token = tokenfile.decode_identifier(identifier)
    if token.seq != TOKEN.seq:
        raise AuthenticationFailed(f"{token.describe()} is not known")
    return delegation.password(MASTER, token), token.owner


def negotiate(neg: sasl.SaslNegotiation) -> bytes:
    answer = neg.step(RpcSaslProto(state=RpcSaslProto.NEGOTIATE))
    assert answer.state == RpcSaslProto.NEGOTIATE and len(answer.auths) == 1
    auth = answer.auths[0]
    assert (auth.method, auth.mechanism, auth.protocol, auth.serverId) == (
        "TOKEN", "DIGEST-MD5", "", "default")
    assert auth.HasField("protocol")    # Hadoop's server sets it, empty
    return auth.challenge


def initiate(token: bytes, method="TOKEN") -> RpcSaslProto:
    return RpcSaslProto(state=RpcSaslProto.INITIATE, token=token, auths=[
        RpcSaslProto.SaslAuth(method=method, mechanism="DIGEST-MD5", protocol="",
                              serverId="default")])


IDENT = tokenfile.encode_identifier(TOKEN)


# ----------------------------------------------------------------- RFC 2831 section 4
def test_rfc2831_worked_example():
    a1 = sasl.digest_a1("chris", "elwood.innosoft.com", "secret", "OA6MG9tEQGm2hh",
                        "OA6MHXh6VqTrRk")
    args = ("OA6MG9tEQGm2hh", "00000001", "OA6MHXh6VqTrRk", "auth", "imap/elwood.innosoft.com")
    assert sasl.digest_response(a1, *args) == "d388dad90d4bbd760a152321f2143af7"
    assert sasl.digest_rspauth(a1, *args) == "ea40f60335c427b5527b84dbabcdfffd"
    parsed = sasl.parse_directives(
        b'charset=utf-8,username="chris",realm="elwood.innosoft.com",'
        b'nonce="OA6MG9tEQGm2hh",nc=00000001,cnonce="OA6MHXh6VqTrRk",'
        b'digest-uri="imap/elwood.innosoft.com",response=d388dad90d4bbd760a152321f2143af7,'
        b'qop=auth', "rfc")
    assert parsed["digest-uri"] == "imap/elwood.innosoft.com" and parsed["nc"] == "00000001"


def test_rfc2831_example_through_the_server():
    server = sasl.DigestServer(lambda ident: (b"", ""), realm="elwood.innosoft.com",
                               digest_uri="imap/elwood.innosoft.com", nonce="OA6MG9tEQGm2hh")
    assert b'nonce="OA6MG9tEQGm2hh"' in server.challenge()
    # the RFC's username and password are not base64 tokens: the server's lookup gets the
    # decoded identifier, so the RFC's response cannot pass through it unchanged, but the
    # parse and every check before the lookup do
    with pytest.raises(sasl.SaslRefused, match="base64"):
        server.respond(b'username="chris",realm="elwood.innosoft.com",nonce="OA6MG9tEQGm2hh",'
                       b'nc=00000001,cnonce="OA6MHXh6VqTrRk",digest-uri="imap/elwood.innosoft'
                       b'.com",response=d388dad90d4bbd760a152321f2143af7,qop=auth')


# ----------------------------------------------------------------- the negotiation
def test_token_negotiation_succeeds_and_server_proves_itself():
    neg = sasl.SaslNegotiation(lookup)
    challenge = negotiate(neg)
    assert b'qop="auth"' in challenge and b'realm="default"' in challenge
    response, rspauth = client_response(challenge, IDENT, PASSWORD)
    answer = neg.step(initiate(response))
    assert answer.state == RpcSaslProto.SUCCESS and answer.token.decode() == rspauth
    assert neg.done and neg.authenticated == sasl.Authenticated("alice", IDENT)
    neg.authenticated.check_claim("alice")
    neg.authenticated.check_claim("")     # no user in the context: the token's
    with pytest.raises(sasl.SaslRefused, match="doesn't match") as exc:
        neg.authenticated.check_claim("root")
    assert exc.value.java_class == sasl.ACCESS_CONTROL
    with pytest.raises(sasl.SaslRefused):
        neg.authenticated.check_claim("alice", real_user="root")
    # nothing more is accepted on this connection
    with pytest.raises(sasl.SaslRefused, match="already complete"):
        neg.step(initiate(response))


def test_fresh_nonce_per_connection():
    assert negotiate(sasl.SaslNegotiation(lookup)) != negotiate(sasl.SaslNegotiation(lookup))


def test_empty_initiate_gets_the_challenge_then_response():
    neg = sasl.SaslNegotiation(lookup)
    challenge = negotiate(neg)
    again = neg.step(initiate(b""))
    assert again.state == RpcSaslProto.CHALLENGE and again.token == challenge
    response, rspauth = client_response(challenge, IDENT, PASSWORD)
    done = neg.step(RpcSaslProto(state=RpcSaslProto.RESPONSE, token=response))
    assert done.token.decode() == rspauth and neg.authenticated.user == "alice"


def test_simple_mode_switches_the_client_to_simple():
    neg = sasl.SaslNegotiation(None)
    answer = neg.step(RpcSaslProto(state=RpcSaslProto.NEGOTIATE))
    assert answer.state == RpcSaslProto.SUCCESS and not answer.auths and neg.done
    assert neg.authenticated is None


def refused(neg, message, match, java_class=None):
    with pytest.raises(sasl.SaslRefused, match=match) as exc:
        neg.step(message)
    if java_class:
        assert exc.value.java_class == java_class
    assert neg.phase is sasl.Phase.FAILED
    with pytest.raises(sasl.SaslRefused):   # and stays refused
        neg.step(message)


def test_forged_password_refused():
    neg = sasl.SaslNegotiation(lookup)
    response, _ = client_response(negotiate(neg), IDENT, b"\0" * len(PASSWORD))
    refused(neg, initiate(response), "wrong response", sasl.INVALID_TOKEN)


def test_altered_identifier_refused():
    """An identifier that claims another owner: the server recomputes the password over
    what it names, so the client's (over the original) does not match."""
    neg = sasl.SaslNegotiation(lookup)
    forged = tokenfile.encode_identifier(TokenId(42, "root", "bob", TOKEN.issued,
                                                 TOKEN.max_date))
    response, _ = client_response(negotiate(neg), forged, PASSWORD)
    refused(neg, initiate(response), "wrong response", sasl.INVALID_TOKEN)


def test_unknown_token_refused_with_the_lookups_reason():
    neg = sasl.SaslNegotiation(lookup)
    other = TokenId(7, "alice", "bob", TOKEN.issued, TOKEN.max_date)
    response, _ = client_response(negotiate(neg), tokenfile.encode_identifier(other),
                                  delegation.password(MASTER, other))
    refused(neg, initiate(response), "token 7 of alice is not known", sasl.INVALID_TOKEN)


def test_replayed_response_refused_on_another_connection():
    first = sasl.SaslNegotiation(lookup)
    response, _ = client_response(negotiate(first), IDENT, PASSWORD)
    assert first.step(initiate(response)).state == RpcSaslProto.SUCCESS
    second = sasl.SaslNegotiation(lookup)
    negotiate(second)
    refused(second, initiate(response), "another nonce")


@pytest.mark.parametrize("change, match, java_class", [
    ({"nc": "00000002"}, "nonce-count '00000002'", None),
    ({"qop": "auth-int"}, "qop 'auth-int' refused: leasefs offers only 'auth'", None),
    ({"qop": "auth-conf"}, "qop 'auth-conf' refused: leasefs offers only 'auth'", None),
    ({"uri": "hdfs/default"}, "digest-uri", None),
    ({"extra": ',authzid="root"'}, "authorization id", sasl.ACCESS_CONTROL),
])
def test_response_fields_refused(change, match, java_class):
    """A replay counter past 1, a security layer, another service, acting for another."""
    neg = sasl.SaslNegotiation(lookup)
    response, _ = client_response(negotiate(neg), IDENT, PASSWORD, **change)
    refused(neg, initiate(response), match, java_class)


def test_second_answer_to_one_nonce_refused():
    server = sasl.DigestServer(lookup)
    bad, _ = client_response(server.challenge(), IDENT, b"x")
    with pytest.raises(sasl.SaslRefused, match="wrong response"):
        server.respond(bad)
    good, _ = client_response(server.challenge(), IDENT, PASSWORD)
    with pytest.raises(sasl.SaslRefused, match="already answered"):
        server.respond(good)


def test_other_method_refused():
    neg = sasl.SaslNegotiation(lookup)
    negotiate(neg)
    refused(neg, initiate(b"x", method="SIMPLE"), "SIMPLE authentication .* not enabled",
            sasl.ACCESS_CONTROL)


@pytest.mark.parametrize("message, match", [
    (RpcSaslProto(state=RpcSaslProto.INITIATE), "INITIATE not expected now"),
    (RpcSaslProto(state=RpcSaslProto.RESPONSE, token=b"x"), "RESPONSE not expected"),
    (RpcSaslProto(state=RpcSaslProto.SUCCESS), "SUCCESS not expected"),
])
def test_out_of_order_refused(message, match):
    refused(sasl.SaslNegotiation(lookup), message, match)


@pytest.mark.parametrize("token, match", [
    (b"\xff\xfe", "not UTF-8"),
    (b'username="abc', "unterminated"),
    (b"username", "not name=value"),
    (b'nonce="a",nonce="b"', "given twice"),
    (b'username="a"x', "text after"),
    (b"x" * 5000, "limit 4096"),
    (b'username="!!",nonce="n",cnonce="c",nc=00000001,digest-uri="/default",response=0,'
     b'realm="default"', "another nonce"),
    (b'realm="default",cnonce="c",nc=00000001,digest-uri="/default",response=0',
     "without username"),
])
def test_garbage_responses_refused(token, match):
    neg = sasl.SaslNegotiation(lookup)
    negotiate(neg)
    refused(neg, initiate(token), match)


def test_garbage_username_refused():
    neg = sasl.SaslNegotiation(lookup)
    challenge = negotiate(neg)
    response, _ = client_response(challenge, IDENT, PASSWORD)
    response = re.sub(rb'username="[^"]*"', b'username="@@"', response)
    refused(neg, initiate(response), "base64", sasl.INVALID_TOKEN)
    neg = sasl.SaslNegotiation(lookup)
    response, _ = client_response(negotiate(neg), b"\x00garbage", PASSWORD)
    refused(neg, initiate(response), "token refused: HDFS delegation token identifier",
            sasl.INVALID_TOKEN)


# ----------------------------------------------------------------- Writable and identifiers
@pytest.mark.parametrize("value, encoded", [
    (0, "00"), (127, "7f"), (-112, "90"), (128, "8f80"), (-113, "8770"),
    (1732870000123, "8a01937719cdfb"), (-(1 << 63), "807fffffffffffffff"),
])
def test_vlong_layout(value, encoded):
    assert writable.vlong(value).hex() == encoded
    r = writable.Reader(bytes.fromhex(encoded), "t")
    assert r.vlong() == value
    r.end()


def test_identifier_round_trip_gives_the_same_password():
    ident = tokenfile.encode_identifier(TOKEN)
    assert ident.hex() == ("00" "05616c696365" "03626f62" "00" "8a01937719cdfb"
                           "8a01939b265348" "2a" "00")
    back = tokenfile.decode_identifier(ident)
    assert back == TOKEN and delegation.password(MASTER, back) == PASSWORD


def test_identifier_of_a_non_millisecond_token_refused():
    with pytest.raises(InvalidArgument, match="not a whole millisecond"):
        tokenfile.encode_identifier(TokenId(1, "a", "a", 1.0001, 2.0))


@pytest.mark.parametrize("data, match", [
    (IDENT[:-1], "bytes announced"),
    (IDENT + b"\0", "left over"),
    (b"\x01" + IDENT[1:], "unknown version"),
    (IDENT[:-1] + b"\x01", "master key"),
    (IDENT.replace(b"\x00\x8a", b"\x04root\x8a", 1), "real user"),
    (IDENT.replace(b"\x2a\x00", b"\x8f\x2a\x00"), "canonical"),      # non-minimal seq
    (b"\x00\x8f\xff", "bytes announced"),
    (b"\x00\x04\xff\xfe\xfd\xfc", "not UTF-8"),
])
def test_malformed_identifiers_refused(data, match):
    with pytest.raises(InvalidArgument, match=match):
        tokenfile.decode_identifier(data)


def test_token_file_round_trip(tmp_path):
    token = tokenfile.delegation_token(TOKEN, PASSWORD, "127.0.0.1:9000")
    creds = tokenfile.Credentials({"127.0.0.1:9000": token}, {"k": b"secret"})
    path = str(tmp_path / "t")
    creds.save(path)
    assert os.stat(path).st_mode & 0o777 == 0o600
    assert open(path, "rb").read()[:5] == b"HDTS\0"
    assert tokenfile.Credentials.load(path) == creds


@pytest.mark.parametrize("data, match", [
    (b"", "no HDTS header"),
    (b'{"kind": "leasefs-delegation-token"}', "no HDTS header"),
    (b"HDTS\x01\x00\x00", "format 1"),
    (b"HDTS\x00\x8c\x7f\xff\xff\xff", "count"),
    (b"HDTS\x00\x01\x00", "bytes announced"),
])
def test_bad_token_files_refused(tmp_path, data, match):
    path = tmp_path / "bad"
    path.write_bytes(data)
    with pytest.raises(AuthenticationFailed, match=f"token file {path}: .*{match}"):
        tokenfile.Credentials.load(str(path))


def test_random_input_gets_only_clear_refusals():
    """Hostile bytes: mutated responses, identifiers and token files raise the modules'
    own errors (a refusal to send back), never anything else, and authenticate no one but
    the token's owner."""
    import random
    rng = random.Random(35)
    good, _ = client_response(b'realm="default",nonce="n"', IDENT, PASSWORD)
    file_bytes = tokenfile.Credentials(
        {"s": tokenfile.delegation_token(TOKEN, PASSWORD, "s")}).encode()
    for _ in range(2000):
        data = bytearray(rng.choice([good, IDENT, file_bytes]))
        for _ in range(rng.randint(1, 4)):
            at = rng.randrange(len(data))
            if rng.random() < 0.5:
                data[at] = rng.randrange(256)
            else:
                del data[at:at + rng.randint(1, 8)]
        try:   # a mutation of what the proof does not cover (maxbuf, charset) may pass
            _, who = sasl.DigestServer(lookup, nonce="n").respond(bytes(data))
            assert who == sasl.Authenticated("alice", IDENT)
        except sasl.SaslRefused:
            pass
        for decode in (lambda: tokenfile.Credentials.decode(b"HDTS\0" + data[5:], "f"),
                       lambda: tokenfile.decode_identifier(bytes(data))):
            try:
                decode()
            except InvalidArgument:
                pass
