"""`ckptgw serve`: open the store, start the NFS server, the uploader, the admin API and the
metrics endpoint; handle signals; tell systemd.

Start order (each step needs the one before): embedded S3 (try-out mode only) -> store (crash
recovery) -> try-out re-upload check -> uploader -> NFS server -> admin API -> metrics ->
READY=1. Stop order is the reverse of what accepts work: NFS server (stop accepting, finish
in-flight requests) -> uploader (persist progress) -> store.close() (everything acknowledged
is durable) -> admin, metrics, embedded S3 -> exit 0.

SIGTERM/SIGINT stop; SIGHUP re-reads the config file. What happens to each changed option is
declared with the option (appliance.config.reload_policy): applied by one of RELOAD_APPLIERS
without dropping a client, or reported as needing a restart (its running value is kept).
"""
from __future__ import annotations

import asyncio
import errno
import gc
import os
import signal
import socket
import sys
import time
import zlib
from dataclasses import replace

import structlog

from cache.api import ROOT_INO, DataState, FileType, SetAttr, StoreError

from . import config as configmod
from . import logs, sdnotify, tree
from . import pair as pairmod
from . import version as versionmod
from .admin import AdminServer
from .commands import Commands
from .embedded_s3 import CREDENTIALS as EMBEDDED_CREDENTIALS, EmbeddedS3, TryoutUnavailable
from .metrics import MetricsServer, S3Stats, op_stats
from .units import fmt_bytes, fmt_rate

log = structlog.get_logger(__name__)



# sysexits.h EX_CONFIG, as appliance.cli.EX_CONFIG: a start a restart cannot fix (RestartPreventExitStatus=78)
EX_CONFIG = 78
RATE_SAMPLE_SECONDS = 1.0
RATE_WINDOW_SECONDS = 10.0
STATUS_EVERY_TICKS = 5            # systemd STATUS= every 5 samples


