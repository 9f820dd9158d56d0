"""TLS contexts derived from a cluster's token.

A cluster started with ``tray start --tls`` has a token that begins with
``tls:``; every process that holds it speaks TLS 1.3 over TCP (Unix sockets
stay within one machine and a 0700 directory). The certificates are derived
from the token: an Ed25519 CA and one node certificate it signs, built
deterministically (``cryptography``, the optional ``tray[tls]`` extra), so
the token is the only secret to hand out and every process can rebuild them.
Both sides show the node certificate and accept only certificates of their
cluster's CA; the token handshake then runs inside the TLS channel."""

from __future__ import annotations

import datetime
import functools
import hashlib
import hmac
import os
import ssl
import tempfile

from ..exceptions import TrayError

TLS_TOKEN_PREFIX = b"tls:"


class TlsUnavailableError(TrayError):
    """The cluster's token asks for TLS, and this Python lacks what it needs."""


def _derived_secret(token: bytes, label: bytes) -> bytes:
    return hmac.new(token, b"tray tls/1 " + label, hashlib.sha256).digest()


@functools.lru_cache(maxsize=4)
def tls_contexts(token: bytes) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    """(server, client) TLS 1.3 contexts for the cluster whose token this is."""
    try:
        from cryptography import x509
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
        from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
    except ImportError:
        raise TlsUnavailableError(
            "this cluster uses TLS (its token begins with 'tls:'), which needs the "
            "cryptography package: pip install 'tray[tls]'") from None
    ca_key = Ed25519PrivateKey.from_private_bytes(_derived_secret(token, b"ca key"))
    node_key = Ed25519PrivateKey.from_private_bytes(_derived_secret(token, b"node key"))
    fingerprint = hashlib.sha256(ca_key.public_key().public_bytes(
        serialization.Encoding.Raw, serialization.PublicFormat.Raw)).hexdigest()[:16]
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME,
                                            f"tray cluster CA {fingerprint}")])
    # Fixed dates and serials: every process derives the same certificates.
    not_before = datetime.datetime(2020, 1, 1, tzinfo=datetime.UTC)
    not_after = datetime.datetime(9999, 12, 31, tzinfo=datetime.UTC)

    def usage(*, signs_certificates: bool) -> x509.KeyUsage:
        return x509.KeyUsage(digital_signature=not signs_certificates,
                             content_commitment=False, key_encipherment=False,
                             data_encipherment=False, key_agreement=False,
                             key_cert_sign=signs_certificates, crl_sign=signs_certificates,
                             encipher_only=False, decipher_only=False)

    def serial(label: bytes) -> int:
        return int.from_bytes(_derived_secret(token, label)[:16], "big") >> 1

    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name)
          .public_key(ca_key.public_key()).serial_number(serial(b"ca serial"))
          .not_valid_before(not_before).not_valid_after(not_after)
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
          .add_extension(usage(signs_certificates=True), critical=True)
          .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()),
                         critical=False)
          .sign(ca_key, None))
    node = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME,
                                                        f"tray node {fingerprint}")]))
            .issuer_name(ca_name).public_key(node_key.public_key())
            .serial_number(serial(b"node serial"))
            .not_valid_before(not_before).not_valid_after(not_after)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(usage(signs_certificates=False), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH,
                                                  ExtendedKeyUsageOID.CLIENT_AUTH]),
                           critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(
                ca_key.public_key()), critical=False)
            .sign(ca_key, None))
    chain_pem = node.public_bytes(serialization.Encoding.PEM) + node_key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption())
    contexts = []
    for purpose in (ssl.PROTOCOL_TLS_SERVER, ssl.PROTOCOL_TLS_CLIENT):
        context = ssl.SSLContext(purpose)
        context.minimum_version = ssl.TLSVersion.TLSv1_3
        # Node addresses are IPs that no certificate could list; what proves
        # a peer is a certificate signed by this cluster's CA.
        context.check_hostname = False
        context.verify_mode = ssl.CERT_REQUIRED
        context.verify_flags |= ssl.VERIFY_X509_STRICT
        context.load_verify_locations(cadata=ca.public_bytes(serialization.Encoding.PEM)
                                      .decode())
        # load_cert_chain reads files only: a 0600 file (mkstemp), removed at once.
        fd, path = tempfile.mkstemp(prefix="tray-tls-")
        try:
            os.write(fd, chain_pem)
            os.close(fd)
            context.load_cert_chain(path)
        finally:
            os.unlink(path)
        contexts.append(context)
    return contexts[0], contexts[1]
