"""The request log's first-audio hops and the Ingress's stream slot taken beside the plan."""

import asyncio
import json

from serve_app.callers import Slot
from serve_app.http import request_log
from serve_app.http.request_log import RequestRecord
from serve_app.pipeline.admission import release_when_taken as _release_when_taken
from serve_app.protocol import SpeechRequest


def test_the_log_line_carries_every_hop_in_ms(monkeypatch):
    rec = RequestRecord.start(SpeechRequest(input="你好"), "r1", client="http")
    rec.since_arrival(rec.t0 - 0.003)
    rec.hop("plan_call", 0.0071234)
    rec.first_audio.update({"first_chunk": 120.5})  # a stage's own, from the stream's summary
    lines = []
    monkeypatch.setattr(request_log.log, "info", lambda msg, *a: lines.append(msg % a if a else msg))
    rec.finish("200")
    line = json.loads(next(m for m in lines if '"event": "speech"' in m))
    assert line["first_audio"] == {"ingress_http": 3.0, "plan_call": 7.12, "first_chunk": 120.5}


def test_a_slot_taken_for_a_failed_request_is_given_back_once_held():
    async def run():
        released = []
        loop = asyncio.get_running_loop()
        held = loop.create_future()
        _release_when_taken(held)  # still being taken: given back when it comes
        held.set_result(Slot(lambda: released.append("late")))
        await asyncio.sleep(0)
        done = loop.create_future()
        done.set_result(Slot(lambda: released.append("now")))
        _release_when_taken(done)
        refused = loop.create_future()
        refused.set_exception(RuntimeError("too many streams"))
        _release_when_taken(refused)  # nothing held; its exception is retrieved, not logged
        cancelled = loop.create_future()
        _release_when_taken(cancelled)
        cancelled.cancel()
        await asyncio.sleep(0)
        return released

    assert asyncio.run(run()) == ["late", "now"]
