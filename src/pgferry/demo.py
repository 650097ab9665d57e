"""The embedded demo behind `pgferry run` with no database URL.

It captures a small table, backfills the 100,000 orders it held before
capture as READ events for one consumer (with the progress bar of `pgferry
backfill`), writes a few rows and published events, prints
them as a stream reader receives them, and delivers the table's changes as
signed webhooks to a demo receiver that fails now and then, so a new user
sees the whole path (capture -> log -> tick -> reader / webhook with
retries) working in one command. A second table, of payments, is captured
from the write-ahead log instead of by trigger (when the server runs with
wal_level = logical), and its events reach the same reader. It also writes "answers" word by word to
durable streams, one stream per answer, closed at its end, and serves a page
that shows them live in a browser through the relay's streams API.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Callable
from importlib import resources

import click
import orjson
from aiohttp import web

import pgferry
from pgferry import db
from pgferry.aio import wait_for_event
from pgferry.capture import backfill as backfills
from pgferry.delivery.signing import new_secret
from pgferry.ops.backfill import drive
from pgferry.receiver import Action, Received, Receiver, Respond

#: The demo page's own server: its origin is what the streams API lets call it (CORS).
PAGE_HOST = "127.0.0.1"
QUESTIONS = {
    "What does pgferry do?": "It carries events out of PostgreSQL: captured in the writing transaction, kept in "
    "a commit-ordered log, delivered to webhooks and to readers like this page.",
    "What is a durable stream?": "A named, append-only channel written inside your transaction. Any number of "
    "readers follow it from any offset, live, until it is closed, and nothing is registered to read it.",
    "What if the relay restarts?": "The browser reconnects with the last offset it saw and carries on: no gap, "
    "no duplicate.",
}

log = logging.getLogger(__name__)

#: Orders the table held before capture began: a backfill turns them into READ events.
EXISTING_ORDERS = 100_000

SETUP_SQL = """
create table if not exists public.demo_orders (
    id bigserial primary key,
    item text not null,
    quantity int not null
);
create table if not exists public.demo_payments (
    order_id bigint primary key,
    amount numeric not null
);
"""

#: $1 rows, only into a table that is still empty (a demo run against an existing database adds none).
SEED_SQL = """
insert into public.demo_orders (item, quantity)
select (array['spice', 'water', 'stillsuit', 'thumper'])[1 + g % 4], 1 + g % 9 from generate_series(1, $1) g
where not exists (select 1 from public.demo_orders)
"""


async def _writer(url: str, stop: asyncio.Event, interval: float) -> None:
    conn = await db.connect(url)
    try:
        items = itertools.cycle(["spice", "water", "stillsuit", "thumper"])
        for n in itertools.count(1):
            if stop.is_set():
                return
            item = next(items)
            async with conn.transaction():
                row_id = await conn.fetchval(
                    "insert into public.demo_orders (item, quantity) values ($1, $2) returning id", item, n
                )
                await conn.execute("update public.demo_orders set quantity = quantity + 1 where id = $1", row_id)
            # Its own transaction: a transaction's WAL-captured events reach the log after its trigger ones.
            await conn.execute("insert into public.demo_payments values ($1, $2)", row_id, n * 1.5)
            await conn.execute("select ferry.publish('demo.greetings', $1, $2)", {"hello": n}, str(n))
            await wait_for_event(stop, interval)
    finally:
        await conn.close()


async def _reader(url: str, stop: asyncio.Event) -> None:
    async with pgferry.connect(url) as ferry:
        streams = ["public.demo_orders", "public.demo_payments", "demo.greetings"]
        reader = ferry.read("demo", streams=streams, start_at="beginning")
        async for batch in reader:
            for event in batch:
                click.echo(
                    f"  read event {event.id:>4} stream={event.stream:<20} key={event.key!s:<4} "
                    f"payload={click.style(orjson.dumps(event.payload).decode()[:110], fg='cyan')}"
                )
            await batch.ack()
            if stop.is_set():
                return


def _demo_receiver() -> Receiver:
    calls = itertools.count(1)

    def behaviour(request: Received) -> Action:
        n = next(calls)
        msg = request.headers.get("webhook-id", "?")
        if n % 4 == 0:
            click.echo(click.style(f"  webhook {msg:<8} answered 500 (demo failure: pgferry will retry)", fg="yellow"))
            return Respond(500, b"demo failure")
        body = request.body.decode(errors="replace")[:90]
        click.echo(click.style(f"  webhook {msg:<8} received: {body}", fg="green"))
        return Respond()

    return Receiver(behaviour)


async def _answers(url: str, stop: asyncio.Event, word_interval: float = 0.15, pause: float = 4.0) -> None:
    """Write an answer word by word to a stream of its own, announced on demo.answers, then close it."""
    async with pgferry.connect(url) as ferry:
        numbers = itertools.count(1)
        while True:
            for question, answer in QUESTIONS.items():
                stream = f"demo.answer:{next(numbers)}"
                await ferry.publish("demo.answers", {"stream": stream, "question": question})
                for word in answer.split():
                    await ferry.publish(stream, {"word": word})
                    if await wait_for_event(stop, word_interval):
                        return
                await ferry.close_stream(stream)
                if await wait_for_event(stop, pause):
                    return


async def _serve_page(port: int, api_url: Callable[[], str | None], stop: asyncio.Event) -> None:
    """Serve the page that follows the answers, once the relay's API is listening."""
    while api_url() is None and not stop.is_set():
        await wait_for_event(stop, 0.05)
    api = api_url()
    if api is None:
        return
    page = (resources.files("pgferry") / "demo_answers.html").read_text().replace("__API__", api)

    async def show(_: web.Request) -> web.Response:
        return web.Response(text=page, content_type="text/html")

    app = web.Application()
    app.router.add_get("/", show)
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    try:
        await web.TCPSite(runner, PAGE_HOST, port).start()
        click.echo(
            click.style(f"demo: open http://{PAGE_HOST}:{port}/ to watch the answers stream in", bold=True)
            + f"; or: curl -N {api}/v1/streams/demo.answers"
        )
        await stop.wait()
    finally:
        await runner.cleanup()


