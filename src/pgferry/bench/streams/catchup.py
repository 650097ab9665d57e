"""3. Catch-up: one reader from the start of a long closed stream, over SSE and over long-poll."""

from __future__ import annotations

import asyncio
import contextlib
import time

import asyncpg
import click

from pgferry.bench.report import ms, num, table
from pgferry.bench.sqlfiles import query
from pgferry.bench.streams.common import (
    CATCHUP_GOAL,
    Bench,
    StreamsSettings,
    api_relay,
    clients,
    connect,
    progress,
    q,
)

# -- 3. catch-up ------------------------------------------------------------------------------------------

#: Events per transaction (and tick) while loading the catch-up's history.
LOAD_CHUNK = 10_000


async def load_history(url: str, stream: str, events: int) -> float:
    """``events`` events of ``stream`` in transactions of LOAD_CHUNK, a tick after each (a tick bounds
    how much one read may have to take at once), then the stream closed; returns events/s loaded.
    Then VACUUM ANALYZE and a CHECKPOINT, as old history would have had."""
    started = time.monotonic()
    async with connect(url) as conn:
        for first in range(0, events, LOAD_CHUNK):
            await conn.fetchval(q("load_chunk"), stream, min(LOAD_CHUNK, events - first), first)
            await conn.fetchval(q("force_tick"))
        await conn.fetchval(q("close_streams"), [stream])
        await conn.fetchval(q("force_tick"))
        rate = events / (time.monotonic() - started)
        # Catching up reads old history: leave no vacuum or checkpoint of the load to compete with it.
        await conn.execute(q("vacuum_events"))
        with contextlib.suppress(asyncpg.InsufficientPrivilegeError):
            await conn.execute(query("checkpoint"))
    return rate


async def run_catchup(bench: Bench, settings: StreamsSettings) -> None:
    m = settings.catchup_events
    stream = "catchup"
    progress(f"[catchup] loading {m:,} events (publish_many, {LOAD_CHUNK:,} per transaction) ...")
    load_rate = await load_history(bench.url, stream, m)
    rows = []
    for mode, label in (("catchup", "SSE"), ("poll", f"long-poll JSON, limit={settings.poll_limit}")):
        progress(f"[catchup] reading it over {label} ...")
        async with api_relay(bench.url, 900) as relay:
            await asyncio.sleep(settings.settle)  # the relay's first housekeeping catalogues the loaded streams
            bench.relay_pid = relay.pid
            cpu = bench.cpu_window()
            async with clients(relay.base, mode, stream, limit=settings.poll_limit) as reading:
                result = await reading.result(timeout=900)
            used = cpu()  # the client process has ended: its CPU is in "writer", its reaped children's
            bench.relay_pid = None
        seconds = float(result["last_event_at"]) - float(result["started"])
        first = result["first_event_at"]
        rows.append(
            {
                "how": label,
                "events": int(result["events"]),
                "duplicates": int(result["duplicates"]),
                "seconds": seconds,
                "rate": int(result["events"]) / seconds if seconds > 0 else 0.0,
                "first_ms": (float(first) - float(result["started"])) * 1000 if first else float("nan"),
                "requests": result.get("requests", 1),
                "relay_cpu": used.get("relay", 0.0),
                "clients_cpu": used.get("writer", 0.0),
                "postgres_cpu": used.get("postgres", 0.0),
            }
        )
        progress(f"[catchup]   {rows[-1]['events']:,} events in {seconds:.2f} s: {rows[-1]['rate']:,.0f} events/s")
    click.echo(
        f"\n3. Catch-up: one reader from the start of a closed {m:,}-event stream (loaded with ferry.publish_many, "
        f"{LOAD_CHUNK:,} events per transaction, a tick after each: {load_rate:,.0f} events/s), a fresh relay each"
    )
    headers = [
        "read over",
        "events",
        "dupes",
        "seconds",
        "events/s",
        "first event ms",
        "requests",
        "CPU relay",
        "clients",
        "postgres",
    ]
    click.echo(
        table(
            headers,
            [
                [
                    r["how"],
                    num(r["events"]),
                    num(r["duplicates"]),
                    f"{r['seconds']:.2f}",
                    num(r["rate"]),
                    ms(r["first_ms"]),
                    num(r["requests"]),
                    f"{100 * r['relay_cpu'] / r['seconds']:.0f}%",
                    f"{100 * r['clients_cpu'] / r['seconds']:.0f}%",
                    f"{100 * r['postgres_cpu'] / r['seconds']:.0f}%",
                ]
                for r in rows
            ],
        )
    )
    click.echo(
        "   seconds: from the request to the last event (SSE: the end event follows it); the SSE client counts "
        "frames and checks offsets ascend without decoding payloads, the long-poll client decodes each JSON "
        "answer; CPU: over those seconds, 100% = one core"
    )
    bench.results["catchup"] = {"load_rate": load_rate, "reads": rows}
    sse = rows[0]
    bench.target(
        "catchup",
        f"SSE catch-up on {m:,} events",
        f">= {CATCHUP_GOAL:,.0f} events/s, all of them",
        f"{sse['rate']:,.0f} events/s, {sse['events']:,} events, {sse['duplicates']} dupes",
        sse["rate"] >= CATCHUP_GOAL and sse["events"] == m and sse["duplicates"] == 0,
    )
    poll = rows[1]
    bench.target(
        "catchup",
        f"long-poll catch-up (limit {settings.poll_limit})",
        "all events (rate reported)",
        f"{poll['rate']:,.0f} events/s, {poll['events']:,} events",
        poll["events"] == m and poll["duplicates"] == 0,
    )
