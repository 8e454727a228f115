"""`tidebatch dlq`: read a dead-letter topic (inspect) and send its requests again
after a fix (replay). docs/OPERATIONS.md, "Dead letters: inspect and replay"."""
