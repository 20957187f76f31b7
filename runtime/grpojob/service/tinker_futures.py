"""The futures of Tinker's wire (service.tinker_api): every call but a few answers at once with a
request id, and the client fetches the result with /api/v1/retrieve_future, which waits up to
WAIT_SECONDS here and then says "try_again" (the SDK asks again at once).

A result is converted once (a converter may record what it returned, e.g. a sampler's id). The
last RETRIEVED fetched ones are kept, so a client that lost an answer can fetch it again; a result
never fetched (its client gone) goes once more than KEEP are held and it is the oldest finished."""
from __future__ import annotations

import concurrent.futures
import itertools
import json
import threading
from collections import OrderedDict
from typing import Any, Callable, Optional

from grpojob.service.wire import Refused

WAIT_SECONDS = 20.0  # under the SDK's 45 s timeout on retrieve_future
KEEP = 4096
RETRIEVED = 64
JSON, PROTO = "application/json", "application/x-protobuf"

# converter: the call's raw result -> (content type, body)
Converter = Callable[[Any], tuple[str, bytes]]


def as_json(doc: Any) -> tuple[str, bytes]:
    return JSON, json.dumps(doc).encode()


class _Entry:
    def __init__(self, future: "concurrent.futures.Future[Any]", convert: Converter):
        self.future, self.convert = future, convert
        self.lock = threading.Lock()
        self.answer: Optional[tuple[str, bytes]] = None

    def resolve(self) -> tuple[str, bytes]:
        with self.lock:
            if self.answer is None:
                self.answer = self._resolve()
            return self.answer

    def _resolve(self) -> tuple[str, bytes]:
        try:
            return self.convert(self.future.result())
        except Refused as e:  # the call's own fault (4xx) or the trainer's (5xx): the client raises it
            return as_json({"error": str(e), "category": "user" if e.status < 500 else "server"})
        except Exception as e:  # noqa: BLE001 - a failed call's answer, never the server's end
            return as_json({"error": f"{type(e).__name__}: {e}", "category": "server"})


class Futures:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._entries: "OrderedDict[str, _Entry]" = OrderedDict()
        self._retrieved: "OrderedDict[str, _Entry]" = OrderedDict()

    def add(self, future: "concurrent.futures.Future[Any]", convert: Converter) -> str:
        with self._lock:
            rid = f"req-{next(self._ids)}"
            self._entries[rid] = _Entry(future, convert)
            while len(self._entries) > KEEP:
                oldest = next(iter(self._entries))
                if not self._entries[oldest].future.done():
                    break
                del self._entries[oldest]
        return rid

    def done(self, value: Any, convert: Converter) -> str:
        """A call answered already (create_model): its id."""
        f: "concurrent.futures.Future[Any]" = concurrent.futures.Future()
        f.set_result(value)
        return self.add(f, convert)

    def retrieve(self, rid: str, wait: float = WAIT_SECONDS) -> tuple[str, bytes]:
        with self._lock:
            entry = self._entries.get(rid) or self._retrieved.get(rid)
        if entry is None:
            raise Refused(404, f"request_id {rid}: no such request (or it is long gone)", "not-found")
        try:
            entry.future.exception(timeout=wait)  # waits; never raises the call's own error
        except concurrent.futures.TimeoutError:
            return as_json({"type": "try_again", "request_id": rid, "queue_state": "active"})
        answer = entry.resolve()
        with self._lock:
            if self._entries.pop(rid, None) is not None:
                self._retrieved[rid] = entry
                while len(self._retrieved) > RETRIEVED:
                    self._retrieved.popitem(last=False)
        return answer
