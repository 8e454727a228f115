"""The request codecs: the wire formats of the pipelines' requests, one per event
type (base.py has the contract; the schemas are in docs/schemas/). No I/O, no Kafka
objects: a Kafka value and headers in, a `Decoded` request out.
"""
