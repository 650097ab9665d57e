"""HTTPS endpoints: a failed TLS check says which check failed, and a private CA can be trusted."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import socket
import ssl
import struct
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import asyncpg
import pytest
import trustme

import pgferry
from pgferry.delivery.fasthttp import FastSender, tls_context
from tests.helpers import FAST, RunningRelay, cli, eventually

ANSWER = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"


class TlsServer:
    """Answers 200 to every request, over TLS with the certificate it is given."""

    def __init__(self, cert: trustme.LeafCert) -> None:
        self.context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        cert.configure_cert(self.context)
        self.requests = 0
        self.server: asyncio.Server | None = None

    async def start(self) -> str:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0, ssl=self.context)
        return f"https://127.0.0.1:{self.server.sockets[0].getsockname()[1]}/hook"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                               if line.lower().startswith(b"content-length:")), 0)  # fmt: skip
                await reader.readexactly(length)
                self.requests += 1
                writer.write(ANSWER)
                await writer.drain()
        except (OSError, asyncio.IncompleteReadError, ssl.SSLError):
            writer.close()

    async def stop(self) -> None:
        if self.server is not None:
            self.server.close()


MakeServer = Callable[[trustme.LeafCert], Awaitable[str]]


@pytest.fixture
async def tls_server() -> AsyncIterator[MakeServer]:
    started: list[TlsServer] = []

    async def make(cert: trustme.LeafCert) -> str:
        server = TlsServer(cert)
        started.append(server)
        return await server.start()

    yield make
    for server in started:
        await server.stop()


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    return trustme.CA()


async def post(url: str, tls: ssl.SSLContext | None = None) -> tuple[str | None, str]:
    sender = FastSender(pool_size=1, tls=tls)
    try:
        result = await sender.send(url, b"{}", {}, timeout=2, connect_timeout=1)
    finally:
        await sender.close()
    return result.error_class, result.error or ""


async def test_each_failed_certificate_check_says_which_it_was(
    ca: trustme.CA, tls_server: MakeServer, tmp_path: Path
) -> None:
    now = datetime.now(UTC)
    untrusted = await tls_server(ca.issue_cert("127.0.0.1"))
    wrong_name = await tls_server(ca.issue_cert("other.example"))
    expired = await tls_server(ca.issue_cert("127.0.0.1", not_before=now - timedelta(days=30),
                                              not_after=now - timedelta(days=1)))  # fmt: skip
    ca_file = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    trusting = tls_context(str(ca_file))

    assert await post(untrusted) == (
        "tls", f"TLS error with 127.0.0.1:{untrusted.split(':')[2].split('/')[0]}: "
        "certificate verify failed: unable to get local issuer certificate",
    )  # fmt: skip
    error_class, error = await post(wrong_name, trusting)
    assert error_class == "tls" and "certificate verify failed: IP address mismatch" in error, error
    error_class, error = await post(expired, trusting)
    assert error_class == "tls" and "certificate verify failed: certificate has expired" in error, error
    assert await post(untrusted, trusting) == (None, "")  # the same server, its CA now trusted


async def test_a_server_that_wants_a_client_certificate_or_speaks_no_tls_is_a_tls_failure_that_says_so(
    ca: trustme.CA, tmp_path: Path
) -> None:
    """Outside probe: a TLS 1.3 server's certificate_required alert was an empty_reply, a reset in the
    handshake a connect failure with no reason at all, and an https URL on a plain-HTTP server that
    waits for a request "no complete answer within 2 s"."""
    ca_file = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    wants_cert = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(wants_cert)
    wants_cert.verify_mode = ssl.CERT_REQUIRED
    ca.configure_trust(wants_cert)
    listener = socket.create_server(("127.0.0.1", 0))

    def refuse_without_certificate() -> None:  # a blocking server writes its alert before closing
        with listener, contextlib.suppress(OSError):
            accepted, _ = listener.accept()
            with accepted, contextlib.suppress(ssl.SSLError):
                wants_cert.wrap_socket(accepted, server_side=True).recv(1)

    threading.Thread(target=refuse_without_certificate, daemon=True).start()

    async def reset_in_handshake(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(1)  # the ClientHello, then a reset
        writer.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        writer.close()

    async def silent(reader: asyncio.StreamReader, _: asyncio.StreamWriter) -> None:
        await reader.read()  # a plain-HTTP server waiting for a request line

    async def plain(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(1)  # a plain-HTTP server answering the ClientHello as a bad request (nginx)
        writer.write(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
        await writer.drain()
        writer.close()

    servers = [await asyncio.start_server(serve, "127.0.0.1", 0) for serve in (reset_in_handshake, silent, plain)]
    reset_url, silent_url, plain_url = (f"https://127.0.0.1:{s.sockets[0].getsockname()[1]}/hook" for s in servers)
    try:
        wants_cert_url = f"https://127.0.0.1:{listener.getsockname()[1]}/hook"
        error_class, error = await post(wants_cert_url, tls_context(str(ca_file)))
        assert error_class == "tls" and "requires a client certificate" in error, (error_class, error)
        error_class, error = await post(reset_url)
        assert error_class == "tls" and "broke off the TLS handshake" in error, (error_class, error)
        error_class, error = await post(silent_url)
        assert error_class == "timeout" and "TLS handshake" in error, (error_class, error)
        error_class, error = await post(plain_url)
        assert error_class == "tls" and "does not speak TLS on this port" in error, (error_class, error)
        # Python's TLS 1.3 servers check the certificate after the handshake and drop the connection
        wants_13 = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ca.issue_cert("127.0.0.1").configure_cert(wants_13)
        wants_13.verify_mode = ssl.CERT_REQUIRED
        ca.configure_trust(wants_13)
        python_tls = await asyncio.start_server(silent, "127.0.0.1", 0, ssl=wants_13)
        servers.append(python_tls)
        url = f"https://127.0.0.1:{python_tls.sockets[0].getsockname()[1]}/hook"
        error_class, error = await post(url, tls_context(str(ca_file)))
        assert "requires a client certificate" in error, (error_class, error)
    finally:
        for server in servers:
            server.close()


async def test_the_relay_delivers_to_a_private_ca_given_with_ca_file(
    db_url: str, conn: asyncpg.Connection, ferry: pgferry.Ferry, ca: trustme.CA, tls_server: MakeServer,
    tmp_path: Path,
) -> None:  # fmt: skip
    url = await tls_server(ca.issue_cert("127.0.0.1"))
    ca_file = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    relay = RunningRelay(db_url, dataclasses.replace(FAST, ca_file=str(ca_file)))
    try:
        await ferry.subscribe("hook", ["s"], url)
        await ferry.publish("s", {"n": 1})

        async def delivered() -> bool:
            return bool(await conn.fetchval("select count(*) from ferry.attempt_history() where status = 200") == 1)

        await eventually(delivered, what="a delivery over TLS")
    finally:
        await relay.stop()


async def test_run_refuses_a_ca_file_that_holds_no_certificates(
    pgferry_cmd: list[str], db_url: str, tmp_path: Path
) -> None:
    bogus = tmp_path / "ca.pem"
    bogus.write_text("not a certificate\n")
    done = await cli(pgferry_cmd, db_url, "run", "--ca-file", str(bogus), "--exit-after", "1")
    assert done.returncode != 0 and "Traceback" not in done.stderr
    assert f"cannot use {bogus} as a CA file (PEM certificates expected)" in done.stderr, done.stderr
