"""`pgferry backfill` as a real process: killed with SIGKILL mid-way and resumed, targeted at one
subscription through a real relay and receivers, cancelled, listed, and refusing bad input."""

from __future__ import annotations

import asyncio
import json
import re
import signal
from collections import Counter

import asyncpg
import pytest

import pgferry
from tests.helpers import MakeReceiver, RunningRelay, cli, cli_in_terminal, eventually, pgferry_env, tick


async def test_a_backfill_killed_with_sigkill_resumes_at_its_last_chunk_with_no_row_missing_or_repeated(
    ferry: pgferry.Ferry, conn: asyncpg.Connection, db_url: str, pgferry_cmd: list[str]
) -> None:
    await conn.execute("create table t (id bigint primary key, v text)")
    await conn.execute("insert into t select g, md5(g::text) from generate_series(1, 60000) g")
    await conn.execute("analyze t")
    await conn.execute("select ferry.capture_table('t')")
    await ferry.register_consumer("c")
    proc = await asyncio.create_subprocess_exec(
        *pgferry_cmd, "backfill", "public.t", "--chunk", "300", "--quiet",
        env=pgferry_env(db_url), stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    try:

        async def some_chunks_done() -> bool:
            return bool(await conn.fetchval("select rows_done >= 3000 from ferry.backfills"))

        await eventually(some_chunks_done, timeout=60, what="the backfill to be under way")
        proc.send_signal(signal.SIGKILL)
    finally:
        await asyncio.wait_for(proc.wait(), 10)
    row = await conn.fetchrow("select id, state, rows_done from ferry.backfills")
    assert row["state"] == "running" and 0 < row["rows_done"] < 60000

    resumed = await cli(pgferry_cmd, db_url, "backfill", "--resume", str(row["id"]), "--quiet")
    assert resumed.returncode == 0, resumed.stderr
    assert f"backfill {row['id']} of public.t: done, 60,000 rows" in resumed.stdout

    await tick(conn)
    reads: Counter[str | None] = Counter()
    async for batch in ferry.read("c", poll_interval=0.05):
        reads.update(e.key for e in batch.events if e.payload["type"] == "READ")
        await batch.ack()
        if reads.total() >= 60000:
            break
    assert set(reads) == {str(i) for i in range(1, 60001)}
    assert max(reads.values()) == 1, "a READ was written twice"
    assert await conn.fetchval("select count(*) from ferry.events where op = 'R'") == 60000


async def test_the_progress_bar_on_a_terminal_shows_rows_done_the_rate_and_the_time_left(
    conn: asyncpg.Connection, db_url: str, pgferry_cmd: list[str]
) -> None:
    """The real command on a pseudo-terminal 120 columns wide, paced to about 2 s so that the bar is
    redrawn mid-way: each redraw is one line of the screen."""
    await conn.execute("create table t (id int primary key)")
    await conn.execute("insert into t select generate_series(1, 3000)")
    await conn.execute("analyze t")
    await conn.execute("select ferry.capture_table('t')")
    status, lines = await cli_in_terminal(
        pgferry_cmd, db_url, "backfill", "public.t", "--chunk", "100", "--max-rate", "1500", columns=120
    )
    assert status == 0, lines
    bar = re.compile(
        r"backfill \d+ of public\.t\s+\S+\s+(\d+)% ([\d,]+) / ~3,000 rows ([\d,]+|\?) rows/s (\d:\d\d:\d\d|-:--:--)$"
    )
    frames = [m.groups() for line in lines if (m := bar.search(line))]
    assert all(len(line) <= 120 for line in lines), lines
    midway = [f for f in frames if 0 < int(f[1].replace(",", "")) < 3000 and f[2] != "?" and f[3] != "-:--:--"]
    assert midway, lines
    percent, done, rate, left = midway[len(midway) // 2]  # its rate averages the chunks so far
    assert int(percent) == round(int(done.replace(",", "")) * 100 / 3000)
    assert 100 <= int(rate.replace(",", "")) <= 2500, "paced at 1,500 rows/s on average"
    assert left.startswith("0:00:") and left != "0:00:00", "a few seconds left"
    assert frames[-1][:2] == ("100", "3,000") and frames[-1][3] == "0:00:00"
    assert re.search(r"backfill \d+ of public\.t: done, 3,000 rows \([\d,]+ rows/s\)", lines[-1]), lines


async def test_a_backfill_for_one_subscription_reaches_only_its_receiver_and_trace_says_why(
    conn: asyncpg.Connection, db_url: str, pgferry_cmd: list[str], receiver_factory: MakeReceiver
) -> None:
    await conn.execute("create table t (id int primary key, v text)")
    await conn.execute("insert into t select g, 'v' from generate_series(1, 50) g")
    await conn.execute("select ferry.capture_table('t')")
    mine, mine_url = await receiver_factory()
    other, other_url = await receiver_factory()
    await conn.execute("select ferry.subscribe('mine', array['public.t'], $1)", mine_url)
    await conn.execute("select ferry.subscribe('other', array['public.t'], $1)", other_url)
    relay = RunningRelay(db_url)
    try:
        done = await cli(pgferry_cmd, db_url, "backfill", "public.t", "--subscription", "mine", "--chunk", "20")
        assert done.returncode == 0, done.stderr
        # Not a terminal: no bar (it came out cut at 80 columns), a line every 10 s (none in this one).
        assert "━" not in done.stdout and "…" not in done.stdout, done.stdout
        await conn.execute("insert into t values (51, 'live')")

        async def delivered() -> bool:
            return len(mine.received) >= 51 and len(other.received) >= 1

        await eventually(delivered, timeout=30, what="the backfill and the live row to arrive")
        await asyncio.sleep(0.5)  # anything still on its way to the other receiver would arrive now
    finally:
        await relay.stop()
    mine_events = sorted((json.loads(r.body) for r in mine.received), key=lambda e: e["record"]["id"])
    assert [(e["record"]["id"], e["type"]) for e in mine_events] == [(i, "READ") for i in range(1, 51)] + [
        (51, "INSERT")
    ]
    assert [json.loads(r.body)["type"] for r in other.received] == ["INSERT"]

    first_read = await conn.fetchval("select min(id) from ferry.events where op = 'R'")
    traced = await cli(pgferry_cmd, db_url, "trace", str(first_read), "--json")
    states = {s["name"]: s["state"] for s in json.loads(traced.stdout)["subscriptions"]}
    assert states == {"mine": "delivered", "other": "not for this subscription (a backfill for webhook:mine)"}


async def _backfilling(
    conn: asyncpg.Connection, pgferry_cmd: list[str], db_url: str, *, rows: int, max_rate: int
) -> asyncio.subprocess.Process:
    """A captured table t of ``rows`` rows, and `pgferry backfill public.t` running on it: 100 rows
    a chunk, at most ``max_rate`` a second (slow enough to signal it mid-way), output piped."""
    await conn.execute("create table t (id int primary key)")
    await conn.execute(f"insert into t select generate_series(1, {rows})")
    await conn.execute("select ferry.capture_table('t')")
    return await asyncio.create_subprocess_exec(
        *pgferry_cmd, "backfill", "public.t", "--chunk", "100", "--max-rate", str(max_rate), "--quiet",
        env=pgferry_env(db_url), stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip


async def test_a_backfill_paused_by_sigterm_exits_3_so_a_script_knows_it_did_not_finish(
    conn: asyncpg.Connection, db_url: str, pgferry_cmd: list[str]
) -> None:
    proc = await _backfilling(conn, pgferry_cmd, db_url, rows=2000, max_rate=400)
    try:
        await eventually(lambda: _rows_done_over(conn, 99), timeout=30, what="the backfill to be under way")
        proc.send_signal(signal.SIGTERM)
        out, _ = await asyncio.wait_for(proc.communicate(), 30)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode == 3 and "paused after" in out.decode(), out.decode()
    assert await conn.fetchval("select state from ferry.backfills") == "paused"


async def test_a_detached_backfill_resumed_with_a_chunk_size_runs_chunks_of_that_size(
    conn: asyncpg.Connection, db_url: str, pgferry_cmd: list[str]
) -> None:
    """The docs' advice when statement_timeout cancels every chunk: `--resume ID --chunk N`."""
    await conn.execute("create table t (id int primary key)")
    await conn.execute("insert into t select generate_series(1, 20)")
    await conn.execute("select ferry.capture_table('t')")
    started = await cli(pgferry_cmd, db_url, "backfill", "public.t", "--detach", "--json")
    backfill = json.loads(started.stdout)["id"]
    resumed = await cli(pgferry_cmd, db_url, "backfill", "--resume", str(backfill), "--chunk", "7", "--json")
    assert resumed.returncode == 0, resumed.stderr
    done = json.loads(resumed.stdout)
    assert (done["state"], done["rows_done"], done["chunk_size"]) == ("done", 20, 7), done
    assert await conn.fetchval("select chunks_done from ferry.backfills where id = $1", backfill) == 3


async def test_cancel_stops_a_detached_backfill_and_list_shows_it(
    conn: asyncpg.Connection, db_url: str, pgferry_cmd: list[str]
) -> None:
    await conn.execute("create table t (id int primary key)")
    await conn.execute("insert into t select generate_series(1, 10)")
    await conn.execute("select ferry.capture_table('t')")
    started = await cli(pgferry_cmd, db_url, "backfill", "public.t", "--detach", "--json")
    assert started.returncode == 0, started.stderr
    backfill = json.loads(started.stdout)
    assert (backfill["state"], backfill["rows_done"], backfill["target"]) == ("running", 0, None)
    cancelled = await cli(pgferry_cmd, db_url, "backfill", "--cancel", str(backfill["id"]))
    assert cancelled.returncode == 0, cancelled.stderr
    assert f"backfill {backfill['id']} of public.t: cancelled after 0 rows" in cancelled.stdout
    listed = await cli(pgferry_cmd, db_url, "backfill", "--list")
    assert "cancelled" in listed.stdout and "public.t" in listed.stdout
    again = await cli(pgferry_cmd, db_url, "backfill", "--resume", str(backfill["id"]))
    assert again.returncode == 1
    assert "cannot be made running" in again.stderr and "Traceback" not in again.stderr
    assert await conn.fetchval("select count(*) from ferry.events") == 0


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["public.nope"], 'Error: relation "public.nope" does not exist'),
        (["MixedCase.t"], 'Error: schema "mixedcase" does not exist'),
        (["public.Order Items"], "Error: 'public.Order Items' is not a table name (invalid name syntax)"),
        (["a.b.c.d"], "Error: 'a.b.c.d' is not a table name (improper relation name"),
        (["public.plain"], "Error: table plain is not captured"),
        (["public.t", "--where", "nonsense ="], "Error: condition 'nonsense =' is not a valid boolean expression"),
        (["public.t", "--chunk", "0"], "Invalid value for '--chunk': 0 is not in the range 1<=x<=1000000"),
        (["--resume", "99999999999999999999"], "Invalid value for '--resume'"),
        (["public.t", "--subscription", "ghost"], "Error: subscription 'ghost' does not exist"),
        (["public.t", "--list"], "Error: give one of TABLE, --list"),
        (["--cancel", "99"], "Error: backfill 99 does not exist"),
        (["public.t", "--detach", "--max-rate", "100"], "Error: --max-rate paces the chunks this process runs"),
        (["--list", "--chunk", "5"], "Error: --chunk goes with TABLE or --resume ID"),
    ],
)
async def test_bad_input_gets_one_clear_line_and_starts_nothing(
    conn: asyncpg.Connection, db_url: str, pgferry_cmd: list[str], args: list[str], says: str
) -> None:
    await conn.execute("create table t (id int primary key); create table plain (id int primary key)")
    await conn.execute("select ferry.capture_table('t')")
    result = await cli(pgferry_cmd, db_url, "backfill", *args)
    assert result.returncode != 0
    assert says in result.stderr and "Traceback" not in result.stderr, result.stderr
    assert "HINT:" not in result.stderr, result.stderr  # a hint on the error's line, once (it came twice)
    assert await conn.fetchval("select count(*) from ferry.backfills") == 0


