-- pgferry 0033: a backfill remembers the shape of the key its last chunk
-- ended at (each column with its type, in the key's order), not only its
-- values; and a resume may change its chunk size.
--
-- last_key is a JSON object, which keeps neither the order of its columns
-- nor their types, and ferry.backfill_chunk compared only the names of the
-- key's columns with the table's. A primary key re-made in another column
-- order, or whose column changed type (int to text), passed the check; the
-- chunks went on comparing the stored values in the new order or type, and
-- the backfill ended as done with rows never read (outside probe: 7,425 of
-- 10,000 after (a, b) became (b, a); 10,001 of 20,000 after int became
-- text). A backfill now fails as soon as the key's columns, their order or
-- their types differ from those of its last chunk; one recorded before
-- this migration (NULL here) keeps the old check.
--
-- ferry.backfill_chunk's file has the check (sql/functions/ferry.backfill_chunk.sql).

alter table ferry.backfills add column last_key_columns text[];

comment on column ferry.backfills.last_key_columns is
    'pgferry: the primary key last_key was taken in: each column as "name type", in the key''s order (NULL before 0033).';

-- ferry.backfill_resume takes the chunk size of the chunks to come, last and
-- defaulted (sql/functions/ferry.backfill_resume.sql): docs/backfills.md told
-- an operator whose chunks statement_timeout cancelled to lower the chunk
-- size, which only a new backfill could (outside probe). The signature
-- without it goes.
drop function if exists ferry.backfill_resume(bigint);
