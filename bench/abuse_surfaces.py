"""The abuse bench's attackers of the newer surfaces over HTTP: lexicon aliases that multiply the
text, job submissions abandoned after a second, full lexicon listings (``python -m bench abuse``;
the Wyoming floods are in ``abuse_wyoming.py``).

Each is a coroutine ``(url, args, stop, tally)`` as in ``abuse_attackers.py``; those that need
something stored first (lexicons of the attacking key) have a set-up ``(url, args, tally)`` in
``SETUPS``, run once before the first phase, whose ids stay in ``tally.prepared``.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import time
from typing import Any, Awaitable, Callable

import httpx

from .lib.attack import ATTACKER_HEADERS, Tally, code_of, crowd

LEXICONS = "/v1/audio/lexicons"
ALIASED = "的"  # the most common character of Chinese text: said as a run of 12-digit numbers
UNSPEAKABLE = "了"  # said as punctuation only: nothing to speak, however much of it


def number_alias(chars: int) -> str:
    """12-digit numbers, space-separated, at most ``chars`` long (read out, each ~10x its
    characters: the longest reading one written character may have)."""
    words = (str(10**11 + 7919 * i) for i in itertools.count())
    out = next(words)
    for w in words:
        if len(out) + 1 + len(w) > chars:
            return out
        out += " " + w
    raise AssertionError("unreachable")


def alias_lexicon(alias_chars: int) -> dict[str, Any]:
    """The attacking key's default lexicon: ``的`` said as ``number_alias(alias_chars)``, ``了``
    as that many full stops."""
    return {
        "name": "bench alias expansion",
        "default": True,
        "entries": [
            {"text": ALIASED, "alias": number_alias(alias_chars)},
            {"text": UNSPEAKABLE, "alias": "。" * alias_chars},
        ],
    }


# 25 characters and their readings: 600 ordered pairs, each a two-character pinyin entry.
_PINYIN = (
    "银yin2 行hang2 中zhong1 国guo2 人ren2 大da4 小xiao3 天tian1 地di4 水shui3 火huo3 山shan1 木mu4 "
    "金jin1 土tu3 日ri4 月yue4 风feng1 云yun2 雨yu3 花hua1 草cao3 书shu1 车che1 马ma3"
).split()


def pinyin_lexicon(i: int, entries: int) -> dict[str, Any]:
    """The ``i``-th listed lexicon: ``entries`` distinct two-character pinyin entries (the
    costliest kind to validate), in an order of its own."""
    pairs = [(a, b) for a, b in itertools.permutations(_PINYIN, 2)]
    if entries > len(pairs):
        raise ValueError(f"at most {len(pairs)} entries")
    start = (i * 37) % len(pairs)
    chosen = (pairs[start:] + pairs[:start])[:entries]
    return {
        "name": f"bench listing {i}",
        "entries": [{"text": a[0] + b[0], "pinyin": f"{a[1:]} {b[1:]}"} for a, b in chosen],
    }


async def _create(client: httpx.AsyncClient, body: dict, tally: Tally, deadline_s: float = 60.0) -> str:
    """One lexicon of the attacking key, asked again while the service (or the guard) says wait."""
    t_end = time.monotonic() + deadline_s
    while True:
        t0 = time.perf_counter()
        r = await client.post(LEXICONS, json=body, headers=ATTACKER_HEADERS)
        tally.add(f"set-up create {code_of(r)}", time.perf_counter() - t0)
        if r.status_code == 200:
            return r.json()["id"]
        if r.status_code not in (429, 503) or time.monotonic() > t_end:
            raise RuntimeError(f"creating lexicon {body['name']!r}: {r.status_code} {r.text[:300]}")
        await asyncio.sleep(float(r.headers.get("retry-after", 1)))


async def own_lexicons(client: httpx.AsyncClient) -> list[dict]:
    r = await client.get(LEXICONS, headers=ATTACKER_HEADERS)
    r.raise_for_status()
    return r.json()["data"]


# ---------------------------------------------------------------------------------------- alias expansion


async def setup_alias_expansion(url: str, a: argparse.Namespace, tally: Tally) -> None:
    async with httpx.AsyncClient(base_url=url, timeout=60, trust_env=False) as client:
        tally.prepared["lexicon"] = await _create(client, alias_lexicon(a.alias_chars), tally)


async def alias_expansion(url: str, a: argparse.Namespace, stop: asyncio.Event, tally: Tally) -> None:
    """Speech of ``--alias-input-chars`` (4096) ``的`` through the aliasing lexicon, by default
    and named in turn (413 ``input_too_long`` expected, at once: the text is bounded as the
    lexicon grows it), and job submissions of ``--alias-job-chars`` ``的`` (charged by the
    expanded text) and of ``了`` (nothing to speak)."""
    lexicon = tally.prepared["lexicon"]
    speech_text = ALIASED * a.alias_input_chars

    async def attempt(client: httpx.AsyncClient, i: int, k: int) -> None:
        shape = ("speech default", "speech named", "speech default", "job numbers", "job unspeakable")[k % 5]
        t0 = time.perf_counter()
        try:
            if shape.startswith("speech"):
                body = {"input": speech_text, "response_format": "pcm", "seed": k}
                if shape == "speech named":
                    body["lexicon"] = lexicon
                async with client.stream("POST", "/v1/audio/speech", json=body, headers=ATTACKER_HEADERS) as r:
                    await r.aread()  # an answer of audio would be what is being tested: read whole
            else:
                char = ALIASED if shape == "job numbers" else UNSPEAKABLE
                body = {"input": char * a.alias_job_chars, "response_format": "pcm", "seed": k}
                r = await client.post("/v1/audio/jobs", json=body, headers=ATTACKER_HEADERS)
            tally.add(f"{shape} {code_of(r)}", time.perf_counter() - t0)
        except httpx.HTTPError as exc:
            tally.add(f"{shape} {exc.__class__.__name__}", time.perf_counter() - t0)

    await crowd(url, a.alias_expansion, stop, tally, attempt, 0.1)


# ---------------------------------------------------------------------------------------- abandoned submissions


def abandoned_text(chars: int) -> str:
    """``chars`` of 12-digit numbers (as ``dot_job_texts``' ``numbers``: the costliest to plan)."""
    return " ".join(str(10**11 + 7919 * i) for i in range(chars // 13 + 1))[:chars]


async def abandoned_submissions(url: str, a: argparse.Namespace, stop: asyncio.Event, tally: Tally) -> None:
    """Job submissions of ``--abandon-chars`` characters whose client hangs up ``--abandon-after-s``
    after sending (``hung up``, with the seconds to it), again and again; an answer before then is
    counted by its code (429 ``job_submission_in_progress`` while the key's abandoned one still
    holds its slot). The key's jobs are deleted when the phase ends."""
    text = abandoned_text(a.abandon_chars)
    timeout = httpx.Timeout(60.0, read=a.abandon_after_s)

    async def attempt(client: httpx.AsyncClient, i: int, k: int) -> None:
        body = {"input": text, "response_format": "pcm", "seed": i * 100000 + k}
        t0 = time.perf_counter()
        try:
            r = await client.post("/v1/audio/jobs", json=body, headers=ATTACKER_HEADERS, timeout=timeout)
            tally.add(code_of(r), time.perf_counter() - t0)
        except httpx.ReadTimeout:
            tally.add("hung up", time.perf_counter() - t0)  # the client closes its connection

    await crowd(url, a.abandoned_submissions, stop, tally, attempt, 0.05)


# ---------------------------------------------------------------------------------------- lexicon listing


async def setup_lexicon_listing(url: str, a: argparse.Namespace, tally: Tally) -> None:
    """``--listing-lexicons`` lexicons of ``--listing-entries`` pinyin entries for the attacking key
    (with the alias lexicon, the key's quota of 20)."""
    async with httpx.AsyncClient(base_url=url, timeout=60, trust_env=False) as client:
        tally.prepared["lexicons"] = [
            await _create(client, pinyin_lexicon(i, a.listing_entries), tally) for i in range(a.listing_lexicons)
        ]


async def lexicon_listing(url: str, a: argparse.Namespace, stop: asyncio.Event, tally: Tally) -> None:
    """Clients listing the attacking key's lexicons, then reading each one whole, in a loop."""

    async def attempt(client: httpx.AsyncClient, i: int, k: int) -> None:
        t0 = time.perf_counter()
        r = await client.get(LEXICONS, headers=ATTACKER_HEADERS)
        tally.add(f"list {code_of(r)}", time.perf_counter() - t0)
        ids = [x["id"] for x in r.json()["data"]] if r.status_code == 200 else []
        for lexicon_id in ids:
            if stop.is_set():
                return
            t0 = time.perf_counter()
            r = await client.get(f"{LEXICONS}/{lexicon_id}", headers=ATTACKER_HEADERS)
            tally.add(f"get {code_of(r)}", time.perf_counter() - t0)

    await crowd(url, a.lexicon_listing, stop, tally, attempt, 0.0)


async def delete_lexicons(url: str, tally: Tally) -> None:
    """Every lexicon of the attacking key deleted (a run against ``--url`` leaves none behind)."""
    async with httpx.AsyncClient(base_url=url, timeout=30, trust_env=False) as client:
        for lexicon in await own_lexicons(client):
            r = await client.delete(f"{LEXICONS}/{lexicon['id']}", headers=ATTACKER_HEADERS)
            tally.add(f"deleted at the end {r.status_code}")


Setup = Callable[[str, argparse.Namespace, Tally], Awaitable[None]]
SETUPS: dict[str, Setup] = {"alias-expansion": setup_alias_expansion, "lexicon-listing": setup_lexicon_listing}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--alias-chars", type=int, default=128, help="the alias of 的 (lexicons.max_alias_chars)")
    p.add_argument("--alias-input-chars", type=int, default=4096, help="speech of 的 (ingress.max_input_chars)")
    p.add_argument("--alias-job-chars", type=int, default=20_000, help="job texts of 的 and of 了")
    p.add_argument("--abandon-chars", type=int, default=200_000, help="each abandoned submission's text")
    p.add_argument("--abandon-after-s", type=float, default=1.0, help="an abandoned submission's client hangs up")
    p.add_argument("--listing-lexicons", type=int, default=19, help="lexicons made for the listing")
    p.add_argument("--listing-entries", type=int, default=500, help="pinyin entries of each (lexicons.max_entries)")
