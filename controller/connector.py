"""How the controller connects to a tenant's database: what the URL may ask for, a deadline that
includes the host name lookup, and a cap on what the server may send for one read.

The URL is the tenant's. It may name at most MAX_HOSTS servers, by TCP host name or address and
port, with the keys of ALLOWED_KEYS: nothing that makes the controller open a file or a socket of
its own container (`passfile`, `service`, `sslkey`, a Unix socket directory as `host`...).
`checked_params` refuses anything else with a one-line reason that never repeats the URL.

Host names are looked up by the controller itself, each database on its own threads (one lookup
per host at a time, joined by later connects), so a resolver that hangs for one database delays
no other; libpq gets the address (`hostaddr`) and never resolves anything. One deadline
(CONNECT_DEADLINE_SECONDS) covers the lookups and every connection attempt.

libpq buffers each message whole before anyone sees it, so a server (or anything answering in its
place) can grow the controller by whatever it sends. Every connection therefore runs through a
relay of the controller's own, which counts the bytes the server sends since the client last
spoke: past its budget for one exchange (the startup, one statement's result, notifications
between two statements; READ_BUDGET_BYTES, plus ROW_BUDGET_BYTES a row for a read of many rows),
the relay hangs up, the read fails, and `ReadTooLarge` says why. The
relay forwards bytes as they are (TLS included: libpq still checks the certificate against the
host name), and holds the server's socket with the TCP keepalives and `tcp_user_timeout` that
tell of a server that vanished.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import random
import socket
import threading
import weakref
from collections.abc import Callable
from typing import Any

import psycopg
from queueworker import dsn as dsn_text
from queueworker.db import connection as db

log = logging.getLogger(__name__)

# One deadline for a whole connect: the host name lookups and every attempt.
CONNECT_DEADLINE_SECONDS = 5.0
MAX_HOSTS = 3
# Addresses tried per connect, over all hosts (a name may resolve to many).
MAX_ADDRESSES = 4
# Lookups under way at once, over all databases: past it a lookup fails at once (never waits).
MAX_LOOKUPS = 128
# What a server may send in one exchange: more than any read of the controller's needs.
READ_BUDGET_BYTES = 1 << 20
# What a read may add per row it may return, past READ_BUDGET_BYTES (a depth row, its queue's name
# included, is well under it): a depth batch of many queues is never cut for its size.
ROW_BUDGET_BYTES = 2048
RELAY_CHUNK_BYTES = 64 * 1024
# What a cancel request's connection may carry (a TLS handshake at most).
CANCEL_BUDGET_BYTES = 64 * 1024
# The relay's socket to the server notices a vanished peer as libpq's own would.
UPSTREAM_KEEPALIVE = {"idle": 10, "interval": 5, "count": 3}
UPSTREAM_USER_TIMEOUT_MS = 15000

# Keys a tenant's URL may set. Keys the controller sets itself (application_name, options,
# connect_timeout, keepalives, tcp_user_timeout) are accepted and overridden.
ALLOWED_KEYS = frozenset({
    "host", "port", "dbname", "user", "password", "sslmode", "sslnegotiation", "sslcompression", "sslsni",
    "ssl_min_protocol_version", "ssl_max_protocol_version", "channel_binding", "require_auth",
    "target_session_attrs", "load_balance_hosts", "application_name", "fallback_application_name",
    "client_encoding", "options", "connect_timeout", "keepalives", "keepalives_idle", "keepalives_interval",
    "keepalives_count", "tcp_user_timeout", "sslrootcert", "gssencmode",
})
# Allowed keys that take only some values: a file name or Kerberos credentials are the controller's.
ALLOWED_VALUES = {"sslrootcert": {"system"}, "gssencmode": {"disable"}}
FILE_KEYS = frozenset({"passfile", "service", "servicefile", "sslkey", "sslcert", "sslrootcert", "sslcrl",
                       "sslcrldir", "sslpassword", "sslcertmode", "requirepeer", "krbsrvname", "gsslib",
                       "gssdelegation", "gssencmode"})


# Keys each attempt sets itself: the relay's address, the server's name (for TLS), no GSS.
RELAYED_KEYS = frozenset({"host", "hostaddr", "port", "load_balance_hosts", "gssencmode"})


class ReadTooLarge(psycopg.OperationalError):
    """The server sent more than its budget for one exchange; the connection was cut."""


def _too_large(budget: int, when: str) -> ReadTooLarge:
    return ReadTooLarge(f"the server sent more than {budget // 1024} KiB {when}: connection closed")


def checked_params(dsn: str) -> dict[str, str]:
    """The URL's parameters, when it asks only for what a tenant may (see the module's docstring);
    InvalidDsn with a one-line reason (never the URL or its password) otherwise."""
    dsn_text.validate(dsn)
    params = dsn_text.parse(dsn)
    for key, value in sorted(params.items()):
        if key not in ALLOWED_KEYS or (key in ALLOWED_VALUES and value not in ALLOWED_VALUES[key]):
            why = "it would make the controller read a file or credentials of its own container" \
                if key in FILE_KEYS else "the controller does not accept it"
            allowed = f" (only {', '.join(sorted(ALLOWED_VALUES[key]))})" if key in ALLOWED_VALUES else ""
            raise dsn_text.InvalidDsn(f"the database URL sets {key}{allowed}: {why}")
    hosts = [host.strip() for host in (params.get("host") or "").split(",")]
    if not all(hosts):
        raise dsn_text.InvalidDsn("the database URL names no host (a TCP host name or address is required)")
    if any(host.startswith(("/", "@")) for host in hosts):
        raise dsn_text.InvalidDsn("the database URL names a Unix socket; the controller connects over TCP only")
    if len(hosts) > MAX_HOSTS:
        raise dsn_text.InvalidDsn(f"the database URL names {len(hosts)} hosts; at most {MAX_HOSTS}")
    ports = [port.strip() for port in (params.get("port") or "").split(",")] if params.get("port") else []
    if ports and len(ports) not in (1, len(hosts)):
        raise dsn_text.InvalidDsn("the database URL has a port count that matches neither 1 nor its hosts")
    if not all(1 <= int(port) <= 65535 for port in ports if port):
        raise dsn_text.InvalidDsn("the database URL has a port outside 1-65535")
    return params


def _servers(params: dict[str, str]) -> list[tuple[str, int]]:
    hosts = [host.strip() for host in params["host"].split(",")]
    ports = [port.strip() for port in params.get("port", "").split(",")]
    ports = ports * len(hosts) if len(ports) == 1 else ports
    return [(host, int(port or 5432)) for host, port in zip(hosts, ports)]


class Connector:
    """One database's way in: its URL's servers, its own lookups, and the relay of each connection."""

    def __init__(self, dsn: str):
        self._dsn = dsn
        self._lookups: dict[tuple[str, int], asyncio.Future[list[tuple[Any, ...]]]] = {}
        self._relays: weakref.WeakKeyDictionary[psycopg.AsyncConnection[Any], _Relay] = weakref.WeakKeyDictionary()

    async def connect(self, application_name: str, settings: str, *, connect_timeout: int,
                      tcp_user_timeout_ms: int) -> psycopg.AsyncConnection[Any]:
        """An autocommit connection (queueworker.db.connection.connect_session) through a relay,
        within CONNECT_DEADLINE_SECONDS from now, lookups included. Raises psycopg.Error (InvalidDsn
        is a ValueError: the URL was refused)."""
        params = checked_params(self._dsn)
        deadline = asyncio.get_running_loop().time() + CONNECT_DEADLINE_SECONDS
        rest = {key: value for key, value in params.items() if key not in RELAYED_KEYS}
        servers = _servers(params)
        if params.get("load_balance_hosts") == "random":
            random.shuffle(servers)
        failures: list[psycopg.Error] = []
        tried = 0
        try:
            async with asyncio.timeout_at(deadline):
                for host, port in servers:
                    try:
                        addresses = await self._addresses(host, port)
                    except psycopg.Error as exc:
                        failures.append(exc)
                        continue
                    for family, address in addresses[:MAX_ADDRESSES - tried]:
                        tried += 1
                        try:
                            return await self._attempt(host, family, address, rest, application_name, settings,
                                                       connect_timeout, tcp_user_timeout_ms)
                        except psycopg.Error as exc:
                            failures.append(exc)
        except TimeoutError:
            raise psycopg.errors.ConnectionTimeout(
                f"connection timeout expired: no connection within {CONNECT_DEADLINE_SECONDS:g}s, "
                f"host name lookups included") from None
        if not failures:
            raise psycopg.OperationalError("no address to connect to")
        raise failures[-1]

    def exceeded(self, conn: psycopg.AsyncConnection[Any]) -> ReadTooLarge | None:
        """The error to report instead of a broken connection's when its relay cut it for sending too much."""
        relay = self._relays.get(conn)
        return _too_large(relay.budget, "for one read") if relay is not None and relay.exceeded else None

    def expect_rows(self, conn: psycopg.AsyncConnection[Any], rows: int) -> None:
        """Sets the budget of `conn`'s next exchange for a read of at most `rows` rows:
        READ_BUDGET_BYTES, plus ROW_BUDGET_BYTES a row."""
        relay = self._relays.get(conn)
        if relay is not None:
            relay.budget = READ_BUDGET_BYTES + rows * ROW_BUDGET_BYTES

    def received(self, conn: psycopg.AsyncConnection[Any]) -> int:
        """Bytes the server sent since the client last spoke on `conn`."""
        relay = self._relays.get(conn)
        return 0 if relay is None else relay.received

    async def _attempt(self, host: str, family: int, address: tuple[Any, ...], rest: dict[str, str],
                       application_name: str, settings: str, connect_timeout: int,
                       tcp_user_timeout_ms: int) -> psycopg.AsyncConnection[Any]:
        relays = [await _Relay.open(host, family, address)]

        def through(relay: _Relay) -> str:
            return psycopg.conninfo.make_conninfo(
                "", **rest, host=host, hostaddr="127.0.0.1", port=str(relay.port), gssencmode="disable")

        async def again() -> str:
            """A fresh relay for the attempt after a server refused the first one's startup options:
            a relay carries one connection."""
            relays[-1].close()
            relays.append(await _Relay.open(host, family, address))
            return through(relays[-1])

        try:
            conn = await db.connect_session(through(relays[0]), application_name, settings,
                                            connect_timeout=connect_timeout, tcp_user_timeout_ms=tcp_user_timeout_ms,
                                            database=self._dsn, again=again)
        except BaseException as exc:
            relays[-1].close()
            if relays[-1].exceeded and isinstance(exc, psycopg.Error):
                raise _too_large(relays[-1].budget, "while connecting") from None
            raise
        self._relays[conn] = relays[-1]
        return conn

    async def _addresses(self, host: str, port: int) -> list[tuple[int, tuple[Any, ...]]]:
        """The host's addresses, looked up on a thread of this database's (one lookup per host at a
        time: a later connect joins the one under way rather than queueing another behind it)."""
        try:
            ip = ipaddress.ip_address(host)
        except ValueError:
            pass
        else:
            return [(socket.AF_INET6 if ip.version == 6 else socket.AF_INET, (host, port))]
        key = (host, port)
        lookup = self._lookups.get(key)
        if lookup is None:
            lookup = self._lookups[key] = _look_up(host, port)
            lookup.add_done_callback(lambda _: self._lookups.pop(key, None))
        try:
            found = await asyncio.shield(lookup)
        except OSError as exc:
            raise psycopg.OperationalError(f"failed to resolve host {host!r}: {exc.strerror or exc}") from None
        return [(family, sockaddr) for family, _, _, _, sockaddr in found]