async def test_a_chunk_that_takes_long_is_stopped_by_a_second_signal_and_another_shell_is_told_why_it_waits(
    conn: asyncpg.Connection, db_url: str, pgferry_cmd: list[str]
) -> None:
    """Both signals, and --pause from another shell, waited silently for a chunk blocked by a lock (outside
    probe). A chunk gives up on a lock after a second now; one held up by a slow condition stands in."""
    env = pgferry_env(db_url)
    pipe = asyncio.subprocess.PIPE
    await conn.execute("create table hold_flag (on_ boolean)")
    await conn.execute(
        "create function public.hold() returns boolean language plpgsql volatile as $$ begin "
        "while exists (select 1 from public.hold_flag) loop perform pg_sleep(0.05); end loop; return true; end $$"
    )
    await conn.execute("create table t (id int primary key)")
    await conn.execute("insert into t select generate_series(1, 3000)")
    await conn.execute("select ferry.capture_table('t')")
    proc = await asyncio.create_subprocess_exec(
        *pgferry_cmd, "backfill", "public.t", "--chunk", "100", "--max-rate", "500", "--quiet",
        "--where", "public.hold()", env=env, stdout=pipe, stderr=pipe,
    )  # fmt: skip
    pausing: asyncio.subprocess.Process | None = None
    try:
        await eventually(lambda: _rows_done_over(conn, 200), timeout=30, what="the backfill to be under way")
        await conn.execute("insert into hold_flag values (true)")

        async def chunk_waits() -> bool:
            return bool(await conn.fetchval(
                "select count(*) from pg_stat_activity where wait_event = 'PgSleep' and query like '%backfill_chunk%'"
            ))  # fmt: skip

        await eventually(chunk_waits, timeout=10, what="the next chunk to be held up")
        backfill = await conn.fetchval("select id from ferry.backfills")
        pausing = await asyncio.create_subprocess_exec(*pgferry_cmd, "backfill", "--pause", str(backfill), env=env,
                                                       stdout=pipe, stderr=pipe)  # fmt: skip
        assert pausing.stderr is not None
        said = await asyncio.wait_for(pausing.stderr.readline(), 15)  # after 5 s of waiting, and it waits on
        assert b"a chunk in progress holds it" in said and b"waiting for that chunk to end" in said, said
        proc.send_signal(signal.SIGINT)  # pause after the chunk
        await asyncio.sleep(0.3)
        proc.send_signal(signal.SIGINT)  # stop the chunk
        try:  # a third while it stops (a third Ctrl-C was a CancelledError traceback): told it is stopping
            proc.send_signal(signal.SIGTERM)
            third = True
        except ProcessLookupError:  # already gone
            third = False
        _, stderr = await asyncio.wait_for(proc.communicate(), 10)
        assert proc.returncode == 3 and b"Traceback" not in stderr, stderr  # stopped before the end
        assert b"pausing after the chunk in progress (again to stop it now)" in stderr, stderr
        assert b"stopping the chunk in progress" in stderr, stderr
        assert not third or b"still stopping" in stderr, stderr
        paused_out, _ = await asyncio.wait_for(pausing.communicate(), 10)  # the chunk let go: it went on
        assert pausing.returncode == 0 and b"paused" in paused_out, paused_out
        await conn.execute("delete from hold_flag")
        assert await conn.fetchval("select state from ferry.backfills") == "paused"
    finally:
        for p in (proc, pausing):
            if p is not None and p.returncode is None:
                p.kill()
                await p.wait()
        await conn.execute("delete from hold_flag")


async def _rows_done_over(conn: asyncpg.Connection, rows: int) -> bool:
    return bool(await conn.fetchval("select coalesce(max(rows_done), 0) > $1 from ferry.backfills", rows))


async def test_a_backfill_paced_slower_than_the_databases_idle_session_timeout_goes_on(
    conn: asyncpg.Connection, db_url: str, pgferry_cmd: list[str]
) -> None:
    """Idle between chunks (--max-rate, the pauses before a chunk is tried again), the runner's
    session was ended by idle_session_timeout (outside probe). The URL's setting stands in for the
    database's."""
    await conn.execute("create table t (id int primary key)")
    await conn.execute("insert into t select generate_series(1, 3)")
    await conn.execute("select ferry.capture_table('t')")
    url = db_url + ("&" if "?" in db_url else "?") + "idle_session_timeout=300"
    done = await cli(pgferry_cmd, url, "backfill", "public.t", "--chunk", "1", "--max-rate", "2", "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["rows_done"] == 3
