"""`tidebatch etl`: bounded, resumable scoring of files (files.py) or a topic range
(topic.py) into the sinks' Parquet layout (job.py; docs/ETL.md)."""