class RateMeter:
    """Bytes per second of a growing counter over the last RATE_WINDOW_SECONDS."""

    def __init__(self, window: float = RATE_WINDOW_SECONDS):
        self.window = window
        self._samples: list[tuple[float, int]] = []

    def sample(self, total: int, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        self._samples.append((now, total))
        while len(self._samples) > 2 and self._samples[1][0] <= now - self.window:
            self._samples.pop(0)

    def rate(self) -> float | None:
        if len(self._samples) < 2:
            return None
        (t0, b0), (t1, b1) = self._samples[0], self._samples[-1]
        return (b1 - b0) / (t1 - t0) if t1 > t0 else None


class StartupError(Exception):
    """The daemon cannot start; the message says why in one sentence. exit_code EX_CONFIG (78)
    marks a problem a restart cannot fix (the unit's RestartPreventExitStatus=78)."""

    def __init__(self, message: str, exit_code: int = 1):
        super().__init__(message)
        self.exit_code = exit_code


def export_id(path: str) -> int:
    """Stable export id (goes into file handles): the same path gives the same id on every start."""
    return zlib.crc32(path.encode()) % 0xFFFF + 1


def build_exports(cfg: configmod.Config, store):
    """nfsd.exports.Exports for the configured exports. One export serves the whole store; with
    several, each is the store directory of the same path (created if missing)."""
    from nfsd.exports import Export, Exports, IdMapper
    ids: dict[int, str] = {}
    out = []
    for e in cfg.exports:
        eid = export_id(e.path)
        if eid in ids:
            raise StartupError(f"exports {ids[eid]!r} and {e.path!r} hash to the same export id; rename one")
        ids[eid] = e.path
        root = ROOT_INO if len(cfg.exports) == 1 else _ensure_dir(store, e.path.strip("/"))
        _prepare_root(store, e, root)
        out.append(Export(eid, e.path, networks=tuple(e.networks), rw=e.access == "rw",
                          root_squash=e.squash in ("root", "all"), all_squash=e.squash == "all",
                          anonuid=e.anon_uid, anongid=e.anon_gid, secure=e.secure, root_ino=root))
    domain = cfg.server.owner_domain
    return Exports(out, idmap=IdMapper(domain, reply_names=True) if domain else None)


def _prepare_root(store, e: configmod.ExportSettings, ino: int) -> None:
    """Give the export's root directory its configured owner and mode; warn when nobody but a
    root that the export squashes could write there (a fresh cache's root is 0755 root:root)."""
    attr = store.getattr(ino)
    sa = SetAttr()
    if e.owner is not None and (attr.uid, attr.gid) != e.owner:
        sa.uid, sa.gid = e.owner
    if e.mode is not None and attr.mode & 0o7777 != e.mode:
        sa.mode = e.mode
    if sa.uid is not None or sa.mode is not None:
        attr = store.setattr(ino, sa)
        store.sync()
        log.info("export_root_set", export=e.path, uid=attr.uid, gid=attr.gid, mode=oct(attr.mode & 0o7777))
    if (e.access == "rw" and e.squash != "none" and attr.uid == 0 and not attr.mode & 0o002
            and not (attr.gid == e.anon_gid and attr.mode & 0o020)):
        log.warning("export_root_not_writable", export=e.path, uid=attr.uid, gid=attr.gid,
                    mode=oct(attr.mode & 0o7777), squash=e.squash,
                    detail="root is squashed and the directory is root's: set the export's owner or mode "
                           '(e.g. owner = "1000:1000", mode = "1777"), or squash = "none"')


def _ensure_dir(store, rel: str) -> int:
    ino = ROOT_INO
    for name in [p for p in rel.split("/") if p]:
        try:
            attr = store.lookup(ino, name.encode())
        except StoreError as e:
            if e.errno != errno.ENOENT:
                raise
            attr, _ = store.mkdir(ino, name.encode(), 0o755, 0, 0)
        if attr.type != FileType.DIR:
            raise StartupError(f"export directory {rel!r} exists in the cache but is not a directory")
        ino = attr.ino
    store.sync()
    return ino


class Daemon:
    def __init__(self, cfg: configmod.Config, overrides: dict | None = None):
        self.config = cfg
        self.overrides = overrides or {}
        self.ops = op_stats()
        self.s3stats = S3Stats()
        self.store = None
        self.uploader = None
        self.object_client = None
        self.nfs = None
        self.embedded: EmbeddedS3 | None = None
        self.admin: AdminServer | None = None
        self._admin_tokens: tuple = ()          # read at start (config.admin_tokens)
        self._admin_token_info: list = []       # their names, scopes and sources, for status
        self.metrics: MetricsServer | None = None
        self.commands = Commands(self)
        self.started = time.time()
        self.listen: tuple | None = None
        self.metrics_address: tuple | None = None
        self.s3_endpoint: str | None = None
        self._stop = asyncio.Event()
        self._tasks: list[asyncio.Task] = []
        self._reload_lock = asyncio.Lock()
        self.upload_rate = RateMeter()
        # one of an HA pair: DRBD's fence constraints in the CIB, read by cibadmin at most every few
        # seconds however often status and scrapes ask (appliance/pair.py)
        self._fences = pairmod.FenceReader()
        self._ready = False

    @property
    def s3_prefix(self) -> str:
        return self.config.s3.prefix

    # ---- start -------------------------------------------------------------------------
    async def start(self) -> None:
        cfg = self.config
        # a port already taken fails now, not after the store is opened (a recovery on a big
        # cache) and an embedded S3 started
        check_listen_addresses([("NFS", cfg.listen_address()), ("the admin API", cfg.admin.listen),
                                ("metrics", cfg.metrics.listen)])
        try:              # the admin secrets too: a missing file or variable is named before anything runs
            self._admin_tokens = cfg.admin_tokens()
            self._admin_token_info = cfg.admin_token_info()
        except (OSError, ValueError) as e:
            raise StartupError(f"cannot read the admin tokens: {e}") from None
        credentials = None
        if cfg.embedded_s3:
            self.embedded = EmbeddedS3(cfg.s3.bucket)
            try:
                self.s3_endpoint = await asyncio.to_thread(self.embedded.start)
            except TryoutUnavailable as e:
                raise StartupError(str(e), exit_code=EX_CONFIG) from None
            credentials = EMBEDDED_CREDENTIALS
        else:
            self.s3_endpoint = cfg.s3.endpoint
        s3_settings = cfg.s3_settings(endpoint=self.s3_endpoint, credentials=credentials)

        try:
            os.makedirs(cfg.server.cache_dir, exist_ok=True)
        except OSError as e:        # e.g. a relative or read-only path under ProtectSystem=strict
            raise StartupError(f"cannot create the cache directory {os.path.abspath(cfg.server.cache_dir)}: "
                               f"{_why(e)}") from None
        from cache.store import Store
        try:
            self.store = await asyncio.to_thread(
                Store.open, cfg.server.cache_dir, capacity=cfg.server.capacity, reserve=cfg.server.reserve,
                high_watermark=cfg.server.high_watermark, low_watermark=cfg.server.low_watermark,
                evict=not cfg.embedded_s3)
        except StoreError as e:
            # EINVAL: a store format this version does not know, a capacity the disk cannot give;
            # a restart cannot fix those (EBUSY, a store still open elsewhere, it may)
            raise StartupError(f"cannot open the cache in {cfg.server.cache_dir}: {e.strerror or _why(e)}",
                               exit_code=EX_CONFIG if e.errno == errno.EINVAL else 1) from None
        log.info("store_open", cache_dir=os.path.abspath(cfg.server.cache_dir),
                 capacity=cfg.server.capacity or "auto")

        from uploader.objectclient import Boto3ObjectClient
        self.object_client = Boto3ObjectClient(s3_settings)
        self.object_client.observer = self.s3stats      # every S3 request: latency, failures by code
        if self.embedded is not None:
            await asyncio.to_thread(self._reupload_missing)
        await self._start_uploader()
        await self._start_nfs()
        await self._start_admin()
        self._start_metrics()
        # eviction to the watermarks is the uploader's evictor (store.maybe_evict, a no-op when the
        # store was opened with evict=False, as in try-out mode)
        self._tasks.append(asyncio.create_task(self._heartbeat(), name="heartbeat"))
        if self.embedded is None:
            self._tasks.append(asyncio.create_task(self._probe_s3(), name="s3-probe"))
        if self.uploader is not None:
            self._tasks.append(asyncio.create_task(self._retention_forever(), name="retention"))
        # start-up's objects (modules, boto3's service model: about 90k) leave the collector's
        # view: a full collection walked them all, a 50 ms stall of every client's requests
        gc.collect()
        gc.freeze()
        self._ready = True
        sdnotify.ready(f"serving NFS on {self.listen[0]}:{self.listen[1]}" if self.listen else "serving")
        log.info("ready", listen=_addr(self.listen), admin_socket=self.admin.socket_path if self.admin else None,
                 metrics=_addr(self.metrics_address), s3_endpoint=self.s3_endpoint, bucket=cfg.s3.bucket,
                 exports=[e.path for e in cfg.exports], tryout=cfg.embedded_s3, pid=os.getpid())

    def _reupload_missing(self) -> None:
        """Try-out mode: the in-memory S3 is new and empty at every start; what the cache holds
        as uploaded must go up again, and nothing may stay marked clean against no object."""
        store = self.store
        try:
            present = {o.key[len(self.s3_prefix):] for o in self.object_client.list_objects(self.s3_prefix)} \
                if self.object_client else set()
        except Exception as e:        # noqa: BLE001 - a fresh moto should answer; say so if not
            log.error("tryout_listing_failed", error=str(e))
            return
        requeued = lost = 0
        for path, attr in tree.files(store, ""):
            if attr.data_state not in (DataState.CLEAN, DataState.ABSENT):
                continue
            key = store.remote_info(attr.ino).key
            if key and key in present:
                continue
            if attr.data_state == DataState.ABSENT:
                lost += 1
                log.error("tryout_object_lost", path=path, key=key,
                          detail="the file was evicted and its object is gone with the previous in-memory S3")
                continue
            store.set_data_state(attr.ino, DataState.DIRTY)
            requeued += 1
        store.sync()
        if requeued or lost:
            log.warning("tryout_reupload", files=requeued, lost=lost)

    async def _start_uploader(self) -> None:
        from uploader.service import Uploader
        self.uploader = Uploader(self.store, self.object_client, self.config.upload_settings(),
                                 prefix=self.s3_prefix, series=self.config.retention.series)
        await self.uploader.start()         # it logs uploader_started

    async def _start_nfs(self) -> None:
        from nfsd.server import NfsServer
        exports = await asyncio.to_thread(build_exports, self.config, self.store)
        server = NfsServer(self.store, exports, lease_time=self.config.server.lease_time,
                           grace_time=self.config.server.grace_time)
        server.observer = self.ops          # called as observer(op, status, seconds, nbytes)
        if self.uploader is not None:       # read-through: nfsd/ops/io.py asks for ABSENT ranges
            server.fetch_missing = self.uploader.fetch_missing
            server.note_read = self.uploader.note_read
            # the drain yields to clients saving or reading (uploader/foreground.py)
            self.uploader.foreground.last_client_op = lambda: server.last_client_op
        host, port = self.config.listen_address()
        try:
            await server.start(host, port)
        except OSError as e:
            raise StartupError(f"cannot listen for NFS on {host}:{port}: {_why(e)}") from None
        self.nfs = server
        self.listen = tuple(server.address[:2])     # the server logs nfsd_listening

    async def _start_admin(self) -> None:
        cfg = self.config
        self.admin = AdminServer(self.commands.dispatch, cfg.admin_socket_path(), mode=cfg.admin.socket_mode,
                                 group=cfg.admin.group, tcp=cfg.admin.listen, tokens=self._admin_tokens)
        try:
            await self.admin.start()
        except OSError as e:
            raise StartupError(f"cannot create the admin socket {cfg.admin_socket_path()}: "
                               f"{_why(e)}") from None

    def _start_metrics(self) -> None:
        if not self.config.metrics.listen:
            return
        self.metrics = MetricsServer(self.config.metrics.listen, self.status, self.ops, self.s3stats)
        try:
            self.metrics_address = self.metrics.start()
        except OSError as e:
            raise StartupError(f"cannot listen for metrics on {_addr(self.config.metrics.listen)}: "
                               f"{_why(e)}") from None
        log.info("metrics_listening", listen=_addr(self.metrics_address))

    async def _retention_forever(self) -> None:
        """Finish deletes a crash interrupted; then, with retention.schedule set, apply the
        retention plan by itself that often (the setting is re-read after a reload)."""
        try:
            from uploader import retention
        except ImportError:
            return
        try:
            resumed = await asyncio.to_thread(retention.resume, self.store)
            if resumed:
                log.info("retention_resumed", deletes=len(resumed))
        except Exception:             # noqa: BLE001 - the next apply tries again
            log.exception("retention_resume_failed")
        last = time.monotonic()
        while True:
            every = self.config.retention.schedule
            await asyncio.sleep(min(every, 60.0) if every else 60.0)
            every = self.config.retention.schedule
            if not every or not self.config.retention.series or time.monotonic() - last < every:
                continue
            last = time.monotonic()
            try:
                res = await self.commands._rules_module("retention", "apply", {})
                log.info("retention_scheduled_apply", actions=len(res["actions"]), skipped=len(res["skipped"]),
                         queued_jobs=res["queued_jobs"])
            except asyncio.CancelledError:
                raise
            except Exception:         # noqa: BLE001 - keep the schedule alive; the next round retries
                log.exception("retention_scheduled_apply_failed")

    async def _probe_s3(self) -> None:
        """One listing request at start, so a wrong endpoint, bucket or credential shows up in the
        log at once. Never fatal: writes are cached while S3 is away and go up when it is back."""
        def probe():
            next(iter(self.object_client.list_objects(self.s3_prefix)), None)
        try:
            await asyncio.to_thread(probe)
            log.info("s3_reachable", endpoint=self.s3_endpoint, bucket=self.config.s3.bucket)
        except Exception as e:        # noqa: BLE001 - reported, not fatal
            log.warning("s3_unreachable", endpoint=self.s3_endpoint, bucket=self.config.s3.bucket,
                        error=f"{type(e).__name__}: {e}",
                        detail="writes are cached and uploaded once S3 answers")

    async def _heartbeat(self) -> None:
        """Sample the upload rate; under systemd, keep `systemctl status` showing the gist and
        ping the watchdog (WatchdogSec= in the unit; every tick, well inside half of it)."""
        tick = 0
        while True:
            sdnotify.watchdog()
            self.upload_rate.sample(self.uploader.counters.bytes_uploaded)
            if tick % STATUS_EVERY_TICKS == 0 and os.environ.get("NOTIFY_SOCKET"):
                sdnotify.status(self.status_line())
            tick += 1
            await asyncio.sleep(RATE_SAMPLE_SECONDS)

    def status_line(self) -> str:
        """"3 clients, 1.2 GiB dirty, 4 queued, uploading 180.0 MiB/s" (systemd STATUS=)."""
        clients = len(self.nfs.sessions.clients) if self.nfs is not None else 0
        usage = self.store.usage()
        up = self.uploader.status() if self.uploader is not None else {}
        rate = self.upload_rate.rate()
        return (f"{'TRY-OUT, ' if self.config.embedded_s3 else ''}{clients} client(s), "
                f"{fmt_bytes(usage.get('dirty', 0))} dirty, {up.get('queue_depth', 0)} queued"
                + (f", uploading {fmt_rate(rate)}" if rate else ""))

    # ---- run / stop ------------------------------------------------------------------------
    def install_signals(self) -> None:
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, self.request_stop, "SIGTERM")
        loop.add_signal_handler(signal.SIGINT, self.request_stop, "SIGINT")
        loop.add_signal_handler(signal.SIGHUP, self._on_sighup)

    def _on_sighup(self) -> None:
        if not self._ready:
            log.warning("reload_ignored", reason="still starting; send SIGHUP again once ready")
            return
        asyncio.ensure_future(self._reload_logged())

    async def _reload_logged(self) -> None:
        from .admin import AdminError
        try:
            await self.reload()
        except AdminError:
            pass                    # already logged as reload_failed

    def request_stop(self, why: str = "") -> None:
        if not self._stop.is_set():
            log.info("stopping", signal=why)
            sdnotify.stopping()
            self._stop.set()

    async def wait(self) -> None:
        await self._stop.wait()

    async def stop(self) -> None:
        """Stop accepting, finish in-flight requests, make everything durable."""
        timeout = self.config.server.shutdown_timeout
        sdnotify.stopping()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self.nfs is not None:
            await self._step("nfs_stop", self.nfs.stop(drain_seconds=timeout), timeout + 5)
        if self.uploader is not None:
            # a third of the time for the uploads in flight to end and be recorded, not PUT again
            await self._step("uploader_stop", self.uploader.stop(grace=timeout / 3), timeout)
        if self.admin is not None:
            await self._step("admin_stop", self.admin.stop(), 5)
        if self.metrics is not None:
            await self._step("metrics_stop", asyncio.to_thread(self.metrics.stop), 5)
        if self.store is not None:
            # no time limit: what was acknowledged must reach the disk; systemd's TimeoutStopSec is
            # the last word, and recovery at the next start covers even that
            await self._step("store_close", asyncio.to_thread(self.store.close), None)
        if self.embedded is not None:
            await self._step("embedded_s3_stop", asyncio.to_thread(self.embedded.stop), 5)
        log.info("stopped")

    async def _step(self, name: str, awaitable, timeout: float | None) -> None:
        try:
            await asyncio.wait_for(awaitable, timeout)
        except asyncio.TimeoutError:
            log.error("shutdown_step_timeout", step=name, timeout=timeout)
        except Exception:             # noqa: BLE001 - go on closing the rest, the store above all
            log.exception("shutdown_step_failed", step=name)

    # ---- reload ---------------------------------------------------------------------------------
    async def reload(self) -> dict:
        """Re-read the config file; apply exports, retention rules and the log level."""
        async with self._reload_lock:
            sdnotify.reloading()
            try:
                return await self._reload()
            finally:
                sdnotify.ready("serving")

    async def _reload(self) -> dict:
        from .admin import AdminError
        old = self.config
        try:
            new = configmod.load(old.source, self.overrides)
        except configmod.ConfigError as e:
            log.error("reload_failed", error=str(e), detail="keeping the running configuration")
            raise AdminError("bad_request", f"reload refused, configuration unchanged: {e}") from None
        applied, need_restart, effects = [], [], set()
        for key, key_effects in configmod.reload_policy().items():
            if configmod.option_value(old, key) == configmod.option_value(new, key):
                continue
            if "restart" in key_effects:
                need_restart.append(key)
            else:
                applied.append(key)
                effects.update(key_effects)
        new = _keep(new, old, need_restart)       # restart-only settings keep their running values
        for effect in RELOAD_ORDER:
            if effect in effects:
                try:
                    await RELOAD_APPLIERS[effect](self, new)
                except (StoreError, StartupError) as e:
                    log.error("reload_failed", error=str(e), step=effect, detail="keeping the running configuration")
                    raise AdminError("failed", f"reload failed applying {effect}: {e}") from None
        self.config = new
        log.info("reloaded", applied=applied, needs_restart=need_restart)
        return {"applied": applied, "needs_restart": need_restart}

    # ---- reload appliers: one per configmod.RELOAD_EFFECTS entry (but "restart") -------------
    async def _apply_config(self, new: configmod.Config) -> None:
        """Read from self.config where used (retention rules, shutdown_timeout): the swap does it."""

    async def _apply_log(self, new: configmod.Config) -> None:
        logs.configure(new.log.format, new.log.level)

    async def _apply_exports(self, new: configmod.Config) -> None:
        if self.nfs is None:
            return
        exports = await asyncio.to_thread(build_exports, new, self.store)
        setter = getattr(self.nfs, "set_exports", None)
        if setter:
            setter(exports)
        else:
            self.nfs.exports = exports

    async def _apply_watermarks(self, new: configmod.Config) -> None:
        if self.store is not None:
            self.store.set_watermarks(new.server.high_watermark, new.server.low_watermark)

    async def _apply_eviction(self, new: configmod.Config) -> None:
        if self.uploader is not None:       # read at each round of the uploader's evictor
            self.uploader.settings = replace(self.uploader.settings, evict_interval=new.server.evict_interval)

    # ---- status -----------------------------------------------------------------------------------
    def status(self) -> dict:
        """A snapshot for `ckptgw status` and the metrics collector. Callable from any thread."""
        cfg = self.config
        out = {"version": versionmod.version(), "store_format": versionmod.STORE_FORMAT, "pid": os.getpid(), "uptime_s": round(time.time() - self.started, 3),
               "tryout": cfg.embedded_s3, "listen": _addr(self.listen), "metrics": _addr(self.metrics_address),
               "admin_socket": self.admin.socket_path if self.admin else None,
               "admin_tcp": _addr(self.admin.tcp_address) if self.admin else None,
               # the TCP tokens in effect (read at start): names and scopes, never the secrets
               "admin_tokens": [dict(t) for t in self._admin_token_info],
               "s3": {"endpoint": self.s3_endpoint, "bucket": cfg.s3.bucket, "prefix": cfg.s3.prefix},
               "exports": [e.path for e in cfg.exports]}
        sessions = getattr(self.nfs, "sessions", None)
        ops = self.ops.snapshot()
        out["nfs"] = {"running": self.nfs is not None,
                      "clients": len(sessions.clients) if sessions is not None else 0,
                      "ops_total": sum(ops["counts"].values()),
                      "errors_total": sum(n for (op, st), n in ops["counts"].items() if st != "NFS4_OK"),
                      "bytes_read": ops["bytes_read"], "bytes_written": ops["bytes_written"],
                      "owner_domain": self._live_owner_domain()}
        out["cache"] = self._cache_status()
        out["upload"] = self._upload_status()
        if cfg.pair.drbd_device:            # one of an HA pair: is the peer there and in sync?
            out["pair"] = pairmod.read_pair(cfg.pair.drbd_device, fences=self._fences).as_dict()
        return out

    def _live_owner_domain(self) -> str | None:
        """The id-mapping domain the NFS server uses now (not merely what the config says)."""
        idmap = getattr(getattr(self.nfs, "exports", None), "idmap", None)
        return getattr(idmap, "domain", None)

    def _cache_status(self) -> dict:
        cache = {"dir": os.path.abspath(self.config.server.cache_dir), "evicts": not self.config.embedded_s3}
        if self.uploader is not None:       # the evictor's live period (a reload changes it)
            cache["evict_interval_s"] = self.uploader.settings.evict_interval
        if self.store is None:
            return cache
        usage = self.store.usage()          # capacity, used (local bytes), dirty
        used, dirty = usage.get("used", 0), usage.get("dirty", 0)
        cache.update(capacity=usage.get("capacity"), used=used, dirty_bytes=dirty,
                     high_watermark=usage.get("high"), low_watermark=usage.get("low"),
                     bytes_by_state={"dirty": dirty, "clean": max(used - dirty, 0)})
        return cache

    def _upload_status(self) -> dict:
        """The uploader's status under its own names (uploader/service.py: one name a value, the
        unit spelled out: oldest_dirty_age_seconds, bytes_uploaded, permanent_errors), with the
        daemon's measured upload rate and the last error as a list."""
        if self.uploader is None:
            return {"running": False}
        up = {"running": True, **self.uploader.status(), "rate_bytes_per_s": self.upload_rate.rate()}
        last = up.get("last_error") or up.get("permanent_error")
        if last:
            up["last_errors"] = [last]
        return up


