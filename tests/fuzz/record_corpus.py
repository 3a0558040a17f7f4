"""Record real client traffic for the byte-level fuzzer (run once; the capture is committed).

    python -m tests.fuzz.record_corpus [OUTDIR]

Starts `python -m nfsd` on loopback, puts a TCP proxy in front of it and runs an nfs-rs
client (an independent NFSv4.1 client) through a checkpoint-like workload: mount, mkdir,
create, write, read, stat, chmod, rename, readdir, symlink, link, truncate, remove. The
client-to-server byte stream of each connection is written to OUTDIR/nfsrs-N.bin (a
sequence of RPC records, record marks included), the server's replies to
OUTDIR/nfsrs-N.replies (the fuzzer maps the ids, file handles and stateids they gave out
to the ones a fresh server gives, so a replayed session gets past SEQUENCE and PUTFH).
"""
from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from testkit.loopback import free_port, wait_listening

CORPUS = Path(__file__).parent / "corpus"


class RecordingProxy:
    """127.0.0.1:port -> upstream; keeps what each client connection sent."""

    def __init__(self, upstream_port: int):
        self.upstream_port = upstream_port
        self.streams: list[tuple[bytearray, bytearray]] = []
        self.loop = asyncio.new_event_loop()
        self.port = 0
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)

    async def _pipe(self, reader, writer, keep: bytearray):
        try:
            while data := await reader.read(65536):
                keep += data
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            writer.close()

    async def _handle(self, creader, cwriter):
        sreader, swriter = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        sent, got = bytearray(), bytearray()
        self.streams.append((sent, got))
        await asyncio.gather(self._pipe(creader, swriter, sent), self._pipe(sreader, cwriter, got))

    def start(self) -> "RecordingProxy":
        self._thread.start()

        async def boot():
            srv = await asyncio.start_server(self._handle, "127.0.0.1", 0)
            self.port = srv.sockets[0].getsockname()[1]
        asyncio.run_coroutine_threadsafe(boot(), self.loop).result(10)
        return self


def workload(port: int) -> None:
    import nfs_rs
    c = nfs_rs.Client.connect(f"nfs://127.0.0.1:{port}/checkpoints?version=4.1&noresvport=true")
    c.mkdir("run")
    c.mkdir("run/step-1")
    with c.open("run/step-1/model.bin", "wb") as f:
        f.write(bytes(range(256)) * 64)
        f.write(b"tail")
    with c.open("run/step-1/model.bin", "rb") as f:
        f.read()
    c.stat("run/step-1/model.bin")
    c.chmod("run/step-1/model.bin", 0o600)
    c.rename("run/step-1/model.bin", "run/step-1/model.pt")
    c.listdir("run/step-1")
    c.symlink("step-1", "run/latest")
    c.readlink("run/latest")
    c.link("run/step-1/model.pt", "run/step-1/hard")
    c.truncate("run/step-1/hard", 100)
    c.unlink("run/step-1/hard")
    c.exists("run/nothing")
    c.unlink("run/step-1/model.pt")
    c.unlink("run/latest")
    c.rmdir("run/step-1")
    c.close()


def main(outdir: Path = CORPUS) -> None:
    outdir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    with tempfile.TemporaryDirectory() as tmp:
        proc = subprocess.Popen([sys.executable, "-m", "nfsd", "--listen", f"127.0.0.1:{port}",
                                 "--cache-dir", os.path.join(tmp, "cache"), "--log-level", "warning"])
        try:
            wait_listening(port, proc)
            proxy = RecordingProxy(port).start()
            workload(proxy.port)
            time.sleep(0.5)
        finally:
            proc.terminate()
            proc.wait(30)
    for i, (sent, got) in enumerate(s for s in proxy.streams if s[0]):
        (outdir / f"nfsrs-{i}.bin").write_bytes(bytes(sent))
        (outdir / f"nfsrs-{i}.replies").write_bytes(bytes(got))
        print(f"nfsrs-{i}.bin: {len(sent)} bytes, replies {len(got)} bytes")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else CORPUS)
