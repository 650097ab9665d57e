"""A statement's attempts go to ferry.webhook_steps in runs (delivery.steps.attempt_runs, migration 0032)."""

import asyncio
import itertools

import asyncpg
from hypothesis import given
from hypothesis import strategies as st

from pgferry.delivery.steps import Step, attempt_runs
from tests.helpers import webhook_steps

#: (event id, attempt number, status, latency ms): few distinct values, so that runs form
ATTEMPT = st.tuples(st.integers(1, 10**12), st.integers(1, 3), st.sampled_from([200, 500, None]),
                    st.sampled_from([1.5, 20.0, None]))  # fmt: skip
ACKS = st.lists(st.none() | st.lists(ATTEMPT, max_size=30), max_size=6)


def _steps(acks: list[list[tuple[int, int, int | None, float | None]] | None]) -> list[Step]:
    loop = asyncio.new_event_loop()
    try:
        acked = [None if a is None else (1, 2, a, None) for a in acks]
        return [Step("s", "c", None, False, ack, False, None, result=loop.create_future()) for ack in acked]
    finally:
        loop.close()


@given(ACKS)
def test_runs_give_back_every_attempt_in_order_and_are_as_few_as_can_be(
    acks: list[list[tuple[int, int, int | None, float | None]] | None],
) -> None:
    runs = attempt_runs(_steps(acks))
    expanded = [
        (req, number, status, latency)
        for req, number, status, latency, n in zip(
            runs.reqs, runs.numbers, runs.statuses, runs.latencies, runs.runs, strict=True
        )
        for _ in range(n)
    ]
    wanted = [(i, a[1], a[2], a[3]) for i, ack in enumerate(acks, 1) if ack for a in ack]
    assert expanded == wanted
    assert runs.event_ids == [a[0] for ack in acks if ack for a in ack]
    shared = list(zip(runs.reqs, runs.numbers, runs.statuses, runs.latencies, strict=True))
    assert all(x != y for x, y in itertools.pairwise(shared)), "neighbouring runs differ"
    assert all(n > 0 for n in runs.runs)


async def test_webhook_steps_records_runs_as_it_records_one_attempt_per_event(conn: asyncpg.Connection) -> None:
    """The same attempts, passed per event (a relay of 0031) and in runs, make the same rows."""
    recorded = []
    for name, runs in (("per_event", False), ("in_runs", True)):
        await conn.execute(f"select ferry.register_consumer('{name}', null, 'beginning')")
        cursor = await conn.fetchval("select tick_id from ferry.consumers where name = $1", name)
        attempts: list[tuple[int, int, int | None, float | None]] = [
            (11, 1, 200, 5.0), (12, 1, 200, 5.0), (13, 1, 500, 7.5), (14, 2, 200, 9.0), (15, 2, 200, 9.0)
        ]  # fmt: skip
        if runs:
            r = attempt_runs(_steps([attempts]))
            args = [r.reqs, r.event_ids, r.numbers, r.statuses, r.latencies, r.runs]
            assert r.runs == [2, 1, 2]
        else:
            args = [[1] * 5, [a[0] for a in attempts], [a[1] for a in attempts], [a[2] for a in attempts],
                    [a[3] for a in attempts], None]  # fmt: skip
        attempts_args = dict(zip(("attempt_req", "event_ids", "attempt_nos", "statuses", "latencies", "attempt_runs"),
                                 args, strict=True))  # fmt: skip
        await webhook_steps(conn, [name], [name], ack_from=[cursor], ack_to=[cursor], peeks=[False], **attempts_args)
        rows = await conn.fetch(
            "select events, event_ids, latencies_ms, attempt, status from ferry.deliveries"
            " where subscription = $1 order by attempt, status",
            name,
        )
        recorded.append([tuple(r) for r in rows])
    assert recorded[0] == recorded[1]
    assert [r[1] for r in recorded[1]] == [[11, 12], [13], [14, 15]]
