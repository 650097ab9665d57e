"""The embedded demo behind `pgferry run` with no database URL.

It captures a small table, writes a few rows and published events, prints
them as a stream reader receives them, and delivers the table's changes as
signed webhooks to a demo receiver that fails now and then, so a new user
sees the whole path (capture -> log -> tick -> reader / webhook with
retries) working in one command.
"""

from __future__ import annotations

import asyncio
import itertools
import logging

import click
import orjson

import pgferry
from pgferry import db
from pgferry.aio import wait_for_event
from pgferry.delivery.signing import new_secret
from pgferry.receiver import Action, Received, Receiver, Respond

log = logging.getLogger(__name__)

SETUP_SQL = """
create table if not exists public.demo_orders (
    id bigserial primary key,
    item text not null,
    quantity int not null
);
select ferry.capture_table('public.demo_orders');
"""


async def _writer(url: str, stop: asyncio.Event, interval: float) -> None:
    conn = await db.connect(url)
    try:
        await conn.execute(SETUP_SQL)
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
            await conn.execute("select ferry.publish('demo.greetings', $1, $2)", {"hello": n}, str(n))
            await wait_for_event(stop, interval)
    finally:
        await conn.close()


async def _reader(url: str, stop: asyncio.Event) -> None:
    async with pgferry.connect(url) as ferry:
        reader = ferry.read("demo", streams=["public.demo_orders", "demo.greetings"], start_at="beginning")
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


async def run_demo(url: str, stop: asyncio.Event, interval: float = 2.0) -> None:
    receiver = _demo_receiver()
    hook_url = await receiver.start()
    async with pgferry.connect(url) as ferry:
        await ferry.subscribe(
            "demo-hook", ["public.demo_orders"], hook_url, secret=new_secret(), retry_base_ms=500, retry_max_ms=2000
        )
    click.echo(
        "demo: capturing public.demo_orders and publishing to demo.greetings every "
        f"{interval:g} s; a stream reader prints what it reads, and the table's changes go as "
        f"signed webhooks to a demo receiver at {hook_url}. Ctrl-C stops."
    )
    reader = asyncio.create_task(_reader(url, stop))
    try:
        await _writer(url, stop, interval)
    finally:
        await asyncio.sleep(0.5)  # let the reader print the last batch
        reader.cancel()
        await asyncio.gather(reader, return_exceptions=True)
        await receiver.stop()
