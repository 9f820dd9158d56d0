"""The connection handshake: a peer proves it knows the cluster's token.

Messages carry pickles, and loading a pickle runs code, so nothing is loaded
from a peer before it has proved that it knows the cluster's token. The
handshake (docs/security.md gives the argument and compares it with SCRAM,
TLS 1.3 and Noise) is

    client -> server   "TRAY/2 RAW\\n" or "TRAY/2 TLS\\n"     (the client's mode)
    server -> client   the server's mode; different modes end the handshake
                       [TLS: a TLS 1.3 handshake, both sides show certificates]
    client -> server   peer name P (the address it meant to reach), nonce Nc
    server -> client   nonce Ns
    client -> server   HMAC(token, "client" | mode | P | Nc | Ns)
    server -> client   status byte; if accepted, HMAC(token, "server" | mode | P | Nc | Ns)

The client proves first, so the server is never an oracle that answers for
nonces of the caller's choosing before the caller has proved anything; each
proof covers both nonces (fresh in this session), the signer's role (a proof
cannot be reflected back in the other direction) and P, which the server
checks against its own addresses: a client tricked into connecting to a relay
signs the relay's address, which the real server refuses. What the handshake
alone cannot stop is an attacker on the network path taking over a connection
after it was authenticated; between machines on a network you do not trust,
use TLS."""

from __future__ import annotations

import hashlib
import hmac
import secrets
import ssl
import struct

import trio

from ..core.interfaces import ConnectionClosed
from .tcp_framing import _Reader

NONCE_BYTES = 32
PROOF_BYTES = 32  # HMAC-SHA256
PEER_NAME_BYTES_MAX = 1024

_PREAMBLE_RAW = b"TRAY/2 RAW\n"
_PREAMBLE_TLS = b"TRAY/2 TLS\n"
_PREAMBLE_BYTES = len(_PREAMBLE_RAW)
_ACCEPTED, _WRONG_PROOF, _WRONG_PEER = b"\x00", b"\x01", b"\x02"


class AuthenticationError(ConnectionClosed):
    """The peer does not know the cluster's token (or the handshake failed)."""


class WrongPeerError(ConnectionClosed):
    """The process that answered is not the one this connection was meant
    for: a relay, or an address that reaches it only through NAT or a proxy.
    (Not an AuthenticationError: the token may well be right.)"""


def _length_prefixed(*fields: bytes) -> bytes:
    return b"".join(struct.pack("<I", len(field)) + field for field in fields)


def _proof(token: bytes, signer: bytes, mode: bytes, peer: bytes, client_nonce: bytes,
           server_nonce: bytes) -> bytes:
    """What one side signs: the protocol, the signer's role, the mode (TLS or
    not), the server address the client meant to reach, and both nonces.
    Length prefixes keep the fields from sliding into each other."""
    transcript = b"tray handshake/2\0" + _length_prefixed(signer, mode, peer, client_nonce,
                                                          server_nonce)
    return hmac.new(token, transcript, hashlib.sha256).digest()


def _mode_name(preamble: bytes) -> str:
    return "TLS" if preamble == _PREAMBLE_TLS else "no TLS"


async def _server_handshake(stream: trio.abc.Stream, token: bytes,
                            tls: ssl.SSLContext | None, names: frozenset[bytes]
                            ) -> tuple[trio.abc.Stream, _Reader]:
    reader = _Reader(stream)
    theirs = bytes(await reader.exactly(_PREAMBLE_BYTES))
    if theirs not in (_PREAMBLE_RAW, _PREAMBLE_TLS):
        raise AuthenticationError("not a tray/2 handshake (an older tray, or not tray)")
    mine = _PREAMBLE_TLS if tls is not None else _PREAMBLE_RAW
    await stream.send_all(mine)
    if theirs != mine:
        raise AuthenticationError(f"the client speaks {_mode_name(theirs)}, this cluster "
                                  f"{_mode_name(mine)}: its token is not this cluster's")
    if tls is not None:
        assert reader.buffered_bytes == 0, "the client sent TLS bytes before our preamble"
        stream = trio.SSLStream(stream, tls, server_side=True)
        await stream.do_handshake()
        reader = _Reader(stream)
    (peer_bytes,) = struct.unpack("<H", await reader.exactly(2))
    if peer_bytes > PEER_NAME_BYTES_MAX:
        raise AuthenticationError(f"a peer name of {peer_bytes} bytes")
    peer = bytes(await reader.exactly(peer_bytes))
    client_nonce = bytes(await reader.exactly(NONCE_BYTES))
    server_nonce = secrets.token_bytes(NONCE_BYTES)
    await stream.send_all(server_nonce)
    proof = bytes(await reader.exactly(PROOF_BYTES))
    # Nothing that depends on the token leaves this process before the
    # client's proof is checked.
    if peer not in names:
        await stream.send_all(_WRONG_PEER)
        raise WrongPeerError(f"the client meant to reach {peer.decode(errors='replace')}, "
                             f"not this process ({', '.join(sorted(n.decode() for n in names))})"
                             ": a relay, or an address behind NAT or a proxy")
    if not hmac.compare_digest(proof, _proof(token, b"client", mine, peer, client_nonce,
                                             server_nonce)):
        await stream.send_all(_WRONG_PROOF)
        raise AuthenticationError("the client does not know this cluster's token")
    await stream.send_all(_ACCEPTED + _proof(token, b"server", mine, peer, client_nonce,
                                             server_nonce))
    return stream, reader


async def _client_handshake(stream: trio.abc.Stream, token: bytes,
                            tls: ssl.SSLContext | None, peer: bytes
                            ) -> tuple[trio.abc.Stream, _Reader]:
    reader = _Reader(stream)
    mine = _PREAMBLE_TLS if tls is not None else _PREAMBLE_RAW
    await stream.send_all(mine)
    theirs = bytes(await reader.exactly(_PREAMBLE_BYTES))
    if theirs not in (_PREAMBLE_RAW, _PREAMBLE_TLS):
        raise AuthenticationError("the server does not speak tray/2 (an older tray, or not "
                                  "tray)")
    if theirs != mine:
        if theirs == _PREAMBLE_TLS:
            raise AuthenticationError(
                "the cluster uses TLS and this token does not: use the token that "
                "'tray start --head --tls' printed (it begins with 'tls:')")
        raise AuthenticationError("this token asks for TLS but the server does not use it: "
                                  "refusing to talk without TLS")
    if tls is not None:
        stream = trio.SSLStream(stream, tls, server_side=False)
        await stream.do_handshake()
        reader = _Reader(stream)
    client_nonce = secrets.token_bytes(NONCE_BYTES)
    await stream.send_all(struct.pack("<H", len(peer)) + peer + client_nonce)
    server_nonce = bytes(await reader.exactly(NONCE_BYTES))
    await stream.send_all(_proof(token, b"client", mine, peer, client_nonce, server_nonce))
    status = bytes(await reader.exactly(1))
    if status == _WRONG_PEER:
        raise WrongPeerError(f"the process that answered is not {peer.decode()}: the "
                             "connection went through a relay, NAT or a proxy")
    if status != _ACCEPTED:
        raise AuthenticationError("the cluster rejected this token")
    proof = bytes(await reader.exactly(PROOF_BYTES))
    if not hmac.compare_digest(proof, _proof(token, b"server", mine, peer, client_nonce,
                                             server_nonce)):
        raise AuthenticationError("the server does not know this cluster's token")
    return stream, reader