def check_listen_addresses(listeners: list[tuple[str, tuple | None]]) -> None:
    """Bind every (what, (host, port)) the daemon will listen on, as the listeners will
    (SO_REUSEADDR, IPv6 only on IPv6), all at once so two of them on one port are caught too,
    then let go; StartupError naming the first that cannot be had. Port 0 (any) and None (off)
    are skipped. The listeners bind for real later: this is the early, clear refusal."""
    held, ports = [], {}
    try:
        for what, address in listeners:
            if not address or not address[1]:
                continue
            host, port = address
            ours = ports.setdefault(port, what)
            try:
                infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
            except socket.gaierror as e:
                raise StartupError(f"cannot listen for {what} on {host}:{port}: {e.strerror}") from None
            for family, kind, proto, _, sockaddr in dict.fromkeys(infos):
                sock = socket.socket(family, kind, proto)
                held.append(sock)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                if family == socket.AF_INET6:
                    sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
                try:
                    sock.bind(sockaddr)
                    sock.listen(1)
                except OSError as e:
                    taken = "" if e.errno != errno.EADDRINUSE else \
                        f" ({ours} is configured on port {port} too)" if ours != what else \
                        " (another process listens there: ss -ltnp shows which)"
                    raise StartupError(f"cannot listen for {what} on {host}:{port}: {_why(e)}{taken}") from None
    finally:
        for sock in held:
            sock.close()


