"""Delivery: bringing rollout servers to the retained version (trainer rank 0).

plan -> pack -> send -> acknowledge:
- plan: the targets' endpoints grouped by their route (chosen at registration, `membership`). A
  collective path (nccl, gloo) gets a process group: the publisher is rank 0, that path's
  endpoints follow, and the group is kept for the next push to the same endpoints. A handoff
  path (cuda-ipc, shm) gets the handles of the publisher's buffers.
- pack: the weights arrive as a stream (`stream.TensorStream`: a trainer gathers each tensor from
  its shards only when it is packed) and go into flat dtype-grouped buckets (`buckets`) in the
  media the paths read: GPU buffers on the trainer's device (nccl, cuda-ipc), host buffers (gloo),
  one /dev/shm segment (shm). Only media in use are allocated. Packing runs in the caller's thread
  (a trainer's gathers are collective) and each bucket goes on the wire of the collective paths as
  soon as it is packed; a handoff reads whole buffers, so with a handoff path every bucket is
  packed before the command is published.
- send: one command names every target with the route of each endpoint; the collectives run
  while the handoff receivers copy.
- acknowledge: every server acknowledges once it loaded the version. A server that dies, hangs
  or fails to receive is named, the command is cancelled, and the survivors are retried.

With weightSync.delta (`delta`), the servers whose receivers got the previous version from this
delivery get a delta against it instead: every bucket is packed and compared with the base first
(so a collective path sends once the sizes are known), then the changed positions and values of
each bucket that changed little go, the rest whole; the other targets get the version whole.

Backend checkpoint writes each version as files (`filepush`): whole, or with delta pushes a
delta directory for the servers whose engines hold the previous version and can apply one.

The buckets stay after the push: a server that registers later is brought to the same version
from them (filling another medium from a filled one when its path needs it). Cost: one copy of the
weights per medium in use (GPU memory for nccl/cuda-ipc, host memory for gloo, /dev/shm for shm).
"""
from __future__ import annotations

import itertools
import logging
from typing import Callable, Optional

import torch
from torch.distributed import DistError, TCPStore

from grpojob.api.spec import WeightSyncSpec
from grpojob.sync import buckets as bk
from grpojob.sync import delta as dl
from grpojob.sync import filepush
from grpojob.sync import group as grp
from grpojob.sync import handoff
from grpojob.sync import inband
from grpojob.sync.membership import Member, Membership
from grpojob.sync.placement import COLLECTIVES, SHM_DIR
from grpojob.sync.credentials import Credentials
from grpojob.sync.protocol import Deadline, WeightSyncError, short_error
from grpojob.sync.retained import Base, Outcome, Retained, home  # noqa: F401 - also imported from here
from grpojob.sync.stream import TensorStream
from grpojob.sync.waits import Waits

log = logging.getLogger("grpojob.sync")

MAX_ATTEMPTS = 3
MEDIUM = {"nccl": "device", "cuda-ipc": "device", "gloo": "host", "shm": "shm"}
HANDOFF = ("cuda-ipc", "shm")


