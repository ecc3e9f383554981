"""Database servers that hang, for the controller's isolation tests.

`SilentServer` accepts TCP connections and never says a word (a black-holed or wedged server: the
client waits in its connect). `StalledPostgres` completes the Postgres startup (no TLS, trust
auth), so the client holds a working connection, then never answers a query (a server stuck on a
lock, a dead backend behind a proxy). `FloodingPostgres` answers every query with one huge row.
All run on a thread of their own and keep every socket open until `close()`.
"""

from __future__ import annotations

import socket
import struct
import threading

SSL_REQUEST = 80877103
GSSENC_REQUEST = 80877104


class SilentServer:
    def __init__(self) -> None:
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._clients: list[socket.socket] = []
        self.hung_up = 0  # connections the client shut down or closed
        self._closed = threading.Event()
        threading.Thread(target=self._accept, name=f"{type(self).__name__}-{self.port}", daemon=True).start()

    def dsn(self, user: str = "app", password: str = "pw", dbname: str = "app") -> str:
        return f"postgresql://{user}:{password}@127.0.0.1:{self.port}/{dbname}?sslmode=disable"

    @property
    def connections(self) -> int:
        return len(self._clients)

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            self._clients.append(client)
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        """Says nothing."""

    def close(self) -> None:
        self._closed.set()
        self._listener.close()
        for client in self._clients:
            client.close()


class StalledPostgres(SilentServer):
    def _serve(self, client: socket.socket) -> None:
        try:
            while True:
                length, code = struct.unpack("!ii", _read(client, 8))
                _read(client, length - 8)  # the rest of the packet (user, database): anything goes
                if code not in (SSL_REQUEST, GSSENC_REQUEST):
                    break
                client.sendall(b"N")  # no TLS, no GSS: go on in the clear
            client.sendall(_message(b"R", struct.pack("!i", 0)))  # AuthenticationOk
            for name, value in (("server_version", "17.0"), ("client_encoding", "UTF8"),
                                ("server_encoding", "UTF8"), ("DateStyle", "ISO, MDY"),
                                ("integer_datetimes", "on"), ("standard_conforming_strings", "on")):
                client.sendall(_message(b"S", f"{name}\0{value}\0".encode()))
            client.sendall(_message(b"K", struct.pack("!ii", 4242, 1234)))  # BackendKeyData
            client.sendall(_message(b"Z", b"I"))  # ReadyForQuery
            self._after_startup(client)
        except OSError:
            pass
        if not self._closed.is_set():
            self.hung_up += 1

    def _after_startup(self, client: socket.socket) -> None:
        """Silence."""
        while client.recv(65536):
            pass


class FloodingPostgres(StalledPostgres):
    """Answers every query (psycopg's extended protocol: up to its Sync) with one row whose first
    column holds `row_bytes` bytes, sent in pieces so the server itself holds none of it: what a
    hostile server, or a table holding huge values, could send a client that reads a row."""

    def __init__(self, row_bytes: int) -> None:
        self.row_bytes = row_bytes
        self.sent = 0  # bytes of huge rows sent, over all connections
        super().__init__()

    def _after_startup(self, client: socket.socket) -> None:
        while True:
            kind, length = struct.unpack("!ci", _read(client, 5))
            _read(client, length - 4)
            if kind == b"X":  # Terminate
                return
            if kind != b"S":  # Parse, Bind, Describe, Execute: answered at the Sync
                continue
            columns = [(b"pod_name", 25), (b"running", 23), (b"draining", 16), (b"oldest_lease_age", 701)]
            description = struct.pack("!h", len(columns)) + b"".join(
                name + b"\0" + struct.pack("!ihihih", 0, 0, oid, -1, -1, 0) for name, oid in columns)
            client.sendall(_message(b"1", b"") + _message(b"2", b"") + _message(b"T", description))
            rest = [b"0", b"f", b"0"]
            payload_length = 2 + 4 + self.row_bytes + sum(4 + len(value) for value in rest)
            client.sendall(b"D" + struct.pack("!ih", payload_length + 4, 4) + struct.pack("!i", self.row_bytes))
            piece = b"x" * 65536
            left = self.row_bytes
            while left:
                chunk = piece[:min(left, len(piece))]
                client.sendall(chunk)
                self.sent += len(chunk)
                left -= len(chunk)
            client.sendall(b"".join(struct.pack("!i", len(value)) + value for value in rest))
            client.sendall(_message(b"C", b"SELECT 1\0") + _message(b"Z", b"I"))


def _message(kind: bytes, payload: bytes) -> bytes:
    return kind + struct.pack("!i", len(payload) + 4) + payload


def _read(client: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = client.recv(size - len(data))
        if not chunk:
            raise OSError("client went away")
        data += chunk
    return data
