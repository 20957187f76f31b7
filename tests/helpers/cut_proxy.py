"""A TCP forwarder in front of a server that can become unreachable mid-conversation: a store
that goes away in the middle of a save, as a network partition makes it, then comes back.

Plain TCP on 127.0.0.1, a thread per direction. `cut_at(b"...")`: once a client sends bytes
holding that marker (an HTTP request line, in the clear over http), that request is not
forwarded, every connection is closed and new ones are refused (closed at once) until `mend()`."""
from __future__ import annotations

import socket
import threading
from typing import Optional


class CutProxy:
    def __init__(self, upstream_port: int):
        self.upstream = ("127.0.0.1", upstream_port)
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.marker: Optional[bytes] = None
        self.cut = threading.Event()
        self.cut_seen = threading.Event()  # the marker came and the store went away
        self._open: set[socket.socket] = set()
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def cut_at(self, marker: bytes) -> None:
        self.marker = marker

    def mend(self) -> None:
        self.marker = None
        self.cut.clear()

    def close(self) -> None:
        self.server.close()
        self._drop_all()

    def _drop_all(self) -> None:
        with self._lock:
            for s in list(self._open):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                s.close()
            self._open.clear()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            if self.cut.is_set():
                client.close()
                continue
            try:
                up = socket.create_connection(self.upstream, timeout=10)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._open.update((client, up))
            threading.Thread(target=self._pump, args=(client, up, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(up, client, False), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, from_client: bool) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                if from_client and self.marker is not None and self.marker in data:
                    self.cut.set()
                    self.cut_seen.set()
                    self._drop_all()
                    return
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
