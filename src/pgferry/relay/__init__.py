"""The relay process: leadership, the ticker, and (later) delivery consumers."""
