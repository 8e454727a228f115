"""The Faust path (optional `[faust]` extra; examples/faust_ctr): batching.py drives
the worker's Batcher inside a Faust agent (a pure core and an asyncio driver),
inference.py scores its batches with the worker's scoring step, app.py sets a Faust
app up for a broker profile. Import the modules; this package imports nothing, so
that `pipeline.faust.batching`'s pure core loads without Faust installed."""
