"""The Faust path (optional `[faust]` extra; examples/faust_ctr): batching.py is the
entry point (`adaptive_batches`) that drives the worker's Batcher inside a Faust agent
(a pure core in core.py and acks.py, the asyncio driver in driver.py, what it yields in
batch.py), inference.py scores its batches with the worker's scoring step, app.py sets
a Faust app up for a broker profile. Import the modules; this package imports nothing,
so that the pure core (`pipeline.faust.core`) loads without Faust installed."""
