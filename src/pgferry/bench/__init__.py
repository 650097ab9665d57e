"""Benchmarks: `pgferry bench ...` measures pgferry against the alternatives it replaces.

Everything runs against one PostgreSQL server (a throwaway durable one unless
``--database-url`` is given), inside a scratch database that is dropped after.
"""