class Delivery:
    def __init__(self, store: TCPStore, creds: Credentials, device: torch.device, sync: WeightSyncSpec,
                 members: Membership, checkpoint_dir: Optional[str]):
        self.store, self.creds, self.device, self.members = store, creds, device, members
        self.waits = Waits(store, creds, members)
        self.run = creds.run
        self.timeout = float(sync.timeout_seconds)
        self.bucket_bytes = int(sync.bucket_size_mb * 2**20)
        self.checkpoint_dir = checkpoint_dir if sync.backend == "checkpoint" else None
        self.delta = sync.delta
        self.last_delta: Optional[dict] = None  # the last push's delta figures (publisher stats)
        # instance -> weights its receivers got whole from this delivery: a delta goes only where
        # a push of ours put the base (not a registration's word: a re-registered server has new buffers)
        self._holds: dict[str, str] = {}
        self._probe = False
        self._rested = 0  # backend checkpoint: versions written from the stream since the last delta try
        self._plan: tuple = (None, None)  # (state-dict signature, its layout)
        self.retained: Optional[Retained] = None
        self._groups: dict[str, tuple[str, tuple, object]] = {}  # path -> (id, endpoints, group)
        self._ids = itertools.count(1)

    # ---- the retained version -------------------------------------------------------------------
    def retain(self, stream: TensorStream, version: int, wid: str) -> Retained:
        """Make `version` the retained one (its buffers are filled on delivery or by `keep`;
        backend checkpoint: written to files here, which takes the whole stream)."""
        signature = tuple((n, tuple(shape), dtype) for n, shape, dtype in stream.specs)
        if self._plan[0] != signature:  # planning 291 tensors costs ms: once per state-dict signature
            self._plan = (signature, bk.plan(stream.specs, self.bucket_bytes))
        layout = self._plan[1]
        r = self.retained
        base = None  # what the media hold whole before this version is packed (LoRA pushes stay dense)
        if self.delta and r is not None and r.layout == layout and r.filled and r.adapter is None is stream.adapter:
            base = Base(r.weights, frozenset(r.filled))
        if r is None or r.layout != layout:
            if r is not None:
                r.close()
            r = self.retained = Retained(layout)
        r.version, r.weights, r.filled, r.adapter, r.base = version, wid, set(), stream.adapter, base
        r.path = None
        # The buffers of every medium stay while the layout does: a cuda-ipc receiver maps them
        # once (handoff.CudaReader) and copies out of them at each push.
        return r

    def keep(self, stream: TensorStream) -> None:
        """Keep the retained version for servers that come later (the trainer's device keeps it;
        backend checkpoint: written whole)."""
        if self.checkpoint_dir:
            filepush.whole(self.checkpoint_dir, self.retained, stream)
        elif not stream.exhausted:
            self._packer([home(self.device)], stream).finish()

    def close(self) -> None:
        self._groups.clear()
        if self.retained:
            self.retained.close()
        self.store = self.waits.store = None  # the publisher's store shuts down with its last reference

    # ---- commands ---------------------------------------------------------------------------------
    def push(self, targets: list[Member], stream: Optional[TensorStream], *, main: bool) -> Outcome:
        """Bring `targets` to the retained version. `stream`: the weights being pushed (None for
        a catch-up from the retained buffers); `main`: keep its groups for the next push. The
        stream is exhausted when this returns (every bucket packed, whatever the targets did)."""
        r = self.retained
        assert r is not None
        on_disk = self.checkpoint_dir is not None
        packer, self.last_delta = None, None
        # backend checkpoint: a delta only to engines that declared they apply one from files
        based = [m for m in targets if r.base and self._holds.get(m.instance) == r.base.weights == m.weights
                 and (m.reg.delta_files or not on_disk)]
        pack = stream is not None and not stream.exhausted
        if on_disk:
            pack = pack and filepush.packs(self.delta, r, targets) and not self._resting()
        probe = self._probe  # the last delta push found no bucket worth it: send whole, streamed
        if pack:
            media = [home(self.device)] if on_disk else sorted({MEDIUM[p] for m in targets for p in m.routes})
            packer = self._delta_packer(media, stream, probe) if based else self._packer(media, stream)
            if on_disk:
                packer.finish()  # the files are written from the packed buckets
        if based and packer is not None and not probe:  # a delta to the servers holding the base, the rest whole
            tries: list[int] = []

            def send(seq, ts):  # a retry goes dense: a survivor may already hold what the failed one sent
                tries.append(seq)
                return self._command(seq, ts, stream, packer, main, delta=len(tries) == 1)
            out = self._attempts(based, r, send)
            rest = [m for m in targets if m not in based]
            more = self._attempts(rest, r, lambda seq, ts: self._command(seq, ts, stream, None, False)) if rest else None
            if more:
                out = Outcome(out.ok + more.ok, out.dropped + more.dropped,
                              max((p for p in (out.paused_seconds, more.paused_seconds) if p is not None), default=None))
        else:
            out = self._attempts(targets, r, lambda seq, ts: self._command(seq, ts, stream, packer, main))
        if packer is not None:
            packer.finish()  # every target dropped before packing began: still keep it for later servers
        elif on_disk and stream is not None and not stream.exhausted:
            filepush.whole(self.checkpoint_dir, r, stream)
        if isinstance(packer, dl.DeltaPacker):
            self._probe, r.last_counts = not packer.worth_it, packer.counts
        if main:
            self._holds = {m.instance: w for m in targets if (w := self._holds.get(m.instance))}
        self._holds.update((m.instance, r.weights) for m in out.ok)
        return out

    def _resting(self) -> bool:
        """Backend checkpoint, after a push found no bucket worth a delta: write the next versions
        from the stream, and keep every `filepush.REST + 1`-th (the one after it tries a delta)."""
        if not self._probe:
            return False
        self._rested += 1
        if self._rested <= filepush.REST:
            return True
        self._rested, self._probe = 0, False
        return False

    def load(self, targets: list[Member], version: int, wid: str, path: Optional[str]) -> Outcome:
        """Have `targets` load `path` (relative to the checkpoint dir; None: the model directory)."""
        r = Retained(bk.Layout(()), version, wid, path)
        for m in targets:  # loaded from files: what its receivers kept is no base any more
            self._holds.pop(m.instance, None)
        return self._attempts(targets, r, lambda seq, ts: self._load_cmd(seq, ts, version, wid, path))

    def _attempts(self, targets: list[Member], r: Retained, send: Callable) -> Outcome:
        """Run a command on `targets`, retrying on the survivors when one dies or fails to receive."""
        dropped: list[Member] = []
        for attempt in range(1, MAX_ATTEMPTS + 1):
            seq = self.store.add(self.creds.key("cmd", "n"), 1)
            try:
                acks = send(seq, targets)
            except WeightSyncError as e:
                self.store.set(self.creds.key("cancel", seq), str(e))
                alive, lost = self.waits.triage(seq, targets, e)
                for m, why in lost:
                    log.error("weights version %d: %s %s; removing it from the group", r.version, m, why)
                    self.members.drop(m, why)
                    dropped.append(m)
                targets = alive
                if not targets:
                    return Outcome([], dropped)
                if attempt < MAX_ATTEMPTS:
                    log.warning("retrying version %d on %d server(s)", r.version, len(targets))
                continue
            except BaseException as e:  # a setup error or an interrupt: the servers must not wait for it
                k = self.creds.key("cmd", seq)
                if self.store.check([k]):
                    self.store.set(self.creds.key("cancel", seq), f"the trainer stopped the push: {type(e).__name__}")
                else:  # a no-op keeps the servers' command sequence going
                    self.creds.set_json(self.store, k, {"seq": seq, "kind": "noop", "targets": []})
                raise
            ok, paused = [], []
            for m in targets:
                a = acks[m.instance]
                if a.get("ok"):
                    m.weights, m.version = r.weights, r.version
                    ok.append(m)
                    if a.get("paused_seconds") is not None:
                        paused.append(float(a["paused_seconds"]))
                else:
                    log.error("%s failed to load version %d: %s", m, r.version, a.get("error"))
                    self.members.drop(m, f"failed to load version {r.version}: {a.get('error')}")
                    dropped.append(m)
            return Outcome(ok, dropped, max(paused) if paused else None)
        for m in targets:
            self.members.drop(m, f"could not be brought to version {r.version} in {MAX_ATTEMPTS} attempts")
            dropped.append(m)
        return Outcome([], dropped)

    def _command(self, seq: int, targets: list[Member], stream: Optional[TensorStream], packer: Optional[bk.Packer],
                 main: bool, delta: bool = False) -> dict:
        """A push, or with backend checkpoint a load of the version's files; returns the acknowledgements."""
        if self.checkpoint_dir:
            return self._file_cmd(seq, targets, stream, packer if delta else None)
        return self._push_cmd(seq, targets, packer, main, delta)

    def _push_cmd(self, seq: int, targets: list[Member], packer: Optional[bk.Packer], main: bool,
                  delta: bool = False) -> dict:
        """`delta`: send `packer`'s deltas (a DeltaPacker; the targets hold its base)."""
        r = self.retained
        by_path: dict[str, list[tuple[Member, int]]] = {}
        for m in targets:
            for i, p in enumerate(m.routes):
                by_path.setdefault(p, []).append((m, i))
        if packer is not None and any(p in HANDOFF for p in by_path):
            packer.finish()  # handoffs read whole buffers (and a delta's counts, in the command)
        # A collective path's delta goes out before the trainer compared anything: its sizes
        # follow in band (`inband`), so the servers get ready while it compares.
        counts = packer.counts if delta and packer.done else None
        for p in by_path:  # a medium this version is not (being) packed into: copied from a filled one
            if MEDIUM[p] not in r.filled and (packer is None or MEDIUM[p] not in packer.media):
                self._copy_into(MEDIUM[p])
        cmd = {"seq": seq, "kind": "push", "version": r.version, "weights": r.weights,
               "layout": r.publish_layout(self.creds, self.store), "adapter": r.adapter, "timeout": self.timeout,
               "targets": [m.instance for m in targets], "routes": {m.instance: list(m.routes) for m in targets},
               "groups": {}, "handoff": {}}
        inline = inband.inline_sizes(r.layout, r.last_counts) if delta and by_path.keys() & COLLECTIVES else None
        if self.delta:  # receivers keep their buffers as the base of the next delta
            cmd["delta"] = {"base": r.base.weights if delta else None, "counts": counts, "inline": inline}
        if "shm" in by_path:
            cmd["handoff"]["shm"] = r.shm.doc()
            if delta:
                cmd["handoff"]["shm-delta"] = r.arena_shm.doc()
        if "cuda-ipc" in by_path:  # one share per receiver: each releases its own reference
            for name, shares, bufs in (("cuda-ipc", r.ipc, r.media), ("cuda-ipc-delta", r.arena_ipc, r.arena)):
                if name == "cuda-ipc-delta" and not delta:
                    continue
                ipc: dict[str, list] = {m.instance: [None] * len(m.routes) for m, _ in by_path["cuda-ipc"]}
                for m, i in by_path["cuda-ipc"]:
                    if (m.instance, i) not in shares:
                        shares[(m.instance, i)] = handoff.share_cuda(bufs["device"])
                    ipc[m.instance][i] = shares[(m.instance, i)]
                cmd["handoff"][name] = ipc
        plans = {}
        for p in COLLECTIVES:
            if p not in by_path:
                continue
            eps = tuple((m.instance, i) for m, i in by_path[p])
            kept = self._groups.get(p) if main else None
            reuse = kept is not None and kept[1] == eps
            gid = kept[0] if reuse else f"{self.run}-{next(self._ids)}"
            ranks: dict[str, list] = {m.instance: [None] * len(m.routes) for m, _ in by_path[p]}
            for rank, (m, i) in enumerate(by_path[p], start=1):
                ranks[m.instance][i] = rank
            cmd["groups"][p] = {"id": gid, "world": len(eps) + 1, "ranks": ranks}
            plans[p] = (gid, eps, kept[2] if reuse else None)
        self.creds.set_json(self.store, self.creds.key("cmd", seq), cmd)

        deadline = Deadline(self.timeout)
        what = f"weight push of version {r.version} to {len(targets)} server(s)"
        used = []
        try:
            transfers = []
            for p, (gid, eps, pg) in plans.items():
                poll = self.waits.liveness(targets, nack=self.creds.key("nack", seq, p))
                if pg is None:
                    pg = self._form(p, cmd["groups"][p], targets, poll, deadline, what)
                used.append((p, pg))
                if main:
                    self._groups[p] = (gid, eps, pg)
                gate = packer.ready if packer is not None and not packer.done else None
                bufs = self._buffers(MEDIUM[p])
                if delta:
                    msgs = inband.sent(r.layout, packer.counts, bufs, r.arena[MEDIUM[p]], packer.ready, inline)
                    gate = None
                transfers.append((p, poll, grp.Transfer(pg, msgs if delta else bufs, ready=gate)))
            if packer is not None:
                packer.finish()  # each bucket goes on the wire as soon as it is packed (or compared)
            if self.delta and self.last_delta is None:  # the push's own figures, not a catch-up's after it
                self.last_delta = dl.figures(r.layout, packer.counts if delta else None, inline)
            for p, poll, t in transfers:
                t.wait(poll, deadline, f"{what} over {p}")
            return self.waits.acks(seq, targets, self.waits.liveness(targets), deadline, what)
        except WeightSyncError:
            for p, pg in used:
                grp.abandon(pg, self.timeout)
                self._groups.pop(p, None)
            if packer is not None:
                packer.finish()  # the retry (and late servers) read the retained buffers
            raise
        except BaseException as e:
            if packer is not None:
                packer.abort(e)  # a transfer waiting for a bucket gives up
            raise

    def _form(self, path: str, g: dict, targets: list[Member], poll, deadline: Deadline, what: str):
        """Wait until every rank announced itself, then build the group (rank 0)."""
        by_instance = {m.instance: m for m in targets}
        owner = {self.creds.key("join", g["id"], rank): by_instance[inst]
                 for inst, ranks in g["ranks"].items() for rank in ranks if rank is not None}
        what = f"{what}: forming the {path} group {g['id']}"
        self.waits.keys(list(owner), poll, deadline, what, lambda k: owner[k])
        self.store.set(self.creds.key("join", g["id"], 0), "1")
        try:
            return grp.new_group(self.store, self.creds.space, g["id"], 0, g["world"], path, deadline.left)
        except DistError as e:
            raise WeightSyncError(f"{what}: {short_error(e)}") from e

    def _file_cmd(self, seq: int, targets: list[Member], stream: Optional[TensorStream],
                  packer: Optional[dl.DeltaPacker]) -> dict:
        """Backend checkpoint: `targets` load the retained version from files; with `packer`, its
        delta against the base they hold, and whoever turns out to hold another (`wrong_base`) the
        whole version at once."""
        r, root = self.retained, self.checkpoint_dir
        if packer is None or all(n is None for n in packer.counts):  # nothing worth a delta: whole, for all
            path = filepush.whole(root, r, stream)
            if self.delta and self.last_delta is None:
                self.last_delta = dl.figures(r.layout, None)
            return self._load_cmd(seq, targets, r.version, r.weights, path)
        path, _ = filepush.delta(root, r, packer)
        self.last_delta = dl.figures(r.layout, packer.counts)
        acks = self._load_cmd(seq, targets, r.version, r.weights, path, base=r.base.weights)
        redo = [m for m in targets if acks[m.instance].get("wrong_base")]
        if redo:
            again = self.store.add(self.creds.key("cmd", "n"), 1)
            acks.update(self._load_cmd(again, redo, r.version, r.weights, filepush.whole(root, r, stream)))
        return acks

    def _load_cmd(self, seq: int, targets: list[Member], version: int, wid: str, path: Optional[str],
                  base: Optional[str] = None) -> dict:
        """`base`: `path` is a delta version against the weights id `base` (`files.save_delta`)."""
        self.creds.set_json(self.store, self.creds.key("cmd", seq), {
            "seq": seq, "kind": "load", "version": version, "weights": wid, "path": path,
            "targets": [m.instance for m in targets], **({"base": base} if base else {})})
        what = f"loading weights version {version} ({path or 'the model directory'})"
        return self.waits.acks(seq, targets, self.waits.liveness(targets), Deadline(self.timeout), what)

    # ---- media ------------------------------------------------------------------------------------
    def _buffers(self, medium: str, arena: bool = False) -> list[torch.Tensor]:
        name = f"grpojob-{self.run}-{{}}.{'delta' if arena else 'weights'}"
        return self.retained.buffers(medium, self.device, lambda: SHM_DIR / name.format(next(self._ids)), arena)

    def _packer(self, media: list[str], stream: TensorStream) -> bk.Packer:
        """Packs `stream` into `media`, which count as filled once every bucket is packed."""
        r = self.retained
        return bk.Packer(r.layout, stream, {m: self._buffers(m) for m in media}, on_done=lambda: r.filled.update(media))

    def _delta_packer(self, media: list[str], stream: TensorStream, probe: bool) -> dl.DeltaPacker:
        """Packs `stream` as deltas against a medium holding the base (kept up to date with the rest)."""
        r = self.retained
        base = next((m for m in media if m in r.base.media), min(r.base.media))
        packed = sorted(set(media) | {base})
        return dl.DeltaPacker(r.layout, stream, {m: self._buffers(m) for m in packed}, base=base,
                              based=set(r.base.media), arenas={m: self._buffers(m, arena=True) for m in media},
                              probe=probe, on_done=lambda: r.filled.update(packed),
                              sample_first=r.last_counts is None or None in r.last_counts)

    def _copy_into(self, medium: str) -> None:
        self.retained.copy_into(medium, self._buffers(medium), self.device)