def _why(e: OSError) -> str:
    """The plain reason ("Address already in use"), not asyncio's wrapped sentence."""
    return os.strerror(e.errno) if e.errno else str(e)


def _addr(a) -> str | None:
    return f"{a[0]}:{a[1]}" if a else None


# effect -> how the daemon applies it; the ones that can fail (and leave nothing half-done)
# run first, the log last so the reload's own line is in the new format
RELOAD_APPLIERS = {"watermarks": Daemon._apply_watermarks, "eviction": Daemon._apply_eviction,
                   "exports": Daemon._apply_exports, "config": Daemon._apply_config, "log": Daemon._apply_log}
RELOAD_ORDER = tuple(RELOAD_APPLIERS)


def _keep(new: configmod.Config, old: configmod.Config, keys: list[str]) -> configmod.Config:
    """The new config, but with the running values of settings that need a restart."""
    for key in keys:
        section, _, field = key.partition(".")
        if field:
            new = replace(new, **{section: replace(getattr(new, section), **{field: getattr(getattr(old, section), field)})})
        else:
            new = replace(new, **{section: getattr(old, section)})
    return new


async def serve(cfg: configmod.Config, overrides: dict | None = None) -> int:
    """Run until SIGTERM/SIGINT; returns the process exit code."""
    daemon = Daemon(cfg, overrides)
    daemon.install_signals()
    try:
        await daemon.start()
    except StartupError as e:
        log.error("startup_failed", error=str(e))
        sys.stderr.write(f"ckptgw: {e}\n")
        await daemon.stop()
        return e.exit_code
    except BaseException:
        log.exception("startup_failed")
        await daemon.stop()
        raise
    await daemon.wait()
    await daemon.stop()
    return 0