_lookups_under_way = 0
_lookups_lock = threading.Lock()


def _look_up(host: str, port: int) -> asyncio.Future[list[tuple[Any, ...]]]:
    """getaddrinfo on a thread of its own, as a future of the running loop. Past MAX_LOOKUPS
    lookups under way (resolvers that hang, for many databases), it fails at once."""
    global _lookups_under_way
    loop = asyncio.get_running_loop()
    future: asyncio.Future[list[tuple[Any, ...]]] = loop.create_future()
    future.add_done_callback(lambda done: done.cancelled() or done.exception())  # joined or not, never "unretrieved"
    with _lookups_lock:
        if _lookups_under_way >= MAX_LOOKUPS:
            future.set_exception(OSError(f"{MAX_LOOKUPS} host name lookups are under way; try later"))
            return future
        _lookups_under_way += 1

    def settle(set_outcome: Callable[[Any], None], outcome: Any) -> None:
        if not future.done():
            set_outcome(outcome)

    def resolve() -> None:
        global _lookups_under_way
        try:
            found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP)
        except OSError as exc:
            outcome: tuple[Callable[[Any], None], Any] = (future.set_exception, exc)
        else:
            outcome = (future.set_result, found)
        finally:
            with _lookups_lock:
                _lookups_under_way -= 1
        try:
            loop.call_soon_threadsafe(settle, *outcome)
        except RuntimeError:
            pass  # the loop closed meanwhile: nobody waits

    threading.Thread(target=resolve, name=f"resolve-{host[:40]}", daemon=True).start()
    return future


