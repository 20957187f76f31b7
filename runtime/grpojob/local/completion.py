"""A local run's trainer leader, asked over HTTP: its /status phase (has it finished? has it
checkpointed after Ctrl-C?), and to stop once finished.

A finished trainer does not exit on its own (in a pod its StatefulSet would restart it: see
grpojob.trainer.main); `grpojob run` reads /status and then asks it to stop with POST /suspend
(every rank exits 0, torchrun too), where the operator scales the pods down (SIGTERM).
"""
from __future__ import annotations

import http.client
import json
import urllib.request
from pathlib import Path
from typing import Optional

from grpojob.auth import Auth, read_file


class TrainerCompletion:
    """Asks trainer-0 (with the run's token, read when asking: the file is made after the run is
    planned) for its phase, and to stop once completed."""

    def __init__(self, url: str, token_file: Path, timeout: float = 2.0):
        self.url, self.token_file, self.timeout = url.rstrip("/"), token_file, timeout

    def _headers(self) -> dict[str, str]:
        return Auth(read_file(self.token_file)).headers()

    def phase(self, timeout: Optional[float] = None) -> Optional[str]:
        """The leader's /status phase; None when it does not answer (not up yet, restarting, gone,
        or cut off mid-answer: http.client's IncompleteRead is no OSError)."""
        req = urllib.request.Request(f"{self.url}/status", headers=self._headers())
        try:
            with urllib.request.urlopen(req, timeout=timeout or self.timeout) as r:
                return json.loads(r.read()).get("phase")
        except (OSError, ValueError, http.client.HTTPException):
            return None

    def completed(self) -> bool:
        return self.phase() == "completed"

    def release(self) -> bool:
        """Ask a completed trainer to stop (POST /suspend: it has nothing left to save); False when
        it did not take the request."""
        req = urllib.request.Request(f"{self.url}/suspend", method="POST", data=b"", headers=self._headers())
        try:
            urllib.request.urlopen(req, timeout=self.timeout).close()
            return True
        except (OSError, http.client.HTTPException):
            return False
