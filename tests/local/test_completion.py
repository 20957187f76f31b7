"""grpojob run's questions to the trainer leader never end the run with a traceback: a /status
answer cut off mid-body (the leader stopping as Ctrl-C reaches it too) reads as "no answer"."""
from __future__ import annotations

import socket
import threading

from grpojob.local.completion import TrainerCompletion


def cut_off_server() -> tuple[int, threading.Thread]:
    """An HTTP server that announces 724 bytes of body, sends none and closes (IncompleteRead)."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(4)

    def serve() -> None:
        for _ in range(2):
            conn, _ = srv.accept()
            conn.recv(65536)
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 724\r\n\r\n")
            conn.close()
        srv.close()

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    return srv.getsockname()[1], t


def test_an_answer_cut_off_mid_body_is_no_answer(tmp_path):
    (tmp_path / "token").write_text("t" * 32)
    port, server = cut_off_server()
    done = TrainerCompletion(f"http://127.0.0.1:{port}", tmp_path / "token", timeout=5)
    assert done.phase() is None
    assert done.release() is True  # POST /suspend was taken (its answer is not read)
    server.join(5)
