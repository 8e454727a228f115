"""Redis beside the Kafka pipeline: batched feature lookup, an online score store and
replay deduplication (docs/REDIS.md). Import the submodules; this package imports
nothing so that `pipeline.config` can read `redisio.config` without loading redis-py."""
