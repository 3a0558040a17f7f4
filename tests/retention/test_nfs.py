"""Checkpoints saved over NFS (our server, the test client): a file a client holds open keeps
its checkpoint incomplete; once closed and uploaded, the rules apply to it like to any other."""
import time

from tests.retention.rhelp import (DAY, PREFIX, Rule, Settings, ckpt, drain, exists, make_uploader,
                                   objects, run, set_age)
from testkit.storefiles import mkdirs
from uploader import retention

RULE = Rule(keep_last=1, expire_after=2 * DAY)


def test_checkpoints_written_over_nfs(moto, bucket, store):
    from nfsd.exports import Exports
    from nfsd.server import NfsServer
    from testkit.nfsclient import NfsClient
    now = time.time()

    async def main():
        up = make_uploader(store, moto.endpoint, bucket)
        await up.start()
        server = NfsServer(store, Exports.single("/checkpoints", root_squash=False, secure=False))
        await server.start("127.0.0.1", 0)
        c = await NfsClient.connect("127.0.0.1", server.address[1])
        try:
            await c.setup_session()
            held = None
            for step in (100, 200, 300):
                mkdirs(store, ckpt(step))                     # directories: the client would MKDIR
                d = await c.lookup_path("/checkpoints/" + ckpt(step))
                fh, sid = await c.open_create(d, "model.pt")
                await c.write(fh, sid, 0, bytes([step % 251]) * 4096)
                await c.commit(fh)
                if step == 100:
                    held = (fh, sid)                          # the oldest stays open
                else:
                    await c.close_file(fh, sid)
            assert await up.flush(ckpt(200), timeout=60) and await up.flush(ckpt(300), timeout=60)
            for step in (100, 200, 300):
                set_age(store, ckpt(step), (400 - step) / 100 * 3 * DAY, now)
            kw = dict(store=store, rules=[RULE], object_client=up.client, now=now, settings=Settings())
            first = await retention.plan(**kw)
            await c.close_file(*held)                          # the save finishes
            assert await up.flush(ckpt(100), timeout=60)
            set_age(store, ckpt(100), 9 * DAY, now)
            result = await retention.apply(**kw, uploader=up)
            await drain(up)
            return first, result, objects(up.client)
        finally:
            await c.close()
            await server.stop(drain_seconds=1)
            await up.stop()

    first, result, keys = run(main())
    verdict = {v["checkpoint"]: v for v in first["checkpoints"]}
    assert verdict[ckpt(100)]["reasons"] == ["incomplete: 1 file(s) open"]
    assert [a["checkpoint"] for a in first["actions"] if a["action"] == "delete"] == [ckpt(200)]
    assert sorted(a["checkpoint"] for a in result["actions"] if a["action"] == "delete") == [ckpt(100), ckpt(200)]
    assert not exists(store, ckpt(100)) and not exists(store, ckpt(200)) and exists(store, ckpt(300))
    assert {k for k in keys if k.endswith(".pt")} == {f"{PREFIX}{ckpt(300)}/model.pt"}