class _Relay:
    """Forwards one connection between libpq (on a loopback port of its own) and the server,
    counting what the server sends since the client last spoke. Later connections to the same port
    are libpq's cancel requests, passed on to the server as they are."""

    def __init__(self, upstream: socket.socket, listener: socket.socket, family: int, address: tuple[Any, ...]):
        self._upstream, self._listener = upstream, listener
        self._family, self._address = family, address
        self.port = listener.getsockname()[1]
        self.received = 0
        self.budget = READ_BUDGET_BYTES  # of one exchange
        self.exceeded = False
        self._local: socket.socket | None = None
        self._cancels: asyncio.Future[None] | None = None
        self._loop = asyncio.get_running_loop()
        self._task = asyncio.ensure_future(self._run())

    @classmethod
    async def open(cls, host: str, family: int, address: tuple[Any, ...]) -> _Relay:
        loop = asyncio.get_running_loop()
        upstream = socket.socket(family, socket.SOCK_STREAM)
        upstream.setblocking(False)
        _keep_alive(upstream)
        try:
            await loop.sock_connect(upstream, address)
        except OSError as exc:
            upstream.close()
            raise psycopg.OperationalError(f"connection to server at {host!r}, port {address[1]} failed: "
                                           f"{exc.strerror or exc}") from None
        except BaseException:
            upstream.close()
            raise
        listener = socket.create_server(("127.0.0.1", 0), backlog=4)
        listener.setblocking(False)
        return cls(upstream, listener, family, address)

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            self._local, _ = await loop.sock_accept(self._listener)
            self._local.setblocking(False)
            self._cancels = asyncio.ensure_future(self._pass_cancel_requests())
            pumps = [asyncio.ensure_future(self._to_server(self._local)),
                     asyncio.ensure_future(self._to_client(self._local))]
            try:
                await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for pump in pumps:
                    pump.cancel()
        except OSError:
            pass
        finally:
            self.close()

    async def _to_server(self, local: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        while data := await loop.sock_recv(local, RELAY_CHUNK_BYTES):
            self.received = 0  # the client spoke: a new exchange begins
            await loop.sock_sendall(self._upstream, data)

    async def _to_client(self, local: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        while data := await loop.sock_recv(self._upstream, RELAY_CHUNK_BYTES):
            self.received += len(data)
            if self.received > self.budget:
                self.exceeded = True
                return
            await loop.sock_sendall(local, data)

    async def _pass_cancel_requests(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            local, _ = await loop.sock_accept(self._listener)
            asyncio.ensure_future(self._pass_cancel_request(local))

    async def _pass_cancel_request(self, local: socket.socket) -> None:
        """A cancel request: a connection of its own (perhaps a TLS handshake, then a few bytes),
        which the server closes. Passed on both ways for at most CONNECT_DEADLINE_SECONDS and
        CANCEL_BUDGET_BYTES."""
        loop = asyncio.get_running_loop()
        upstream = socket.socket(self._family, socket.SOCK_STREAM)
        upstream.setblocking(False)
        local.setblocking(False)

        async def forward(source: socket.socket, sink: socket.socket) -> None:
            passed = 0
            while (data := await loop.sock_recv(source, RELAY_CHUNK_BYTES)) and passed < CANCEL_BUDGET_BYTES:
                passed += len(data)
                await loop.sock_sendall(sink, data)

        try:
            async with asyncio.timeout(CONNECT_DEADLINE_SECONDS):
                await loop.sock_connect(upstream, self._address)
                directions = [asyncio.ensure_future(forward(local, upstream)),
                              asyncio.ensure_future(forward(upstream, local))]
                try:
                    await asyncio.wait(directions, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    for direction in directions:
                        direction.cancel()
        except (OSError, TimeoutError):
            pass
        finally:
            _discard(loop, local)
            _discard(loop, upstream)

    def close(self) -> None:
        if self._cancels is not None:
            self._cancels.cancel()
        for sock in (self._local, self._upstream, self._listener):
            if sock is not None:
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                _discard(self._loop, sock)
        if not self._task.done() and self._task is not asyncio.current_task():
            self._task.cancel()


def _discard(loop: asyncio.AbstractEventLoop, sock: socket.socket) -> None:
    """Closes a socket that a pump may still be waiting on. Its registration with the loop goes
    first: the kernel forgets a closed descriptor, the loop's selector does not, and the next
    socket given the same number would inherit the stale entry (its first wait then fails with
    \"No such file or directory\", epoll's word for a descriptor it does not know). Removing the
    reader cancels the pump's handle, so the pump's own clean-up, when its cancellation arrives,
    leaves the new socket's registration alone."""
    fd = sock.fileno()
    if fd >= 0 and not loop.is_closed():
        loop.remove_reader(fd)
        loop.remove_writer(fd)
    sock.close()


def _keep_alive(sock: socket.socket) -> None:
    """The server's socket notices a vanished peer as libpq's would (queueworker.db.connection.KEEPALIVES)."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for option, value in ((getattr(socket, "TCP_KEEPIDLE", None), UPSTREAM_KEEPALIVE["idle"]),
                          (getattr(socket, "TCP_KEEPINTVL", None), UPSTREAM_KEEPALIVE["interval"]),
                          (getattr(socket, "TCP_KEEPCNT", None), UPSTREAM_KEEPALIVE["count"]),
                          (getattr(socket, "TCP_USER_TIMEOUT", None), UPSTREAM_USER_TIMEOUT_MS)):
        if option is not None:
            sock.setsockopt(socket.IPPROTO_TCP, option, value)
