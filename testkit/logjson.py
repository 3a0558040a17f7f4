"""The structured records in a JSON-lines log (the gateway's `[log] format = json`, what a
pipe or the journal gets): one parser for every test that reads them."""
from __future__ import annotations

import json


def json_lines(text: str) -> list[dict]:
    """The JSON objects among `text`'s lines, in order; other lines (a banner, a traceback,
    a line cut short by a kill) are skipped."""
    out = []
    for line in text.splitlines():
        if line.startswith("{"):
            try:
                out.append(json.loads(line))
            except ValueError:
                pass
    return out