async def _backfill_existing_orders(ferry: pgferry.Ferry, stop: asyncio.Event) -> None:
    """The orders placed before capture began, as READ events for one consumer (an archive nobody
    reads in the demo), with the progress bar `pgferry backfill` shows: the live subscription and
    reader are not sent them (a targeted backfill)."""
    async with ferry.pool.acquire() as conn:
        await conn.execute(SETUP_SQL)
        await conn.execute(SEED_SQL, EXISTING_ORDERS)
        await conn.execute("analyze public.demo_orders")  # the estimate the progress bar shows
        await conn.execute("select ferry.capture_table('public.demo_orders')")
        await ferry.register_consumer("demo-archive", streams=["public.demo_orders"])
        backfill = await backfills.start(conn, "public.demo_orders", consumer="demo-archive")
    try:  # needs wal_level = logical (the throwaway server has it) and the REPLICATION attribute
        await ferry.capture_table("public.demo_payments", method="wal")
        click.echo("demo: public.demo_payments is captured from the write-ahead log: no trigger, the relay decodes it")
    except pgferry.PgferryError as exc:
        click.echo(f"demo: not capturing public.demo_payments from the write-ahead log: {exc}")
    click.echo("demo: the table's existing orders, backfilled as READ events for the consumer demo-archive:")
    done = await drive(ferry, backfill, show=True, max_rate=None, stop=stop)
    click.echo(f"demo: backfill {backfill}: {done.state}, {done.rows_done:,} rows")


async def run_demo(
    url: str, stop: asyncio.Event, interval: float = 2.0, *, page_port: int | None = None,
    api_url: Callable[[], str | None] = lambda: None,
) -> None:  # fmt: skip
    """The demo; with ``page_port``, also the answers page, for the relay's API at ``api_url()``."""
    receiver = _demo_receiver()
    hook_url = await receiver.start()
    async with pgferry.connect(url) as ferry:
        await _backfill_existing_orders(ferry, stop)
        await ferry.subscribe(
            "demo-hook", ["public.demo_orders"], hook_url, secret=new_secret(), retry_base_ms=500, retry_max_ms=2000
        )
    click.echo(
        "demo: capturing public.demo_orders and publishing to demo.greetings every "
        f"{interval:g} s; a stream reader prints what it reads, and the table's changes go as "
        f"signed webhooks to a demo receiver at {hook_url}. Ctrl-C stops."
    )
    others = [asyncio.create_task(_reader(url, stop)), asyncio.create_task(_answers(url, stop))]
    if page_port is not None:
        others.append(asyncio.create_task(_serve_page(page_port, api_url, stop)))
    try:
        await _writer(url, stop, interval)
    finally:
        await asyncio.sleep(0.5)  # let the reader print the last batch
        for task in others:
            task.cancel()
        await asyncio.gather(*others, return_exceptions=True)
        await receiver.stop()
