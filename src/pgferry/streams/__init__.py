"""Durable streams: any number of readers follow a stream by name, from any offset, until it is closed.

A stream is any name events are published to (``ferry.publish``); nothing is
registered to read one. ``offsets`` says where an event sits in commit order
(the first tick that saw it committed, then its id), ``reader`` reads a
stream's history and follows it live for the Python API.
"""
